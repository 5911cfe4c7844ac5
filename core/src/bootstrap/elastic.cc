#include "bootstrap/elastic.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "common/logging.h"

namespace hvd {

namespace {

constexpr auto kPollEvery = std::chrono::milliseconds(20);

struct Line {
  std::string id;
  std::string host;
};

Status ParseWorld(const std::string& world, int64_t generation, std::vector<Line>* out) {
  std::istringstream in(world);
  std::string text;
  while (std::getline(in, text)) {
    if (text.empty()) continue;
    std::istringstream words(text);
    Line l;
    std::string extra;
    if (!(words >> l.id >> l.host) || (words >> extra)) {
      return Status::InvalidArgument("world " + std::to_string(generation) +
                                     " in the rendezvous store has a malformed line '" + text +
                                     "' (expected '<worker id> <host>')");
    }
    out->push_back(std::move(l));
  }
  if (out->empty()) {
    return Status::InvalidArgument("world " + std::to_string(generation) + " is empty");
  }
  return Status::OK();
}

StatusOr<int64_t> ParseGeneration(const std::string& text) {
  char* end = nullptr;
  long long g = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || g < 1) {
    return Status::InvalidArgument("the rendezvous store's " + std::string(kElasticLatestKey) +
                                   " is '" + text + "', not a generation number");
  }
  return static_cast<int64_t>(g);
}

// Step 1: polls until a generation newer than `after` is published.
StatusOr<int64_t> WaitNewer(StoreClient& store, int64_t after, Deadline deadline,
                            bool trained) {
  auto none = [after](const std::string& more) {
    return Status::Timeout(
        "no new world from hvdrun within HVD_ELASTIC_TIMEOUT (the last one this worker ran "
        "was generation " + std::to_string(after) + "); fewer workers than --min-np may be "
        "left, or hvdrun stopped forming worlds" + more);
  };
  while (true) {
    auto g = LatestGeneration(store, deadline);
    // A lookup cut short by the deadline (a slow store) is the same end of the wait.
    if (!g.ok() && g.status().code() == StatusCode::kTimeout && Clock::now() >= deadline) {
      return none(" (the last look: " + g.status().message() + ")");
    }
    if (!g.ok() || *g > after) return g;
    std::string finished;
    StatusOr<bool> over = false;
    if (trained) over = store.TryGet(kElasticFinishedKey, &finished, deadline);
    if (over.ok() && *over) {
      // (A peer that ends its loop early: its allreduces fail the others', who leave.)
      return Status::FailedPrecondition(
          "no new world will form: " + finished + " while this worker was still training (it "
          "left world " + std::to_string(after) + "); an elastic job ends once a worker has "
          "finished, so every worker must end its training at the same step");
    }
    if (Clock::now() + kPollEvery >= deadline) return none("");
    std::this_thread::sleep_for(kPollEvery);
  }
}

// Step 3: polls until every worker of world g is ready. Returns the newer generation that
// superseded g (no wait), or g once all are ready; Timeout once `patience` has passed (the
// caller tells the others and waits for the next world) or `deadline`.
StatusOr<int64_t> WaitReady(StoreClient& store, const std::vector<Line>& lines, int64_t g,
                            Deadline patience, Deadline deadline) {
  size_t next = 0;  // workers before `next` are known to be ready
  while (true) {
    while (next < lines.size()) {
      std::string ignored;
      auto found = store.TryGet(ElasticReadyKey(g, lines[next].id), &ignored, deadline);
      if (!found.ok()) return found.status();
      if (!*found) break;
      ++next;
    }
    if (next == lines.size()) return g;
    auto latest = LatestGeneration(store, deadline);
    if (!latest.ok() || *latest > g) return latest;
    const auto now = Clock::now();
    if (now + kPollEvery >= std::min(patience, deadline)) {
      return Status::Timeout("worker " + lines[next].id + " on host " + lines[next].host +
                             " never joined world " + std::to_string(g) + " within " +
                             (now + kPollEvery >= deadline ? "HVD_ELASTIC_TIMEOUT"
                                                           : "HVD_START_TIMEOUT"));
    }
    std::this_thread::sleep_for(kPollEvery);
  }
}

Status PlaceInLines(const std::vector<Line>& lines, const std::string& id, int64_t generation,
                    Options* o) {
  int me = -1;
  std::map<std::string, int> per_host;   // ranks seen so far on each host
  std::vector<int> local_rank(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].id == id) {
      if (me >= 0) {
        return Status::InvalidArgument("world " + std::to_string(generation) + " names worker " +
                                       id + " twice");
      }
      me = static_cast<int>(i);
    }
    local_rank[i] = per_host[lines[i].host]++;
  }
  if (me < 0) {
    return Status::FailedPrecondition(
        "worker " + id + " has no place in world " + std::to_string(generation) +
        " (hvdrun left it out: its host was blacklisted or removed, or --max-np is reached)");
  }
  const std::string& host = lines[me].host;
  o->rank = me;
  o->size = static_cast<int>(lines.size());
  o->local_rank = local_rank[me];
  o->local_size = per_host[host];
  // Hosts in order of first appearance that have a rank with this local rank.
  std::vector<std::string> hosts;
  for (const Line& l : lines) {
    if (per_host[l.host] > o->local_rank &&
        std::find(hosts.begin(), hosts.end(), l.host) == hosts.end()) {
      hosts.push_back(l.host);
    }
  }
  o->cross_rank = static_cast<int>(std::find(hosts.begin(), hosts.end(), host) - hosts.begin());
  o->cross_size = static_cast<int>(hosts.size());
  o->hostname = host;
  o->elastic_generation = generation;
  o->store_prefix = "g" + std::to_string(generation) + "/";
  return Status::OK();
}

}  // namespace

