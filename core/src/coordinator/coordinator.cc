#include "coordinator/coordinator.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include "common/logging.h"
#include "planner/fusion.h"

namespace hvd {

namespace {

// The collectives that fail while ranks have joined (Validate): these need not wait for the
// other ranks to fail.
bool RefusedWhileJoined(OpType t) {
  return t == OpType::kAllgather || t == OpType::kBroadcast || t == OpType::kAlltoall ||
         t == OpType::kReducescatter;
}

std::string DeviceName(int device) {
  return device == kCpuDevice ? "cpu" : "cuda:" + std::to_string(device);
}

std::string DescribeDiff(const Request& a, const Request& b, bool first_dim_may_differ) {
  if (a.type != b.type) return std::string("operation ") + OpTypeName(a.type) + " vs " + OpTypeName(b.type);
  if (a.dtype != b.dtype) return std::string("dtype ") + DataTypeName(a.dtype) + " vs " + DataTypeName(b.dtype);
  // Ranks may use different GPUs; host memory on one rank and device memory on another is a
  // mismatch.
  if ((a.device == kCpuDevice) != (b.device == kCpuDevice)) {
    return "device " + DeviceName(a.device) + " vs " + DeviceName(b.device);
  }
  bool shape_differs;
  if (first_dim_may_differ) {
    shape_differs = a.shape.size() != b.shape.size() ||
                    (a.shape.size() > 1 &&
                     !std::equal(a.shape.begin() + 1, a.shape.end(), b.shape.begin() + 1));
  } else {
    shape_differs = a.shape != b.shape;
  }
  if (shape_differs) return "shape " + ShapeToString(a.shape) + " vs " + ShapeToString(b.shape);
  if (a.type == OpType::kAllreduce || a.type == OpType::kReducescatter) {
    if (a.op != b.op) return std::string("reduce op ") + ReduceOpName(a.op) + " vs " + ReduceOpName(b.op);
    if (a.prescale != b.prescale || a.postscale != b.postscale) {
      std::ostringstream os;
      os << "scale factors (" << a.prescale << ", " << a.postscale << ") vs (" << b.prescale
         << ", " << b.postscale << ")";
      return os.str();
    }
  }
  if (a.type == OpType::kBroadcast && a.root != b.root) {
    return "root rank " + std::to_string(a.root) + " vs " + std::to_string(b.root);
  }
  if (a.type == OpType::kProcessSet && (a.splits != b.splits || a.root != b.root)) {
    return a.splits.empty() && b.splits.empty()
               ? "process set to remove " + std::to_string(a.root) + " vs " + std::to_string(b.root)
               : "process set ranks " + ShapeToString(a.splits) + " vs " + ShapeToString(b.splits);
  }
  if (a.group_size == b.group_size && a.group_size > 1 && a.group != b.group) {
    return "group membership: groups of " + std::to_string(a.group_size) +
           " tensors with different members ('" + a.group + "' vs '" + b.group + "')";
  }
  if (a.group_size != b.group_size || a.group != b.group) {
    auto of = [](const Request& q) {
      return q.group_size > 1 ? "a group of " + std::to_string(q.group_size) + " tensors ('" +
                                    q.group + "')"
                              : std::string("the tensor alone (no group, or a group of one)");
    };
    return "group membership: " + of(a) + " vs " + of(b);
  }
  return "";
}

}  // namespace

double StallShutdownSeconds(double stall_check_seconds, double stall_shutdown_seconds) {
  return stall_check_seconds > 0 && stall_shutdown_seconds < stall_check_seconds
             ? 0
             : stall_shutdown_seconds;
}

Coordinator::Coordinator(int size, size_t fusion_threshold_bytes, double stall_seconds,
                         double stall_shutdown_seconds)
    : size_(size),
      fusion_threshold_(fusion_threshold_bytes),
      stall_seconds_(stall_seconds),
      stall_shutdown_seconds_(StallShutdownSeconds(stall_seconds, stall_shutdown_seconds)),
      last_shutdown_check_(Clock::now()),
      joined_(size, false),
      last_stall_check_(Clock::now()) {}

void Coordinator::SetProcessSet(int32_t id, std::vector<int> world_ranks) {
  set_id_ = id;
  world_ = std::move(world_ranks);
}

std::vector<int> Coordinator::World(const std::vector<int>& ranks) const {
  std::vector<int> out;
  for (int r : ranks) out.push_back(World(r));
  return out;
}

std::string Coordinator::Where() const {
  return set_id_ == 0 ? "" : " in process set " + std::to_string(set_id_);
}

void Coordinator::AddRequests(int rank, std::vector<Request> requests, Clock::time_point since) {
  for (auto& r : requests) Add(rank, std::move(r), since);
  // A rank's members of a group come in one batch: those of a failed group are all in by now.
  failed_groups_.clear();
}

void Coordinator::AddRequests(int rank, std::vector<Request> requests,
                              const std::vector<Clock::time_point>& since) {
  for (size_t i = 0; i < requests.size(); ++i) {
    Add(rank, std::move(requests[i]), i < since.size() ? since[i] : Clock::time_point());
  }
  failed_groups_.clear();
}

void Coordinator::Add(int rank, Request r, Clock::time_point since) {
  if (r.type == OpType::kJoin) {
    if (!joined_[rank]) {
      joined_[rank] = true;
      ++joined_count_;
      last_joined_ = rank;
    }
    // A rank that joins has no more tensors for this round: what it owed is excused.
    for (auto it = owed_.begin(); it != owed_.end();) {
      it->second.total -= it->second.count[rank];
      it->second.count[rank] = 0;
      it = it->second.total == 0 ? owed_.erase(it) : std::next(it);
    }
    // Everything that waited only on joined ranks is ready now.
    const std::vector<std::string> names(arrival_order_.begin(), arrival_order_.end());
    for (const auto& n : names) MarkReadyIfComplete(n);
    if (joined_count_ == size_) PushReady(BuildJoinResponse());
    return;
  }
  if (!owed_.empty()) {
    auto owed = owed_.find(r.name);
    if (owed != owed_.end() && owed->second.count[rank] > 0) {
      Owed& o = owed->second;
      if (r.group_size > 1 && failed_groups_.count(r.group) == 0) {
        // A member of a group that has not failed in this batch is taken as a later step's: the
        // rank left the name out of the failed step (a group of fewer tensors) and owes nothing.
        // A rank's members of a group reach the coordinator in one batch, so where its group of
        // the failed step held the disputed name too, it failed in that batch. (One that did
        // not, and came after the failure, is taken as a later step's as well.)
        o.total -= o.count[rank];
        o.count[rank] = 0;
        if (o.total == 0) owed_.erase(owed);
      } else {
        // The announcement that pairs with one failed before this rank made it (FailName): alone,
        // or a member of this rank's group that failed earlier in this batch.
        Response e = o.error;
        --o.count[rank];
        if (--o.total == 0) owed_.erase(owed);
        e.names = {r.name};
        e.sizes = {rank};
        PushReady(std::move(e));
        return;
      }
    }
  }
  if (!r.group.empty()) {
    auto failed = failed_groups_.find(r.group);
    if (failed != failed_groups_.end()) {  // a member after its group failed (FailGroup)
      const Response error = failed->second;  // (FailName may add to failed_groups_)
      FailName(r.name, rank, error);
      return;
    }
  }
  std::string name = r.name;
  auto it = table_.find(name);
  if (it == table_.end()) {
    Entry e;
    e.per_rank.resize(size_);
    e.first_seen = Clock::now();
    it = table_.emplace(name, std::move(e)).first;
    it->second.order = arrival_order_.insert(arrival_order_.end(), name);
  }
  Entry& e = it->second;
  if (since != Clock::time_point() && since < e.first_seen) e.first_seen = since;
  if (e.per_rank[rank].has_value()) {
    // The rank itself refuses duplicates in flight; a second copy here is a protocol error.
    HVD_LOG(kError) << "rank " << World(rank) << " announced '" << name << "' twice" << Where();
    return;
  }
  e.per_rank[rank] = std::move(r);
  ++e.count;
  MarkReadyIfComplete(name);
}

void Coordinator::MarkReadyIfComplete(const std::string& name) {
  auto it = table_.find(name);
  if (it == table_.end()) return;
  Entry& e = it->second;
  if (e.count == 0) return;
  int have = 0;
  for (int r = 0; r < size_; ++r) have += (e.per_rank[r].has_value() || joined_[r]) ? 1 : 0;
  auto first_it = std::find_if(e.per_rank.begin(), e.per_rank.end(),
                               [](const auto& o) { return o.has_value(); });
  // While a rank has joined, a collective that cannot run with joined ranks fails at once on
  // the ranks that submitted it, without waiting for the others: their unnamed calls need not
  // carry the same names (one rank's earlier refused call may have taken a number).
  const bool refused = joined_count_ > 0 && RefusedWhileJoined((*first_it)->type);
  if (have < size_ && !refused) return;
  const Request first = **first_it;
  // The groups the ranks put this tensor in, where they disagree (a group of another number of
  // tensors on some rank): none of them can complete as every rank sees it.
  std::set<std::string> disputed;
  for (const auto& q : e.per_rank) {
    if (q && (q->group != first.group || q->group_size != first.group_size)) {
      for (const auto& p : e.per_rank) {
        if (p && p->group_size > 1) disputed.insert(p->group);
      }
      break;
    }
  }
  Response resp = BuildResponse(name, e);
  if (have < size_) {
    // Refused while a rank has joined, before every rank submitted it: the error is for the
    // ranks that did. A later submission of the name elsewhere is an entry of its own,
    // answered on its own; this error must not complete it (messages.h, Response::sizes).
    resp.sizes.clear();
    for (int r = 0; r < size_; ++r) {
      if (e.per_rank[r].has_value()) resp.sizes.push_back(r);
    }
  }
  arrival_order_.erase(e.order);
  table_.erase(it);
  if (!disputed.empty()) {
    // Each of those groups fails as a whole at once, on every rank, with this tensor's
    // reason; this one too.
    for (const auto& key : disputed) FailGroup(key, resp);
    PushReady(std::move(resp));
  } else if (first.group_size > 1) {
    ReleaseGroup(first, std::move(resp));
  } else {
    PushReady(std::move(resp));
  }
}

void Coordinator::FailGroup(const std::string& key, const Response& cause) {
  if (failed_groups_.count(key) > 0) return;  // failed already (FailName goes round)
  const std::string why = "grouped operation '" + key + "'" + Where() +
                          " failed as a whole (every member fails with it): " + cause.error;
  Response error;
  error.type = OpType::kError;
  error.error = why;
  error.error_code = cause.error_code;
  // Members still to come in the batch being added (AddRequests) fail as they come.
  failed_groups_[key] = error;
  // Its members already agreed on and held back (answered as one response each)...
  auto held = groups_.find(key);
  if (held != groups_.end()) {
    for (auto& m : held->second.members) {
      Response e = error;
      e.names = std::move(m.names);
      // An error's sizes are the ranks it is for (an allgather's its rows: for every rank).
      if (m.type == OpType::kError) e.sizes = std::move(m.sizes);
      PushReady(std::move(e));
    }
    groups_.erase(held);
  }
  // ... and those waiting on some rank.
  std::vector<std::string> members;
  for (const auto& [name, entry] : table_) {
    for (const auto& q : entry.per_rank) {
      if (q && q->group == key) {
        members.push_back(name);
        break;
      }
    }
  }
  for (const auto& name : members) {
    if (table_.count(name) > 0) FailName(name, -1, error);  // (not failed with another group)
  }
}

void Coordinator::FailName(const std::string& name, int rank, const Response& error) {
  std::vector<bool> announced(size_, false);
  if (rank >= 0) announced[rank] = true;
  std::vector<std::string> groups;  // other groups of the entry's requests
  auto it = table_.find(name);
  if (it != table_.end()) {
    for (int q = 0; q < size_; ++q) {
      const auto& req = it->second.per_rank[q];
      if (!req) continue;
      announced[q] = true;
      if (req->group_size > 1) groups.push_back(req->group);
    }
    arrival_order_.erase(it->second.order);
    table_.erase(it);
  }
  // The error is for the ranks that announced the name (a rank whose announcement is on its
  // way must not take it for its own: that one pairs with this failure when it comes).
  Response e = error;
  e.names = {name};
  std::vector<int> owing;
  for (int q = 0; q < size_; ++q) {
    if (announced[q]) {
      e.sizes.push_back(q);
    } else if (!joined_[q]) {
      owing.push_back(q);
    }
  }
  if (static_cast<int>(e.sizes.size()) == size_) e.sizes.clear();  // every rank
  if (!owing.empty()) {
    // (Debts of names that never come back, such as numbered unnamed groups of a program that
    // goes on after every failure, are bounded: past kMaxOwed names one is forgotten.)
    if (owed_.size() >= kMaxOwed && owed_.count(name) == 0) owed_.erase(owed_.begin());
    Owed& o = owed_[name];
    if (o.total == 0) newly_owed_.push_back(name);
    o.error = error;
    o.count.resize(size_, 0);
    for (int q : owing) ++o.count[q];
    o.total += static_cast<int>(owing.size());
  }
  PushReady(std::move(e));
  for (const auto& other : groups) FailGroup(other, error);
}

void Coordinator::ReleaseGroup(const Request& first, Response r) {
  Group& g = groups_[first.group];
  if (g.members.empty()) {
    g.size = first.group_size;
    g.since = Clock::now();
  }
  g.members.push_back(std::move(r));
  if (static_cast<int>(g.members.size()) < g.size) return;
  std::vector<Response> members = std::move(g.members);
  groups_.erase(first.group);
  // One failed member fails them all, with its reason (the first failure's code).
  std::string why;
  StatusCode code = StatusCode::kInvalidArgument;
  for (const auto& m : members) {
    if (m.type != OpType::kError) continue;
    if (why.empty()) code = m.error_code;
    why += (why.empty() ? "" : "; ") + m.error;
  }
  if (!why.empty()) {
    std::ostringstream os;
    os << "grouped " << OpTypeName(first.type) << " of " << members.size()
       << " tensors failed as a whole (every member fails with it): " << why;
    for (auto& m : members) {
      Response e;
      e.type = OpType::kError;
      e.names = m.names;
      // A member refused while a rank has joined: for the ranks that submitted it. (Where a
      // member's response is not an error, its sizes are no ranks: an allgather's rows.)
      if (m.type == OpType::kError) e.sizes = m.sizes;
      e.error = os.str();
      e.error_code = code;
      m = std::move(e);
    }
  }
  for (auto& m : members) PushReady(std::move(m));
}

// Every rank's call, where ranks added or removed different process sets: a rank whose call
// is neither of the first two that differ reads its own too. "; each rank's call: [0, 1] on
// ranks [0, 1], [0, 2] on rank [2], ..."
std::string Coordinator::EachRanksSet(const Entry& e) const {
  std::vector<std::pair<const Request*, std::vector<int>>> calls;
  for (int r = 0; r < size_; ++r) {
    if (!e.per_rank[r]) continue;
    const Request& q = *e.per_rank[r];
    auto same = std::find_if(calls.begin(), calls.end(), [&](const auto& c) {
      return c.first->splits == q.splits && c.first->root == q.root;
    });
    if (same == calls.end()) {
      calls.push_back({&q, {World(r)}});
    } else {
      same->second.push_back(World(r));
    }
  }
  std::ostringstream os;
  os << "; each rank's call:";
  for (size_t i = 0; i < calls.size() && i < kStallNamesShown; ++i) {
    const Request& q = *calls[i].first;
    std::vector<int> ranks(q.splits.begin(), q.splits.end());
    os << (i ? ", " : " ")
       << (ranks.empty() ? "remove set " + std::to_string(q.root) : "[" + RankList(ranks, 16) + "]")
       << " on rank" << (calls[i].second.size() > 1 ? "s" : "") << " ["
       << RankList(calls[i].second, 16) << "]";
  }
  if (calls.size() > kStallNamesShown) os << " and " << calls.size() - kStallNamesShown << " more";
  return os.str();
}

std::string Coordinator::Validate(const std::string& name, const Entry& e) const {
  int ref = -1;
  for (int r = 0; r < size_; ++r) {
    if (!e.per_rank[r]) continue;
    if (ref < 0) {
      ref = r;
      continue;
    }
    const Request& a = *e.per_rank[ref];
    const Request& b = *e.per_rank[r];
    bool flexible = a.type == OpType::kAllgather || a.type == OpType::kAlltoall;
    std::string diff = DescribeDiff(a, b, flexible);
    if (!diff.empty()) {
      return std::string(OpTypeName(a.type)) + " '" + name + "'" + Where() +
             ": mismatch across ranks: " + diff + " (rank " + std::to_string(World(ref)) +
             " vs rank " + std::to_string(World(r)) + ")" +
             (a.type == OpType::kProcessSet ? EachRanksSet(e) : "");
    }
  }
  const Request& a = *e.per_rank[ref];
  std::vector<int> joined;
  for (int r = 0; r < size_; ++r) {
    if (joined_[r]) joined.push_back(r);
  }
  // As in Horovod, with Horovod's words (scripts look for them): while ranks have joined, an
  // allreduce takes zeros from them and a barrier waits for the others only; every other
  // collective fails on the ranks that submitted it.
  if (!joined.empty() && a.type != OpType::kAllreduce && a.type != OpType::kBarrier) {
    std::string what = OpTypeName(a.type);
    what[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(what[0])));
    return std::string(OpTypeName(a.type)) + " '" + name + "': " + what +
           " is not supported with Join at this time" +
           (a.type == OpType::kAllgather
                ? ". Specify sparse_as_dense=True if using DistributedOptimizer"
                : "") +
           " (ranks " + RankList(joined) + " have joined)";
  }
  return "";
}

