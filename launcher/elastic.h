// hvdrun's elastic mode (--min-np, --max-np, --host-discovery-script), as Horovod Elastic's
// driver: a rank that fails no longer ends the job while at least min-np ranks can go on.
// The workers' side is core/src/bootstrap/elastic.h; docs/ELASTIC.md has the whole picture.
//
//   1. Start: wait (up to --elastic-timeout) until the usable hosts have -np slots, then start a
//      worker on every usable slot up to --max-np and publish world 1.
//   2. A worker that fails (exits non-zero or is killed): its host is blacklisted: for good,
//      or with --blacklist-cooldown-range MIN MAX for MIN s, doubling with each failure up to
//      MAX s. The other workers on that host are stopped. Then step 4.
//   3. Every second the discovery script is run (its output, "host" or "host:slots" lines, is
//      the set of usable hosts). A removed host's workers are stopped, then step 4. New slots
//      (an added host, a host back from the blacklist) go to step 4 when the world may grow.
//   4. A new world: the surviving workers keep their order (so rank 0 is a worker that holds
//      the committed state), new workers are started on free slots up to --max-np, and the
//      world is published under the next generation. Survivors learn of it from a failed
//      operation (PeerLost) or from the commit's check for host updates, reset, and join it.
//      With fewer than --min-np workers possible, no world is published; the job fails once
//      that lasts --elastic-timeout seconds. --reset-limit bounds the number of new worlds.
//   5. A worker that exits 0 ends the elastic phase: from then on the job ends as a plain one.
//   6. A worker whose world broke, or never formed, or that shut its engine down and asks for
//      the next world (hvd.elastic.run's reset), says so in the store (elastic/left/<g>/<id>).
//      A worker of the current world that has not, hang_seconds after another has, is hung
//      (SIGSTOPped, cut off, deadlocked): it is killed and handled as in step 2. When every
//      member has left and none failed (a world that timed out forming, a link that broke and
//      healed, an error raised on every rank with no peer lost), nothing else would start a
//      new world: step 4 runs at once with the same workers, and after kMaxRetries such worlds
//      in a row without one forming the job fails, saying why the last did not.
//
// Thread-safety: one thread (hvdrun's supervisor loop).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/store.h"
#include "hosts.h"
#include "spawn.h"
#include "supervisor.h"

namespace hvd {
namespace launcher {

struct ElasticOptions {
  int np = 1;
  int min_np = 1;
  int max_np = 0;  // 0: no bound
  std::vector<HostSlots> hosts;       // -H / --hostfile, used when there is no script
  std::string discovery_script;       // --host-discovery-script
  int slots_per_host = 1;             // for discovered hosts printed without ":slots"
  double elastic_timeout_seconds = 600;
  int reset_limit = -1;               // -1: no bound
  double cooldown_min_seconds = 0;    // 0: a failing host stays blacklisted
  double cooldown_max_seconds = 0;
  double discovery_interval_seconds = 1.0;
  // A worker that has not left its world this long after another worker did is hung (stopped,
  // cut off): it is killed, and fails as in step 2. The ranks' HVD_TIMEOUT_SECONDS + 5.
  double hang_seconds = 35;
  bool verbose = false;
};

// Parses the discovery script's output: one "host" or "host:slots" per line; blank lines and
// '#' comments are skipped. Throws LaunchError naming the line.
std::vector<HostSlots> ParseDiscoveredHosts(const std::string& text, int slots_per_host);

// One run of the discovery script, under /bin/sh in a process group of its own, watched
// without blocking: hvdrun's loop goes on (ranks' output, deaths, signals) while a slow script
// runs, as Horovod's discovery thread lets it. The script's own process is reaped by whoever
// reaps hvdrun's children (the supervisor): its exit status comes through a pipe of its own.
class DiscoveryRun {
 public:
  DiscoveryRun(const std::string& script, double timeout_seconds);  // throws LaunchError
  ~DiscoveryRun();  // kills the script's group if it still runs
  DiscoveryRun(const DiscoveryRun&) = delete;
  DiscoveryRun& operator=(const DiscoveryRun&) = delete;

  // Reads what is there, waiting at most `wait_ms`. True once the run is over: Result() then
  // returns the output, or throws LaunchError (its exit status, or "did not finish").
  bool Poll(int wait_ms);
  std::string Result() const;
  // Waits for the script's shell once Poll said the run is over. Only where nothing else reaps
  // hvdrun's children (before the supervisor runs): else the supervisor reaps it.
  void Reap();

 private:
  // SIGKILLs the script's group while its shell runs, and has the watchdog forget it.
  void Kill();