std::string ElasticWorldKey(int64_t generation) {
  return "elastic/world/" + std::to_string(generation);
}

std::string ElasticReadyKey(int64_t generation, const std::string& id) {
  return "elastic/ready/" + std::to_string(generation) + "/" + id;
}

std::string ElasticHoldsKey(const std::string& id) { return "elastic/holds/" + id; }

std::string ElasticLeftKey(int64_t generation, const std::string& id) {
  return "elastic/left/" + std::to_string(generation) + "/" + id;
}

Status ReportLeft(StoreClient& store, int64_t generation, const std::string& id,
                  const std::string& why) {
  return store.Set(ElasticLeftKey(generation, id), why, DeadlineAfterSeconds(2));
}

StatusOr<int64_t> LatestGeneration(StoreClient& store, Deadline deadline) {
  std::string v;
  auto found = store.TryGet(kElasticLatestKey, &v, deadline);
  if (!found.ok()) return found.status();
  if (!*found) return int64_t{0};
  return ParseGeneration(v);
}

Status PlaceInWorld(const std::string& world, const std::string& id, int64_t generation,
                    Options* o) {
  std::vector<Line> lines;
  HVD_RETURN_IF_ERROR(ParseWorld(world, generation, &lines));
  return PlaceInLines(lines, id, generation, o);
}

Status JoinWorld(StoreClient& store, Options* o, Deadline deadline, bool trained) {
  auto g = WaitNewer(store, o->elastic_after_generation, deadline, trained);
  while (true) {
    if (!g.ok()) return g.status().WithContext("worker " + o->elastic_id + " joining a world");
    auto world = store.Get(ElasticWorldKey(*g), deadline);
    if (!world.ok()) return world.status();
    std::vector<Line> lines;
    HVD_RETURN_IF_ERROR(ParseWorld(*world, *g, &lines));
    HVD_RETURN_IF_ERROR(PlaceInLines(lines, o->elastic_id, *g, o));
    HVD_RETURN_IF_ERROR(store.Set(ElasticReadyKey(*g, o->elastic_id), "", deadline));
    auto ready = WaitReady(store, lines, *g, DeadlineAfterSeconds(o->start_timeout_seconds),
                           deadline);
    if (ready.ok() && *ready == *g) {
      HVD_LOG(kInfo) << "worker " << o->elastic_id << " joins world " << *g << " as rank "
                     << o->rank << " of " << o->size;
      return Status::OK();
    }
    if (!ready.ok() && ready.status().code() == StatusCode::kTimeout &&
        Clock::now() < deadline) {
      // A worker that never came (not started, its host cut off): say so, so that hvdrun
      // stops it and forms the next world, and wait for that one.
      const std::string why = "world " + std::to_string(*g) + " did not form: " +
                              ready.status().message();
      HVD_LOG(kWarning) << why << "; waiting for hvdrun's next world";
      Status told = ReportLeft(store, *g, o->elastic_id, why);
      if (!told.ok()) return told.WithContext("worker " + o->elastic_id + " leaving a world");
      ready = WaitNewer(store, *g, deadline, trained);
    }
    g = ready;  // superseded: join the newer world instead
  }
}

}  // namespace hvd