Response Coordinator::BuildResponse(const std::string& name, Entry& e) {
  Response resp;
  // A rank that refused its own arguments (Request::error): every rank fails with its reason,
  // which names it, before any comparison (its fields may be anything).
  std::vector<int> refusing;
  for (int r = 0; r < size_; ++r) {
    if (e.per_rank[r] && !e.per_rank[r]->error.empty()) refusing.push_back(r);
  }
  if (!refusing.empty()) {
    const Request& q = *e.per_rank[refusing[0]];
    resp.type = OpType::kError;
    resp.names = {name};
    resp.error_code = q.error_code;
    resp.error = q.error;
    if (refusing.size() > 1) {
      resp.error += " (ranks [" + RankList(World(refusing)) + "] refused it)";
    }
    resp.error += "; the operation fails on every rank" +
                  (set_id_ == 0 ? std::string() : " of process set " + std::to_string(set_id_));
    return resp;
  }
  std::string err = Validate(name, e);
  if (!err.empty()) {
    resp.type = OpType::kError;
    resp.names = {name};
    resp.error = err;
    return resp;
  }
  const Request* first = nullptr;
  for (auto& o : e.per_rank) {
    if (o) {
      first = &*o;
      break;
    }
  }
  resp.type = first->type;
  resp.names = {name};
  resp.shapes = {first->shape};
  if (first->group_size > 1) {  // (the same on every rank: Validate compared them)
    resp.groups = {first->group};
    resp.group_sizes = {first->group_size};
  }
  resp.dtype = first->dtype;
  resp.op = first->op;
  resp.root = first->root;
  resp.prescale = first->prescale;
  resp.postscale = first->postscale;
  for (int r = 0; r < size_; ++r) {
    if (!e.per_rank[r]) resp.joined.push_back(r);
  }
  resp.device = first->device;
  if (resp.type == OpType::kAllgather) {
    for (int r = 0; r < size_; ++r) {
      resp.sizes.push_back(e.per_rank[r] && !e.per_rank[r]->shape.empty() ? e.per_rank[r]->shape[0] : 0);
    }
  } else if (resp.type == OpType::kProcessSet) {
    resp.sizes = first->splits;
  } else if (resp.type == OpType::kAlltoall) {
    for (int r = 0; r < size_; ++r) {
      const Request& q = *e.per_rank[r];
      int64_t rows = q.shape.empty() ? 1 : q.shape[0];
      for (int d = 0; d < size_; ++d) {
        resp.sizes.push_back(q.splits.empty() ? rows / size_ : q.splits[d]);
      }
    }
  }
  return resp;
}

