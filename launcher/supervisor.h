// The supervisor loop of hvdrun: forwards the ranks' output, reaps them, and applies the
// failure policy.
//
//   1. Running: poll the ranks' pipes and a signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP).
//   2. The first rank that exits non-zero or by a signal is named on stderr; its code becomes
//      hvdrun's (128+signal for a signal). The others get grace_seconds to finish and report
//      their own errors. A rank killed by a signal from outside within kCauseWindow after a
//      first failure that was a plain error exit takes its place: on a loaded machine the
//      survivors of a SIGKILL may exit before the killed process is reapable. So does, when
//      the first failure left a failure note (another rank's failure ended hvd there:
//      FailureNotes), a rank that fails in the grace period without one: a rank whose
//      script raised shuts hvd down, and the others, failing on that, often exit first. A
//      local rank found stopped (SIGSTOP, a debugger) at that moment is named as the likely
//      cause.
//   3. Then SIGTERM to every live rank's process group; after kill_after_seconds, SIGKILL.
//      A remote rank's "SIGTERM" is the closing of its ssh's stdin (see remote.h); its
//      "SIGKILL" goes to the local ssh client.
//   4. SIGINT/SIGTERM/SIGHUP to hvdrun go straight to step 3 and hvdrun exits 128+signal;
//      a second such signal skips to SIGKILL.
//   5. Once every rank is reaped (and their pipes drained, bounded), whatever is left in the
//      ranks' process groups is stopped (SIGTERM, then SIGKILL) so no process outlives hvdrun.
// Every wait in the loop has a deadline.
//
// Thread-safety: one thread (hvdrun's main thread).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "output.h"
#include "spawn.h"

namespace hvd {
namespace launcher {

// What an elastic job does with rank exits (launcher/elastic.h); null for a plain job.
class RankEvents {
 public:
  virtual ~RankEvents() = default;
  // A rank exited while the job runs (`what` says how). Returning true takes the exit: the
  // supervisor neither counts it as the job's failure nor stops the other ranks.
  virtual bool OnRankExit(const RankProcess& r, bool ok, const std::string& what) = 0;
  // Called every round of the loop (at least once a second); may Add or Stop ranks, or Abort.
  virtual void Tick() = 0;
};

struct SupervisorOptions {
  double grace_seconds = 3.0;
  double kill_after_seconds = 5.0;
  bool prefix_output = true;
  bool prefix_timestamp = false;
  bool verbose = false;
  // --output-filename: each rank's output also goes to DIR/rank.N/{stdout,stderr}, N padded
  // with zeros to the width of the largest rank (`ranks`).
  std::string output_dir;
  int ranks = 1;
  // The ranks' --start-timeout: a failure before it has passed since the start is not one
  // of waiting for a rank at the rendezvous (NameAbsentRanks); 0: unknown, never named.
  double start_timeout_seconds = 0;
};

class Supervisor {
 public:
  // Takes the signalfd from SetUpSignals (not owned). Ranks are added as they start.
  Supervisor(const SupervisorOptions& options, int signal_fd);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  void Add(RankProcess rank);
  // Elastic jobs: exits go to `events` first, and its Tick runs every round (not owned).
  void SetEvents(RankEvents* events) { events_ = events; }
  // Sets *note to what a rank left before it failed because another rank's failure ended hvd
  // there (bootstrap/store.h, FailureNoteKey), empty when it left none, and *started to whether
  // its hvd had joined the job (its address is in the store); false when the store cannot be
  // read.
  using FailureNotes = std::function<bool(int rank, std::string* note, bool* started)>;
  void SetFailureNotes(FailureNotes notes) { notes_ = std::move(notes); }
  // Stops one rank (SIGTERM to its group; a remote rank's ssh input is closed), as step 3 does
  // for every rank.
  void Stop(pid_t pid);
  // SIGKILL to one rank's group (a remote rank: to its local ssh client).
  void Kill(pid_t pid);
  // Stops the ranks started so far (a later rank could not be started) with `exit_code`.
  void Abort(int exit_code);
  // Between two ranks' starts: acts on a signal to hvdrun (SIGTERM, SIGINT, ...) without
  // waiting. False once one came: start no more, Run stops the ranks started.
  bool KeepStarting();
  // Runs until every rank has exited; returns hvdrun's exit code.
  int Run();

 private:
  using TimePoint = std::chrono::steady_clock::time_point;

  enum class Phase { kRunning, kGrace, kTerminating, kKilled };

  void PollOnce();
  void HandleSignals();
  void ReapChildren();
  void OnRankExit(size_t index, int status);
  void NameStoppedRanks() const;
  void NameAbsentRanks() const;
  void NameShutdownCaller();
  void NameLostLink();
  // Every rank still running is stopped (state T), the others have exited with success: the
  // job would wait for them without a word. Said once, after 5 s of it.
  void NoteStoppedAtEnd();
  bool NoteOf(const RankProcess& r, std::string* note, bool* started = nullptr) const;
  void OnHvdrunSignal(int sig);
  void SignalLiveGroups(int sig);
  void CloseInput(RankProcess* r);
  // Remote ranks' liveness (remote.h): a byte to each remote rank's ssh input every second,
  // from a thread of its own, so that a main loop held up (its output blocked) does not stop
  // the ranks; their watchers stop them once the bytes stop for the silence limit.
  void TickRemotes();
  void StopTicker();
  void AdvancePhase();
  int NextTimeoutMs() const;
  bool AllReaped() const;
  bool AllPipesClosed() const;
  void ClosePipes();
  void StopLeftoverGroups();
  void Say(const std::string& line) const;
  int OutputFile(int rank, const char* stream) const;
  void Verbose(const std::string& line) const;

  SupervisorOptions options_;
  int signal_fd_;
  RankEvents* events_ = nullptr;
  TimePoint created_ = std::chrono::steady_clock::now();
  std::vector<RankProcess> ranks_;  // grown and in_fd changed under inputs_mu_ (the ticker)
  std::mutex inputs_mu_;
  std::condition_variable ticker_cv_;
  bool ticker_stop_ = false;  // guarded by inputs_mu_
  std::thread ticker_;
  std::vector<std::unique_ptr<LinePump>> out_pumps_;
  std::vector<std::unique_ptr<LinePump>> err_pumps_;
  Phase phase_ = Phase::kRunning;
  TimePoint phase_deadline_ = TimePoint::max();
  TimePoint drain_deadline_ = TimePoint::max();
  int first_failed_ = -1;  // index into ranks_
  TimePoint first_failed_at_ = TimePoint::max();
  bool first_failed_by_signal_ = false;
  bool first_failed_follows_ = false;  // it left a failure note: another rank failed first
  // Its hvd had joined the job and it left no note: its failure was its own, which a signal
  // death just after does not take over (the signal is more likely its consequence).
  bool first_failed_own_ = false;
  std::set<std::string> ssh_lost_hosts_;  // remote hosts with a rank whose ssh exited 255
  bool lost_link_named_ = false;
  int shutdown_caller_ = -1;  // the rank whose shutdown the first failure's note names
  bool shutdown_caller_named_ = false;
  FailureNotes notes_;
  int exit_code_ = 0;
  bool exit_code_set_ = false;
  TimePoint next_stopped_check_ = TimePoint::min();
  TimePoint stopped_since_ = TimePoint::max();
  bool stopped_noted_ = false;
};

}  // namespace launcher
}  // namespace hvd
