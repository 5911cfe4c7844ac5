#include "elastic.h"

#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "bootstrap/elastic.h"
#include "output.h"

namespace hvd {
namespace launcher {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::string HostList(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const HostSlots& h : hosts) {
    out += (out.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::vector<HostSlots> ParseDiscoveredHosts(const std::string& text, int slots_per_host) {
  std::vector<HostSlots> hosts;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    line = Trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    // (Errors name the line: "bad slot count 'x' in the host discovery script's line 'a:x'
    // (expected ...)"; an IPv6 address needs its brackets, as in -H.)
    const HostSlots h = ParseHostColonSlots(
        line, "the host discovery script's line '" + line + "'", slots_per_host);
    auto same = std::find_if(hosts.begin(), hosts.end(),
                             [&](const HostSlots& o) { return o.host == h.host; });
    if (same != hosts.end()) {
      same->slots = h.slots;  // the last line for a host wins
    } else {
      hosts.push_back(h);
    }
  }
  return hosts;
}

DiscoveryRun::DiscoveryRun(const std::string& script, double timeout_seconds)
    : script_(script), timeout_seconds_(timeout_seconds) {
  int out[2], status[2];
  if (::pipe2(out, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw LaunchError("pipe: " + std::string(strerror(errno)));
  }
  if (::pipe2(status, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw LaunchError("pipe: " + std::string(strerror(errno)));
  }
  pid_ = ::fork();
  if (pid_ < 0) {
    for (int fd : {out[0], out[1], status[0], status[1]}) ::close(fd);
    throw LaunchError("fork: " + std::string(strerror(errno)));
  }
  if (pid_ == 0) {
    ::setpgid(0, 0);
    sigset_t all;
    sigemptyset(&all);
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(status[1], 3);
    // The script runs in a shell of its own; this one writes its exit status to fd 3 (128 + N
    // for a script killed by signal N), which the script does not get.
    ::execl("/bin/sh", "sh", "-c", "/bin/sh -c \"$1\" 3>&-; echo $? >&3", "sh", script.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);
  WatchGroup(pid_);  // should hvdrun be killed meanwhile
  ::close(out[1]);
  ::close(status[1]);
  out_fd_ = out[0];
  status_fd_ = status[0];
  deadline_ = Clock::now() + Seconds(timeout_seconds);
}

DiscoveryRun::~DiscoveryRun() {
  // The group is still the script's while its shell holds the status pipe open (its end is
  // read within a tick of the shell's exit; the shell is reaped, by the supervisor, after).
  Kill();
  for (int fd : {out_fd_, status_fd_}) {
    if (fd >= 0) ::close(fd);
  }
  if (!forgotten_) ForgetGroupIfGone(pid_);
}

void DiscoveryRun::Kill() {
  if (status_fd_ < 0 || forgotten_ || ::killpg(pid_, SIGKILL) != 0) return;
  ForgetKilledGroup(pid_);
  forgotten_ = true;
}

void DiscoveryRun::Reap() {
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

bool DiscoveryRun::Poll(int wait_ms) {
  const auto until = Clock::now() + std::chrono::milliseconds(wait_ms);
  while (out_fd_ >= 0 || status_fd_ >= 0) {
    pollfd p[2] = {{out_fd_, POLLIN, 0}, {status_fd_, POLLIN, 0}};
    const auto now = Clock::now();
    if (now >= deadline_) {
      timed_out_ = true;
      // While the status pipe is open the group is still the script's. Once its shell has
      // ended, whatever still holds its output is left be (it may have left the group).
      Kill();
      for (int* fd : {&out_fd_, &status_fd_}) {
        if (*fd >= 0) ::close(*fd);
        *fd = -1;
      }
      return true;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::min(until, deadline_) - now);
    int ready = ::poll(p, 2, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) {
      if (Clock::now() >= until) return false;
      continue;
    }
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      int* fd = i == 0 ? &out_fd_ : &status_fd_;
      std::string* into = i == 0 ? &out_ : &status_;
      if (*fd < 0 || p[i].revents == 0) continue;
      ssize_t n = ::read(*fd, buf, sizeof(buf));
      if (n > 0 && into->size() < (1u << 20)) into->append(buf, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        ::close(*fd);
        *fd = -1;
      }
    }
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (status_fd_ >= 0) ::close(status_fd_);
  out_fd_ = status_fd_ = -1;
  return true;
}

std::string DiscoveryRun::Result() const {
  if (timed_out_) {
    throw LaunchError("the host discovery script did not finish within " +
                      std::to_string(static_cast<int>(timeout_seconds_)) + " s");
  }
  const std::string code = Trim(status_.substr(0, status_.find('\n')));
  if (code != "0") {
    int n = code.empty() ? -1 : std::atoi(code.c_str());
    throw LaunchError("the host discovery script '" + script_ + "' failed (" +
                      (n > 128 ? "exit code " + std::to_string(n) + ": 128 + signal " +
                                     std::to_string(n - 128) + ", if a signal ended it"
                               : n >= 0 ? "exit code " + std::to_string(n)
                                        : std::string("no exit status")) +
                      ")");
  }
  return out_;
}

std::string RunDiscoveryScript(const std::string& script, double timeout_seconds) {
  DiscoveryRun run(script, timeout_seconds);
  while (!run.Poll(1000)) {
  }
  run.Reap();
  return run.Result();
}

std::string WorldText(const std::vector<std::pair<std::string, std::string>>& ids_and_hosts) {
  std::string text;
  for (const auto& [id, host] : ids_and_hosts) text += id + " " + host + "\n";
  return text;
}

ElasticDriver::ElasticDriver(const ElasticOptions& options, Supervisor* supervisor,
                             std::unique_ptr<StoreClient> store, StartFn start)
    : options_(options), supervisor_(supervisor), store_(std::move(store)),
      start_(std::move(start)), next_discovery_(Clock::now()) {}

void ElasticDriver::Say(const std::string& line) const {
  WriteAll(Console(STDERR_FILENO), "hvdrun: elastic: " + line + "\n");
}

void ElasticDriver::Fail(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  Say(why + "; stopping the job");
  supervisor_->Abort(1);
}

// Runs the discovery script (when there is one). Returns whether the host list changed. A
// script that fails at the first run ends the job; later failures keep the last list.
bool ElasticDriver::Discover(bool first) {
  if (options_.discovery_script.empty()) {
    if (!first) return false;
    hosts_ = options_.hosts;
    return true;
  }
  next_discovery_ = Clock::now() + Seconds(options_.discovery_interval_seconds);
  std::string output;
  try {
    // Before the supervisor runs (Start): this run is reaped here, and a signal ends the wait.
    DiscoveryRun run(options_.discovery_script, std::min(10.0, options_.elastic_timeout_seconds));
    while (!run.Poll(100)) {
      if (!supervisor_->KeepStarting()) {
        stopped_ = true;
        return false;
      }
    }
    run.Reap();
    output = run.Result();
  } catch (const LaunchError& e) {
    return DiscoveryFailed(e, first);
  }
  return TakeHosts(output, first);
}

// A discovery that failed: at the first run it ends the job; later the last list stays.
bool ElasticDriver::DiscoveryFailed(const LaunchError& e, bool first) {
  if (first) {
    Fail(e.what());
  } else {
    Say(std::string(e.what()) + "; keeping the last host list");
  }
  return false;
}

// Tick's discovery: starts a run when one is due, and takes its hosts once it is over, without
// waiting for it. Returns whether the host list changed.
bool ElasticDriver::PollDiscovery() {
  if (!discovery_) {
    if (Clock::now() < next_discovery_) return false;
    try {
      discovery_ = std::make_unique<DiscoveryRun>(options_.discovery_script,
                                                  std::min(10.0, options_.elastic_timeout_seconds));
    } catch (const LaunchError& e) {
      next_discovery_ = Clock::now() + Seconds(options_.discovery_interval_seconds);
      return DiscoveryFailed(e, /*first=*/false);
    }
  }
  if (!discovery_->Poll(0)) return false;
  std::unique_ptr<DiscoveryRun> run = std::move(discovery_);
  next_discovery_ = Clock::now() + Seconds(options_.discovery_interval_seconds);
  std::string output;
  try {
    output = run->Result();
  } catch (const LaunchError& e) {
    return DiscoveryFailed(e, /*first=*/false);
  }
  return TakeHosts(output, /*first=*/false);
}

bool ElasticDriver::TakeHosts(const std::string& output, bool first) {
  std::vector<HostSlots> found;
  try {
    found = ParseDiscoveredHosts(output, options_.slots_per_host);
  } catch (const LaunchError& e) {
    return DiscoveryFailed(e, first);
  }
  auto key = [](const std::vector<HostSlots>& v) { return HostList(v); };
  if (!first && key(found) == key(hosts_)) return false;
  Say("hosts: " + HostList(found));
  hosts_ = std::move(found);
  return true;
}

bool ElasticDriver::Usable(const std::string& host) const {
  auto b = blacklist_.find(host);
  return b == blacklist_.end() || Clock::now() >= b->second.until;
}

int ElasticDriver::SlotsOf(const std::string& host) const {
  for (const HostSlots& h : hosts_) {
    if (h.host == host) return Usable(host) ? h.slots : 0;
  }
  return 0;
}

// Slots of usable hosts that no live worker holds, in host order.
std::vector<std::pair<std::string, int>> ElasticDriver::FreeSlots() const {
  std::vector<std::pair<std::string, int>> free;
  for (const HostSlots& h : hosts_) {
    if (!Usable(h.host)) continue;
    for (int s = 0; s < h.slots; ++s) {
      bool taken = std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
        return w.alive && w.host == h.host && w.slot == s;
      });
      if (!taken) free.emplace_back(h.host, s);
    }
  }
  return free;
}

void ElasticDriver::Retire(Worker& w, const std::string& why) {
  if (!w.alive || w.retired) return;
  w.retired = true;
  Say("stopping worker " + w.id + " (" + why + ")");
  supervisor_->Stop(w.pid);
}

void ElasticDriver::Blacklist(const std::string& host) {
  Blacklisted& b = blacklist_[host];
  ++b.failures;
  b.back = false;
  if (options_.cooldown_min_seconds <= 0) {
    b.until = TimePoint::max();
    Say("host " + host + " is blacklisted for the rest of the job");
    return;
  }
  double cooldown = std::min(options_.cooldown_max_seconds,
                             options_.cooldown_min_seconds * std::ldexp(1.0, b.failures - 1));
  b.until = Clock::now() + Seconds(cooldown);
  std::ostringstream os;
  os << "host " << host << " is blacklisted for " << cooldown << " s (failure " << b.failures
     << " on it)";
  Say(os.str());
}

bool ElasticDriver::Start() {
  if (!Discover(true) || failed_ || stopped_) return false;
  const auto deadline = Clock::now() + Seconds(options_.elastic_timeout_seconds);
  while (static_cast<int>(FreeSlots().size()) < options_.np) {
    if (Clock::now() >= deadline || options_.discovery_script.empty()) {
      Say("the hosts (" + HostList(hosts_) + ") have fewer than -np " +
          std::to_string(options_.np) + " slots" +
          (options_.discovery_script.empty()
               ? ""
               : " after " + std::to_string(static_cast<int>(options_.elastic_timeout_seconds)) +
                     " s (--elastic-timeout)"));
      return false;
    }
    // A signal ends the wait (up to --elastic-timeout, 600 s by default) at once.
    if (!supervisor_->KeepStarting()) return false;
    usleep(static_cast<useconds_t>(options_.discovery_interval_seconds * 1e6));
    if (!supervisor_->KeepStarting()) return false;
    Discover(false);
    if (failed_ || stopped_) return false;
  }
  Reform("start");
  return !failed_;
}

// Step 4 (and step 1's first world).
void ElasticDriver::Reform(const std::string& why, bool again) {
  if (failed_ || finishing_) return;
  RefreshFormed();
  std::vector<int> keep;
  for (int w : world_) {
    if (workers_[w].alive && !workers_[w].retired && !workers_[w].leaving) keep.push_back(w);
  }
  if (keep.empty() && generation_ > 0) {
    // Each failed in turn: an error every worker meets (a mismatch, an exception in the
    // script) is the script's own, which no new world would get past.
    std::string failures;
    for (size_t i = 0; i < world_failures_.size() && i < 8; ++i) {
      failures += (i ? "; " : " (") + world_failures_[i];
    }
    if (!failures.empty()) {
      const size_t more = world_failures_.size() > 8 ? world_failures_.size() - 8 : 0;
      failures += more > 0 ? "; and " + std::to_string(more) + " more)" : ")";
      if (world_failures_.size() > 1) {
        failures += ": an error that every worker meets is most likely the script's own (their "
                    "output above says what it was), which a new world would meet again";
      }
    }
    // Before any world formed there was no state to lose: the workers failed as they started
    // (their own output says why: a missing module, a bad path, ...).
    Fail(formed_ > 0 ? "every worker of world " + std::to_string(generation_) +
                           " is gone, so none holds the committed state" + failures
                     : "every worker exited before any world formed (world " +
                           std::to_string(generation_) +
                           " never did): see their output above for why they failed to start");
    return;
  }
  // Once a world has formed, the state lives in the workers that hold it (Worker::holds): the
  // new world's rank 0, whose state every rank takes, must be one of them. Workers started
  // for a world that never formed, or that joined one but never took its state, hold only the
  // initial state.
  for (int w : keep) RefreshHolds(workers_[w]);
  auto holds = [this](int w) { return workers_[w].holds; };
  std::stable_partition(keep.begin(), keep.end(), holds);
  if (formed_ > 0 && !holds(keep.front())) {
    Fail("every worker that holds the committed state is gone (the " +
         std::to_string(keep.size()) + " left never took it: started for world " +
         std::to_string(generation_) + ", which never formed, or their rank 0 was lost " +
         "before its broadcast of the state reached them)");
    return;
  }
  std::vector<std::pair<std::string, int>> free = FreeSlots();
  int room = static_cast<int>(free.size());
  if (options_.max_np > 0) room = std::min(room, options_.max_np - static_cast<int>(keep.size()));
  room = std::max(room, 0);
  const bool lost = keep.size() < world_.size();
  if (!lost && room == 0 && generation_ > 0 && !again) return;  // nothing would change
  const int total = static_cast<int>(keep.size()) + room;
  if (total < options_.min_np) {
    if (waiting_since_ == TimePoint::max()) {
      waiting_since_ = Clock::now();
      Say(std::to_string(total) + " worker(s) possible, fewer than --min-np " +
          std::to_string(options_.min_np) + "; waiting up to " +
          std::to_string(static_cast<int>(options_.elastic_timeout_seconds)) +
          " s (--elastic-timeout) for hosts");
    }
    return;
  }
  waiting_since_ = TimePoint::max();
  // As Horovod's: a world that replaces one that formed is a reset; one that replaces a world
  // that never formed (a host unreachable at the start) is not.
  if (formed_ > 0 && options_.reset_limit >= 0 && ++resets_ > options_.reset_limit) {
    Fail("a new world is needed (" + why + ") but --reset-limit " +
         std::to_string(options_.reset_limit) + " is reached");
    return;
  }
  std::vector<int> added;
  for (int i = 0; i < room; ++i) {
    Worker w;
    w.host = free[i].first;
    w.slot = free[i].second;
    w.id = w.host + ":" + std::to_string(w.slot) + "#" + std::to_string(workers_.size());
    w.alive = false;  // until started
    added.push_back(static_cast<int>(workers_.size()));
    workers_.push_back(w);
  }
  std::vector<int> world = Order(keep, added);
  if (!Publish(world) || !StartWorkers(added, world)) return;
  std::ostringstream os;
  os << "world " << generation_ << ": " << world.size() << " rank(s) (" << why << ")";
  if (!added.empty()) os << ", " << added.size() << " new worker(s)";
  Say(os.str());
}

// The new world's order: hosts in the order their first survivor had; survivors first on each
// host, then the new workers; hosts with only new workers last, in host-list order.
std::vector<int> ElasticDriver::Order(const std::vector<int>& keep,
                                      const std::vector<int>& added) const {
  std::vector<std::string> host_order;
  for (const std::vector<int>* group : {&keep, &added}) {
    for (int w : *group) {
      const std::string& h = workers_[w].host;
      if (std::find(host_order.begin(), host_order.end(), h) == host_order.end()) {
        host_order.push_back(h);
      }
    }
  }
  std::vector<int> world;
  for (const std::string& h : host_order) {
    for (const std::vector<int>* group : {&keep, &added}) {
      for (int w : *group) {
        if (workers_[w].host == h) world.push_back(w);
      }
    }
  }
  return world;
}

// A host that cannot be reached (its ssh check fails, or it is another machine and the job has
// no --network-interface to reach it by) is blacklisted, as a host whose worker failed, and
// the world is formed again without it; the workers already started for this world
// join that one. Any other failure to start a worker ends the job.
bool ElasticDriver::StartWorkers(const std::vector<int>& added, const std::vector<int>& world) {
  std::string unreachable;
  for (int w : added) {
    if (!Usable(workers_[w].host)) continue;  // blacklisted by an earlier worker of this loop
    Placement p;  // its place in the new world: only a first guess, the store has the truth
    p.rank = static_cast<int>(std::find(world.begin(), world.end(), w) - world.begin());
    p.size = static_cast<int>(world.size());
    p.host = workers_[w].host;
    try {
      RankProcess r = start_(p, workers_[w].id, w);
      workers_[w].pid = r.pid;
      workers_[w].alive = true;
      supervisor_->Add(r);
    } catch (const HostUnreachable& e) {
      Say("cannot start worker " + workers_[w].id + ": " + e.what() +
          "; forming a new world without its host");
      Blacklist(workers_[w].host);
      if (unreachable.empty()) unreachable = workers_[w].host;
    } catch (const std::exception& e) {
      Fail("cannot start worker " + workers_[w].id + ": " + e.what());
      return false;
    }
  }
  if (unreachable.empty()) return true;
  Reform("host " + unreachable + " is unreachable", /*again=*/true);
  return false;
}

bool ElasticDriver::Publish(const std::vector<int>& world) {
  std::vector<std::pair<std::string, std::string>> lines;
  for (int w : world) lines.emplace_back(workers_[w].id, workers_[w].host);
  const int64_t g = generation_ + 1;
  const Deadline deadline = Clock::now() + std::chrono::seconds(10);
  Status s = store_->Set(ElasticWorldKey(g), WorldText(lines), deadline);
  if (s.ok()) s = store_->Set(kElasticLatestKey, std::to_string(g), deadline);
  if (!s.ok()) {
    Fail("cannot publish world " + std::to_string(g) + ": " + s.ToString());
    return false;
  }
  generation_ = g;
  world_ = world;
  world_failures_.clear();
  unformed_.emplace_back(g, world);
  first_left_ = TimePoint::max();
  return true;
}

bool ElasticDriver::OnRankExit(const RankProcess& r, bool ok, const std::string& what) {
  auto it = std::find_if(workers_.begin(), workers_.end(),
                         [&](const Worker& w) { return w.pid == r.pid && w.alive; });
  if (it == workers_.end()) return false;
  it->alive = false;
  // (A leaving worker's exit, with 0 or not, neither ends the job nor blacklists its host:
  // training goes on in the world without it.)
  if (it->retired || it->leaving) return true;
  if (ok) {
    if (!finishing_) {
      // A worker still training when another finished (its loop ran to another step) leaves
      // its world as its allreduces fail, and would wait for the next one until
      // --elastic-timeout: this tells it that none comes, and why.
      std::ostringstream os;
      os << "worker " << it->id;
      const auto place = std::find(world_.begin(), world_.end(),
                                   static_cast<int>(it - workers_.begin()));
      if (place != world_.end()) {
        os << " (rank " << place - world_.begin() << " of world " << generation_ << ")";
      }
      os << " finished (exited 0)";
      (void)store_->Set(kElasticFinishedKey, os.str(), Clock::now() + std::chrono::seconds(2));
    }
    finishing_ = true;  // step 5: the others are expected to finish too
    StopUnjoinedIfFinished();
    return false;
  }
  if (finishing_ || failed_) return false;
  Say(what + "; forming a new world without it");
  world_failures_.push_back(what);
  const std::string host = it->host;
  const std::string id = it->id;  // `it` does not survive Reform, which adds workers
  Blacklist(host);
  for (Worker& w : workers_) {
    if (w.host == host) Retire(w, "its host is blacklisted");
  }
  Reform("worker " + id + " failed");
  return true;
}

// A world has formed once every worker of it is ready (bootstrap/elastic.h): its members then
// hold the state. Every published world is looked at until it or a newer one has formed.
void ElasticDriver::RefreshFormed() {
  for (auto& [g, world] : unformed_) {
    bool all = true;
    for (int w : world) {
      std::string v;
      auto ready = store_->TryGet(ElasticReadyKey(g, workers_[w].id), &v,
                                  Clock::now() + std::chrono::seconds(2));
      if (!ready.ok() || !*ready) {
        all = false;
        break;
      }
    }
    if (!all) continue;
    const bool first = formed_ == 0;  // its members start from the initial state: they hold it
    formed_ = std::max(formed_, g);
    for (int w : world) {
      workers_[w].joined = true;
      if (first) workers_[w].holds = true;
    }
  }
  const int64_t formed = formed_;
  unformed_.erase(std::remove_if(unformed_.begin(), unformed_.end(),
                                 [formed](const auto& u) { return u.first <= formed; }),
                  unformed_.end());
}

void ElasticDriver::RefreshHolds(Worker& w) {
  if (w.holds || !w.joined) return;
  std::string v;
  auto said = store_->TryGet(ElasticHoldsKey(w.id), &v, Clock::now() + std::chrono::seconds(2));
  if (said.ok() && *said) w.holds = true;
}

// Training is over once every worker that joined a world has exited 0: workers started for a
// world that never formed (a host that appeared near the end) would wait for it until
// --elastic-timeout. Stop them; the job ends with 0.
void ElasticDriver::StopUnjoinedIfFinished() {
  RefreshFormed();
  for (const Worker& w : workers_) {
    if (w.alive && !w.retired && !w.leaving && w.joined) return;
  }
  for (Worker& w : workers_) {
    if (w.alive && !w.retired && !w.leaving) {  // (a leaving worker ends as the others did)
      Retire(w, "training finished before the world it was started for formed");
    }
  }
}

void ElasticDriver::CheckHung(TimePoint now) {
  if (now < next_hang_check_ || generation_ == 0) return;
  next_hang_check_ = now + std::chrono::milliseconds(500);
  RefreshFormed();
  std::vector<Worker*> stayed;
  std::string left_id, why;
  for (int w : world_) {
    Worker& worker = workers_[w];
    if (!worker.alive || worker.retired) continue;
    std::string v;
    auto left = store_->TryGet(ElasticLeftKey(generation_, worker.id), &v,
                               Clock::now() + std::chrono::seconds(2));
    if (!left.ok()) return;  // the store is ours: only a closing job gets here
    if (!*left) {
      stayed.push_back(&worker);
    } else if (left_id.empty()) {
      left_id = worker.id;
      why = v;
    }
  }
  if (left_id.empty()) return;
  if (first_left_ == TimePoint::max()) first_left_ = now;
  // Every member left, and none failed (step 6): nothing to wait for. Else the ones that
  // stayed have HVD_TIMEOUT_SECONDS + 5 s to leave too.
  if (!stayed.empty() && now - first_left_ < Seconds(options_.hang_seconds)) return;
  if (stayed.empty()) {
    first_left_ = TimePoint::max();
    // Fewer than --min-np: the workers that left wait for the world Tick forms once hosts
    // come, or the job fails at --elastic-timeout; their leaving is no failed world.
    if (waiting_since_ != TimePoint::max()) return;
    if (formed_ > retried_formed_) {
      retried_formed_ = formed_;
      retries_ = 0;
    }
    // The reason names the worker already where it is the worker's own ("worker X shut down
    // world N and asks for the next").
    const std::string who = "worker " + left_id;
    const std::string reason = why.rfind(who + " ", 0) == 0 ? why : who + ": " + why;
    if (++retries_ > kMaxRetries) {
      Fail(std::to_string(retries_) + " worlds in a row, the last world " +
           std::to_string(generation_) + ", were left by every worker without one forming (" +
           reason + ")");
      return;
    }
    Reform("every worker left world " + std::to_string(generation_) + "; " + reason,
           /*again=*/true);
    return;
  }
  for (Worker* w : stayed) {
    std::ostringstream os;
    os << "worker " << w->id << " has not left world " << generation_ << " "
       << options_.hang_seconds << " s after worker " << left_id << " did (" << why
       << "): it is hung (stopped or cut off); killing it";
    Say(os.str());
    supervisor_->Kill(w->pid);
  }
  first_left_ = TimePoint::max();
}

void ElasticDriver::Tick() {
  if (failed_ || finishing_) return;
  const auto now = Clock::now();
  CheckHung(now);
  bool changed = false;
  for (auto& [host, b] : blacklist_) {
    if (!b.back && now >= b.until) {
      b.back = true;
      Say("host " + host + " is back from its cool-down");
      changed = true;
    }
  }
  // Whether worker `w` is a member of the newest world, and that world has formed (it trains).
  auto trains_now = [this](const Worker& w) {
    return formed_ == generation_ &&
           std::find(world_.begin(), world_.end(), &w - workers_.data()) != world_.end();
  };
  if (!options_.discovery_script.empty() && PollDiscovery()) {
    changed = true;
    RefreshFormed();
    for (Worker& w : workers_) {
      if (!w.alive || w.retired || w.leaving || SlotsOf(w.host) > w.slot) continue;
      // A member of the newest world, which formed, leaves gracefully, as in Horovod: with
      // the others, at their next commit, without a rollback. Any other worker is stopped.
      if (!trains_now(w)) {
        Retire(w, "the discovery script no longer lists its slot");
        continue;
      }
      w.leaving = true;
      Say("the discovery script no longer lists the slot of worker " + w.id +
          ": it leaves with the others at their next state.commit() or check_host_updates() "
          "(HostsUpdatedInterrupt, no rollback)");
    }
  }
  // A leaving worker has no place in a world that formed without it (hvd.elastic.run exits
  // on that by itself): one still running then is stopped.
  for (Worker& w : workers_) {
    if (w.alive && w.leaving && !w.retired && formed_ == generation_ && !trains_now(w)) {
      Retire(w, "world " + std::to_string(generation_) + " formed without its slot");
    }
  }
  if (failed_) return;
  if (waiting_since_ != TimePoint::max() &&
      now - waiting_since_ >= Seconds(options_.elastic_timeout_seconds)) {
    int alive = 0;
    for (int w : world_) alive += workers_[w].alive && !workers_[w].retired;
    Fail("only " + std::to_string(alive) + " worker(s) left, fewer than --min-np " +
         std::to_string(options_.min_np) + ", for " +
         std::to_string(static_cast<int>(options_.elastic_timeout_seconds)) +
         " s (--elastic-timeout)");
    return;
  }
  if (changed || waiting_since_ != TimePoint::max()) Reform("hosts changed");
}

}  // namespace launcher
}  // namespace hvd