void Coordinator::ReadyAndMissing(const Entry& e, std::vector<int>* ready,
                                  std::vector<int>* missing) const {
  for (int r = 0; r < size_; ++r) {
    if (e.per_rank[r]) {
      ready->push_back(r);
    } else if (!joined_[r]) {
      missing->push_back(r);
    }
  }
}

std::string Coordinator::RefusalOf(const Entry& e) const {
  for (int r = 0; r < size_; ++r) {
    if (e.per_rank[r] && !e.per_rank[r]->error.empty()) {
      return "; rank " + std::to_string(World(r)) + " refused it: " + e.per_rank[r]->error;
    }
  }
  return "";
}

std::string Coordinator::Label(const std::string& name, const Entry& e) const {
  for (const auto& q : e.per_rank) {
    if (!q || q->type != OpType::kProcessSet) continue;
    std::vector<int> ranks(q->splits.begin(), q->splits.end());
    return (ranks.empty() ? "remove_process_set(" + std::to_string(q->root) + ")"
                          : "add_process_set([" + RankList(ranks) + "])") +
           " ('" + name + "')";
  }
  return "'" + name + "'";
}

Response Coordinator::BuildJoinResponse() {
  Response resp;
  resp.type = OpType::kJoin;
  resp.names = {kJoinName};
  resp.last_joined = last_joined_;
  std::fill(joined_.begin(), joined_.end(), false);
  joined_count_ = 0;
  last_joined_ = -1;
  return resp;
}