  std::string script_;
  double timeout_seconds_;
  pid_t pid_ = -1;
  int out_fd_ = -1, status_fd_ = -1;  // -1 once at their end
  std::string out_, status_;
  std::chrono::steady_clock::time_point deadline_;
  bool timed_out_ = false;
  bool forgotten_ = false;  // the watchdog was told to forget the group (hvdrun killed it)
};

// Runs `script` with /bin/sh, waiting at most `timeout_seconds`. Returns its output, or throws
// LaunchError with its exit status or "timed out" (the script is killed then).
std::string RunDiscoveryScript(const std::string& script, double timeout_seconds);

// The world of a generation as published in the store: lines "<id> <host>" in rank order.
std::string WorldText(const std::vector<std::pair<std::string, std::string>>& ids_and_hosts);

class ElasticDriver : public RankEvents {
 public:
  // Starts one worker: its first placement, its id (HVD_ELASTIC_ID) and its output label.
  using StartFn = std::function<RankProcess(const Placement&, const std::string& id, int label)>;

  ElasticDriver(const ElasticOptions& options, Supervisor* supervisor,
                std::unique_ptr<StoreClient> store, StartFn start);

  // Step 1. Returns false, after saying why, when the job cannot start.
  bool Start();

  bool OnRankExit(const RankProcess& r, bool ok, const std::string& what) override;
  void Tick() override;

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Worker {
    std::string id;
    std::string host;
    int slot = 0;
    pid_t pid = -1;
    bool alive = true;
    bool retired = false;  // stopped by hvdrun (host blacklisted or removed): its exit is no failure
    // Its slot left the discovery script's output while it trained in a world that formed: the
    // next world leaves it out, and it leaves with the others at their next commit (Horovod's
    // HostsUpdatedInterrupt, no rollback). Its exit is no failure either; hvdrun stops it once
    // a world without it has formed.
    bool leaving = false;
    // A member of a world that formed. A worker started for a world that never formed holds
    // no state.
    bool joined = false;
    // It holds the job's state: a member of the first world that formed (the initial state),
    // or a worker that said it took the state rank 0 broadcast, or reached a commit
    // (ElasticHoldsKey). A new worker whose world formed but whose rank 0 died before the
    // broadcast reached it holds only the initial state.
    bool holds = false;
  };
  struct Blacklisted {
    int failures = 0;
    TimePoint until = TimePoint::max();
    bool back = false;  // its cool-down is over, and that was acted on
  };

  bool Discover(bool first);
  // Worker::holds from the worker's word in the store, where it has not been seen yet.
  void RefreshHolds(Worker& w);
  bool TakeHosts(const std::string& output, bool first);
  bool DiscoveryFailed(const LaunchError& e, bool first);
  bool PollDiscovery();
  bool Usable(const std::string& host) const;
  int SlotsOf(const std::string& host) const;
  std::vector<std::pair<std::string, int>> FreeSlots() const;
  void Retire(Worker& w, const std::string& why);
  void Blacklist(const std::string& host);
  // again: publish a new world even with the same workers (every member left the last).
  void Reform(const std::string& why, bool again = false);
  std::vector<int> Order(const std::vector<int>& keep, const std::vector<int>& added) const;
  bool Publish(const std::vector<int>& world);
  bool StartWorkers(const std::vector<int>& added, const std::vector<int>& world);
  void Fail(const std::string& why);
  void CheckHung(TimePoint now);
  void RefreshFormed();
  void StopUnjoinedIfFinished();
  void Say(const std::string& line) const;

  ElasticOptions options_;
  Supervisor* supervisor_;  // not owned; outlives the driver
  std::unique_ptr<StoreClient> store_;
  StartFn start_;
  std::unique_ptr<DiscoveryRun> discovery_;  // the script's run in progress (Tick)
  std::vector<HostSlots> hosts_;  // usable hosts before the blacklist, in discovery order
  std::map<std::string, Blacklisted> blacklist_;
  std::vector<Worker> workers_;   // every worker ever started, by label
  std::vector<int> world_;        // labels of the current world, in rank order
  int64_t generation_ = 0;
  int64_t formed_ = 0;  // the newest generation known to have formed (its members joined)
  // How the workers of the newest world that failed ended ("worker 1 (pid 8) exited with code
  // 1"), for the message that ends a job whose every worker failed.
  std::vector<std::string> world_failures_;
  // Published worlds not yet seen to form, newer than formed_: a world may still form after a
  // newer one is published (its workers were all ready just before).
  std::vector<std::pair<int64_t, std::vector<int>>> unformed_;
  int resets_ = 0;
  bool stopped_ = false;  // a signal came while Start waited for the discovery script
  bool finishing_ = false;  // a worker exited 0
  bool failed_ = false;
  TimePoint waiting_since_ = TimePoint::max();  // fewer than min-np possible since then
  TimePoint next_discovery_;
  TimePoint next_hang_check_;
  TimePoint first_left_ = TimePoint::max();  // when a worker of world_ first left it
  // Worlds published again because every member left (step 6), since formed_ was
  // retried_formed_; more than kMaxRetries in a row fail the job.
  static constexpr int kMaxRetries = 3;
  int retries_ = 0;
  int64_t retried_formed_ = 0;
};

}  // namespace launcher
}  // namespace hvd