void Coordinator::PushReady(Response r) {
  if (ready_.empty()) ready_since_ = Clock::now();
  ready_.push_back(std::move(r));
}

std::vector<Response> Coordinator::ComputeResponses() {
  std::vector<Response> out = std::move(ready_);
  ready_.clear();
  return FuseResponses(std::move(out), fusion_threshold_);
}

std::vector<std::string> Coordinator::PendingNames() const {
  return std::vector<std::string>(arrival_order_.begin(), arrival_order_.end());
}

std::vector<std::string> Coordinator::OwedNames() const {
  std::vector<std::string> out;
  out.reserve(owed_.size());
  for (const auto& kv : owed_) out.push_back(kv.first);
  return out;
}

void Coordinator::CheckStallShutdown(Clock::time_point now) {
  if (stall_shutdown_seconds_ <= 0 || !stall_shutdown_.empty() ||
      now - last_shutdown_check_ < std::chrono::seconds(1)) {
    return;
  }
  last_shutdown_check_ = now;
  const auto limit = std::chrono::duration<double>(stall_shutdown_seconds_);
  for (const auto& name : arrival_order_) {  // the oldest first
    const Entry& e = table_.at(name);
    if (now - e.first_seen < limit) continue;
    std::vector<int> missing, ready;
    ReadyAndMissing(e, &ready, &missing);
    const OpType type = ready.empty() ? OpType::kAllreduce : e.per_rank[ready.back()]->type;
    std::ostringstream os;
    os << "hvd shut down: ";
    if (type != OpType::kProcessSet) os << OpTypeName(type) << " ";
    os << Label(name, e) << Where()
       << " waited " << std::chrono::duration_cast<std::chrono::seconds>(now - e.first_seen).count()
       << " s, past HVD_STALL_SHUTDOWN_TIME_SECONDS (" << stall_shutdown_seconds_
       << " s), for ranks [" << RankList(World(missing))
       << "], which never submitted it; it was ready on ranks [" << RankList(World(ready)) << "]"
       << RefusalOf(e)
       << ". As Horovod does, every rank's operations fail from now on (ranks out of step would "
          "pair one step's tensor with another's)";
    stall_shutdown_ = os.str();
    HVD_LOG(kError) << stall_shutdown_;
    return;
  }
}

int Coordinator::CheckStalls(Clock::time_point now) {
  CheckStallShutdown(now);
  if (!stall_shutdown_.empty()) return 0;  // said once, as the job's error
  if (stall_seconds_ <= 0 || now - last_stall_check_ < std::chrono::duration<double>(stall_seconds_)) {
    return 0;
  }
  last_stall_check_ = now;
  int stalled = 0;
  stall_warnings_.clear();
  // One line per set of ranks missing (and ready, and a refusal's words): a step of hundreds of
  // gradients that one rank is late for is one line, as Horovod's one message per check.
  struct Stalled {
    std::vector<std::string> names;  // the oldest first
    long longest = 0;
  };
  std::map<std::string, Stalled> lines;  // by the line's words after the names
  std::vector<std::string> order;
  for (const auto& name : arrival_order_) {  // the oldest first
    const Entry& e = table_.at(name);
    if (now - e.first_seen < std::chrono::duration<double>(stall_seconds_)) continue;
    std::vector<int> missing, ready;
    ReadyAndMissing(e, &ready, &missing);
    ++stalled;
    const std::string key = "ready on ranks [" + RankList(World(ready)) +
                            "], missing on ranks [" + RankList(World(missing)) + "]" +
                            RefusalOf(e);
    auto [it, fresh] = lines.try_emplace(key);
    if (fresh) order.push_back(key);
    it->second.names.push_back(Label(name, e));
    it->second.longest = std::max<long>(
        it->second.longest,
        std::chrono::duration_cast<std::chrono::seconds>(now - e.first_seen).count());
  }
  for (const auto& key : order) {
    const Stalled& s = lines.at(key);
    std::ostringstream os;
    const size_t shown = std::min<size_t>(s.names.size(), kStallNamesShown);
    if (s.names.size() == 1) {
      os << "stall: " << s.names[0] << Where() << " has waited " << s.longest << " s; ";
    } else {
      os << "stall: " << s.names.size() << " tensors" << Where() << " have waited up to "
         << s.longest << " s (";
      for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << s.names[i];
      if (shown < s.names.size()) os << " and " << s.names.size() - shown << " more";
      os << "); ";
    }
    os << key;
    stall_warnings_.push_back(os.str());
    HVD_LOG(kWarning) << stall_warnings_.back();
  }
  for (const auto& [key, g] : groups_) {
    if (now - g.since < std::chrono::duration<double>(stall_seconds_)) continue;
    std::ostringstream ready;
    for (size_t i = 0; i < g.members.size(); ++i) {
      ready << (i ? ", " : "") << "'" << g.members[i].names[0] << "'";
    }
    ++stalled;
    std::ostringstream os;
    os << "stall: group '" << key << "'" << Where() << " has held back its ready members ["
       << ready.str() << "] for "
       << std::chrono::duration_cast<std::chrono::seconds>(now - g.since).count()
       << " s, waiting for " << g.size - static_cast<int>(g.members.size()) << " more of its "
       << g.size << " members (see the stall messages for the names not ready)";
    stall_warnings_.push_back(os.str());
    HVD_LOG(kWarning) << stall_warnings_.back();
  }
  return stalled;
}

}  // namespace hvd
