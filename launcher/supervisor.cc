#include "supervisor.h"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <fcntl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace hvd {
namespace launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kDrainAfterExit = std::chrono::seconds(2);
constexpr auto kCauseWindow = std::chrono::seconds(1);
constexpr auto kGiveUpAfterKill = std::chrono::seconds(5);
constexpr auto kStoppedAtEndWait = std::chrono::seconds(5);  // NoteStoppedAtEnd

Clock::time_point After(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// Process `pid`'s state and process group, from /proc/<pid>/stat: "pid (comm) state ppid pgrp
// ...". False when it is gone (or unreadable).
bool ReadStat(const std::string& pid, char* state, long* pgrp) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return false;
  std::istringstream rest(stat.substr(paren + 1));
  long ppid = 0;
  return static_cast<bool>(rest >> *state >> ppid >> *pgrp);
}

// State T: SIGSTOP, SIGTSTP; t: a debugger.
bool Stopped(char state) { return state == 'T' || state == 't'; }

// Whether process `pid` is stopped.
bool ProcessStopped(pid_t pid) {
  char state = 0;
  long pgrp = 0;
  return ReadStat(std::to_string(pid), &state, &pgrp) && Stopped(state);
}

// The processes of process group `pgid` that are stopped.
std::vector<pid_t> StoppedInGroup(pid_t pgid) {
  std::vector<pid_t> stopped;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return stopped;
  while (dirent* d = ::readdir(proc)) {
    if (d->d_name[0] < '1' || d->d_name[0] > '9') continue;
    char state = 0;
    long pgrp = 0;
    if (!ReadStat(d->d_name, &state, &pgrp) || pgrp != pgid) continue;
    if (Stopped(state)) stopped.push_back(static_cast<pid_t>(std::atol(d->d_name)));
  }
  ::closedir(proc);
  return stopped;
}

// N of a failure note that says "hvd has been shut down (rank N called shutdown)" (the engine's
// words for another rank's shutdown, FinishShutdown); -1 for any other note.
int ShutdownCallerOf(const std::string& note) {
  const std::string lead = "hvd has been shut down (rank ";
  const size_t at = note.find(lead);
  if (at == std::string::npos) return -1;
  const size_t first = at + lead.size();
  const size_t end = note.find_first_not_of("0123456789", first);
  if (end == std::string::npos || end == first || end - first > 9 ||
      note.compare(end, 17, " called shutdown)") != 0) {
    return -1;
  }
  return std::atoi(note.c_str() + first);
}

}  // namespace

Supervisor::Supervisor(const SupervisorOptions& options, int signal_fd)
    : options_(options), signal_fd_(signal_fd) {}

void Supervisor::Say(const std::string& line) const {
  WriteAll(Console(STDERR_FILENO), "hvdrun: " + line + "\n");
}

void Supervisor::Verbose(const std::string& line) const {
  if (options_.verbose) Say(line);
}

// DIR/rank.N/<stream>, its folder created as needed (DIR itself was made before the job
// started: hvdrun_main.cc); -1 with a message when it cannot be.
int Supervisor::OutputFile(int rank, const char* stream) const {
  if (options_.output_dir.empty()) return -1;
  std::string n = std::to_string(rank);
  const size_t width = std::to_string(std::max(0, options_.ranks - 1)).size();
  if (n.size() < width) n.insert(0, width - n.size(), '0');
  const std::string dir = options_.output_dir + "/rank." + n;
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/" + stream;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Say("cannot write " + path + ": " + strerror(errno) + "; rank output goes to the console only");
  return fd;
}

void Supervisor::Add(RankProcess rank) {
  int r = rank.label >= 0 ? rank.label : rank.placement.rank;
  out_pumps_.push_back(std::make_unique<LinePump>(r, "stdout", Console(STDOUT_FILENO),
                                                  options_.prefix_output, OutputFile(r, "stdout"),
                                                  options_.prefix_timestamp));
  err_pumps_.push_back(std::make_unique<LinePump>(r, "stderr", Console(STDERR_FILENO),
                                                  options_.prefix_output, OutputFile(r, "stderr"),
                                                  options_.prefix_timestamp));
  const bool remote = rank.remote;
  {
    std::lock_guard<std::mutex> l(inputs_mu_);
    ranks_.push_back(rank);
  }
  if (remote && !ticker_.joinable()) ticker_ = std::thread([this] { TickRemotes(); });
}

Supervisor::~Supervisor() { StopTicker(); }

void Supervisor::TickRemotes() {
  std::unique_lock<std::mutex> l(inputs_mu_);
  while (!ticker_stop_) {
    for (const RankProcess& r : ranks_) {
      // Non-blocking (remote.cc): a full pipe, or ssh gone (EPIPE), skips this tick.
      if (r.remote && r.in_fd >= 0) (void)!::write(r.in_fd, ".", 1);
    }
    ticker_cv_.wait_for(l, std::chrono::seconds(1), [this] { return ticker_stop_; });
  }
}

void Supervisor::StopTicker() {
  {
    std::lock_guard<std::mutex> l(inputs_mu_);
    ticker_stop_ = true;
  }
  ticker_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

void Supervisor::Abort(int exit_code) {
  if (!exit_code_set_) {
    exit_code_ = exit_code;
    exit_code_set_ = true;
  }
  if (phase_ == Phase::kRunning || phase_ == Phase::kGrace) {
    SignalLiveGroups(SIGTERM);
    phase_ = Phase::kTerminating;
    phase_deadline_ = After(options_.kill_after_seconds);
  }
}

int Supervisor::Run() {
  while (true) {
    if (AllReaped()) {
      if (drain_deadline_ == TimePoint::max()) drain_deadline_ = Clock::now() + kDrainAfterExit;
      if (AllPipesClosed() || Clock::now() >= drain_deadline_) break;
    }
    if (phase_ == Phase::kKilled && Clock::now() >= phase_deadline_) {
      Say("some ranks did not exit after SIGKILL; giving up on them");
      break;
    }
    PollOnce();
    NoteStoppedAtEnd();
    AdvancePhase();
    if (events_ != nullptr && phase_ == Phase::kRunning) events_->Tick();
  }
  ClosePipes();
  StopLeftoverGroups();
  StopTicker();
  return exit_code_;
}

void Supervisor::PollOnce() {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, bool>> owners;  // (rank index, is stderr)
  fds.push_back(pollfd{signal_fd_, POLLIN, 0});
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i].out_fd >= 0) {
      fds.push_back(pollfd{ranks_[i].out_fd, POLLIN, 0});
      owners.emplace_back(i, false);
    }
    if (ranks_[i].err_fd >= 0) {
      fds.push_back(pollfd{ranks_[i].err_fd, POLLIN, 0});
      owners.emplace_back(i, true);
    }
  }
  int n = ::poll(fds.data(), fds.size(), NextTimeoutMs());
  if (n <= 0) return;  // timeout or EINTR: deadlines are checked by the caller
  for (size_t k = 1; k < fds.size(); ++k) {
    if (fds[k].revents == 0) continue;
    auto [i, is_err] = owners[k - 1];
    int& fd = is_err ? ranks_[i].err_fd : ranks_[i].out_fd;
    LinePump& pump = is_err ? *err_pumps_[i] : *out_pumps_[i];
    if (!pump.Pump(fd)) {
      pump.Flush();
      ::close(fd);
      fd = -1;
    }
  }
  if (fds[0].revents != 0) HandleSignals();
}

void Supervisor::NoteStoppedAtEnd() {
  if (stopped_noted_ || phase_ != Phase::kRunning || events_ != nullptr) return;
  const TimePoint now = Clock::now();
  if (now < next_stopped_check_) return;
  next_stopped_check_ = now + std::chrono::seconds(1);
  std::vector<const RankProcess*> left;
  for (const auto& r : ranks_) {
    if (!r.running) continue;
    if (r.remote || !ProcessStopped(r.pid)) {  // (the first that runs ends the look)
      stopped_since_ = TimePoint::max();
      return;
    }
    left.push_back(&r);
  }
  if (left.empty() || left.size() == ranks_.size()) {  // (a whole job stopped: its terminal's)
    stopped_since_ = TimePoint::max();
    return;
  }
  if (stopped_since_ == TimePoint::max()) stopped_since_ = now;
  if (now - stopped_since_ < kStoppedAtEndWait) return;
  stopped_noted_ = true;
  std::string who;
  for (size_t i = 0; i < left.size(); ++i) {
    who += std::string(i == 0 ? "" : i + 1 == left.size() ? " and " : ", ") + "rank " +
           std::to_string(left[i]->placement.rank) + " (pid " + std::to_string(left[i]->pid) + ")";
  }
  const bool one = left.size() == 1;
  Say(who + (one ? " is" : " are") + " stopped (state T: SIGSTOP, SIGTSTP or a debugger) and " +
      "every other rank has exited: hvdrun waits for " + (one ? "it" : "them") +
      " to go on and exit (SIGCONT to " + (one ? "it" : "them") +
      ", or SIGTERM to hvdrun, ends the wait)");
}

bool Supervisor::KeepStarting() {
  // A signal other than SIGCHLD waiting for the signalfd (every handled signal is blocked). A
  // rank's exit is left for Run, as before: the ranks after it are started all the same, so
  // that a job whose rank fails at once still has every rank to stop and report.
  sigset_t pending;
  sigemptyset(&pending);
  if (::sigpending(&pending) != 0) return true;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGCHLD || sigismember(&pending, sig) != 1) continue;
    HandleSignals();
    return false;
  }
  return true;
}

void Supervisor::HandleSignals() {
  signalfd_siginfo info;
  while (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      ReapChildren();
    } else {
      OnHvdrunSignal(sig);
    }
  }
  ReapChildren();  // SIGCHLDs coalesce; reaping is cheap
}

// Reaps every child that has ended. On a loaded machine hvdrun may run only after a rank was
// killed *and* the survivors, having noticed, exited with an error; waitpid then returns them
// in fork order, not in the order they ended. So among the ranks reaped together, one that a
// signal ended goes first: it is the cause, the others' errors are its effect.
void Supervisor::ReapChildren() {
  std::vector<std::pair<size_t, int>> ended;  // (rank index, wait status)
  while (true) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;  // none ready, or no children left
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].pid == pid && ranks_[i].running) ended.emplace_back(i, status);
    }
    // Other pids are orphans of ranks re-parented to hvdrun (the subreaper): just reaped.
  }
  for (RankProcess& r : ranks_) {
    if (!r.running && !r.group_gone) r.group_gone = ForgetGroupIfGone(r.pid);
  }
  std::stable_partition(ended.begin(), ended.end(),
                        [](const std::pair<size_t, int>& e) { return WIFSIGNALED(e.second); });
  for (const auto& e : ended) OnRankExit(e.first, e.second);
}

void Supervisor::OnRankExit(size_t index, int status) {
  RankProcess& r = ranks_[index];
  r.running = false;
  r.wait_status = status;
  CloseInput(&r);
  std::string who = (r.label >= 0 ? "worker " + std::to_string(r.label)
                                   : "rank " + std::to_string(r.placement.rank)) +
                    (r.remote ? " on host " + r.placement.host + " (ssh pid "
                              : " (pid ") + std::to_string(r.pid) + ")";
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::string what;
  int code = 0;
  if (WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    what = who + " exited with code " + std::to_string(code);
    // Through ssh a signal arrives as the shell's 128+N; 255 is ssh's own failure.
    if (r.remote && code > 128 && code < 128 + 65) {
      what += " (128+" + std::to_string(code - 128) + ": " + SignalName(code - 128) +
              " on that host)";
    } else if (r.remote && code == 255) {
      what += " (ssh failed or lost the connection: the host is down or cut off, or its sshd "
              "went; the rank stops there by itself once hvdrun's ticks no longer reach it)";
      ssh_lost_hosts_.insert(r.placement.host);
    }
  } else {
    code = 128 + WTERMSIG(status);
    what = who + " was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           SignalName(WTERMSIG(status)) + ")";
  }
  // In the grace period hvdrun has signalled no rank yet: this signal came from outside.
  if (!ok && phase_ == Phase::kGrace && first_failed_ >= 0) {
    const bool killed = WIFSIGNALED(status) && !first_failed_by_signal_ && !first_failed_own_ &&
                        Clock::now() < first_failed_at_ + kCauseWindow;
    // The first failure followed another rank's, and this rank's is its own.
    std::string note;
    bool started = false;
    const bool own = first_failed_follows_ && NoteOf(r, &note, &started) && note.empty();
    if (killed || own) {
      first_failed_ = static_cast<int>(index);
      first_failed_by_signal_ = WIFSIGNALED(status);
      first_failed_follows_ = false;
      first_failed_own_ = !killed && started;
      exit_code_ = code;
      Say(what + (killed ? ", just before the failure above: the likely cause"
                         : ": the likely cause of the failure above, which followed it"));
      return;
    }
  }
  // A copy: the events may start ranks, which moves ranks_ (and `r` with it).
  const RankProcess ended = r;
  if (events_ != nullptr && phase_ == Phase::kRunning && !exit_code_set_ &&
      events_->OnRankExit(ended, ok, what)) {
    return;
  }
  if (ok || exit_code_set_ || phase_ != Phase::kRunning) {
    // A lost ssh connection is said whenever it comes: hvdrun cannot stop that rank itself.
    if (!ok && r.remote && WIFEXITED(status) && code == 255) {
      Say(what);
      NameLostLink();
    } else {
      Verbose(what);
    }
    if (ok && phase_ == Phase::kGrace) NameShutdownCaller();
    return;
  }
  first_failed_ = static_cast<int>(index);
  first_failed_at_ = Clock::now();
  first_failed_by_signal_ = WIFSIGNALED(status);
  exit_code_ = code;
  exit_code_set_ = true;
  std::string note;
  bool started = false;
  if (!WIFSIGNALED(status)) NoteOf(r, &note, &started);
  first_failed_follows_ = !note.empty();
  first_failed_own_ = note.empty() && started;
  // The engine's stall shutdown (coordinator.cc) is no rank's failure: it names the late ranks.
  const bool stall = note.find("hvd shut down: ") != std::string::npos;
  Say(note.empty() ? what
                   : what + (stall ? ", after hvd's stall shutdown ended the job there: "
                                   : ", after another rank's failure ended hvd there: ") +
                         note);
  NameStoppedRanks();
  if (first_failed_own_) NameAbsentRanks();
  shutdown_caller_ = ShutdownCallerOf(note);
  NameShutdownCaller();
  if (r.remote && WIFEXITED(status) && code == 255) NameLostLink();
  phase_ = Phase::kGrace;
  phase_deadline_ = After(options_.grace_seconds);
  if (!AllReaped()) {
    Verbose("giving the other ranks " + std::to_string(options_.grace_seconds) +
            " s to finish before stopping them");
  }
}

// A rank frozen by a stop signal fails the others by its silence: they exit with errors that
// name it (after HVD_TIMEOUT_SECONDS), and it would exit only once hvdrun kills it. Named when
// the first failure comes, so that the summary points at it rather than at the survivor that
// exited first. Local ranks only: a remote rank's processes are not visible here.
void Supervisor::NameStoppedRanks() const {
  for (const auto& r : ranks_) {
    if (!r.running || r.remote) continue;
    const std::vector<pid_t> stopped = StoppedInGroup(r.pid);
    if (stopped.empty()) continue;
    const std::string who = r.label >= 0 ? "worker " + std::to_string(r.label)
                                         : "rank " + std::to_string(r.placement.rank);
    Say(who + " (pid " + std::to_string(r.pid) + ") is stopped (" +
        (stopped.front() == r.pid ? std::string("its process")
                                  : "pid " + std::to_string(stopped.front()) + " of its group") +
        " is in state T: SIGSTOP, SIGTSTP or a debugger): it stopped answering the other "
        "ranks, the likely cause of the failure above");
  }
}

// The first failure followed another rank's shutdown ("hvd has been shut down (rank N called
// shutdown)"): rank N returned or exited while the others still waited for it in a collective.
// Its exit code of 0 is no failure, so it would go unnamed; it is named once it has exited with
// 0 (before the first failure or in the grace period after it), as the likely cause.
void Supervisor::NameShutdownCaller() {
  if (shutdown_caller_ < 0 || shutdown_caller_named_ || events_ != nullptr) return;
  for (const auto& r : ranks_) {
    if (r.label >= 0 || r.placement.rank != shutdown_caller_ || r.running) continue;
    if (!WIFEXITED(r.wait_status) || WEXITSTATUS(r.wait_status) != 0) return;
    shutdown_caller_named_ = true;
    Say("rank " + std::to_string(r.placement.rank) +
        (r.remote ? " on host " + r.placement.host + " (ssh pid " : " (pid ") +
        std::to_string(r.pid) +
        ") exited with code 0 while the others still ran collectives, and its exit shut hvd "
        "down on them: the likely cause of the failure above");
  }
}

// Every remote host's ssh connection was lost: what they have in common is hvdrun's side of
// the network, not one of those hosts (said once, with two hosts or more).
void Supervisor::NameLostLink() {
  if (lost_link_named_) return;
  std::set<std::string> remote;
  for (const auto& r : ranks_) {
    if (r.remote) remote.insert(r.placement.host);
  }
  if (remote.size() < 2 || ssh_lost_hosts_ != remote) return;
  lost_link_named_ = true;
  std::string hosts;
  for (const auto& h : remote) hosts += (hosts.empty() ? "" : ", ") + h;
  Say("the ssh connections to every remote host were lost (" + hosts +
      "): the likely cause is hvdrun's own host or its link to them, rather than any one of "
      "them");
}

// The first failure came from a rank that had reached the rendezvous, and so failed in its
// init (whose end needs every rank there), at least the start timeout into the job: ranks
// still running that never reached it made it wait that timeout out. Named, or the summary
// would point at the rank that gave up first (hvd's own message names them too, on every rank
// that waited).
void Supervisor::NameAbsentRanks() const {
  // (Every rank's start timeout counts from its init, after hvdrun started it.)
  if (options_.start_timeout_seconds <= 0 ||
      Clock::now() - created_ < std::chrono::duration<double>(options_.start_timeout_seconds)) {
    return;
  }
  // Still running, and gone already (an exit of 0: a failing one would be the first failure).
  std::vector<std::string> absent, left;
  for (const auto& r : ranks_) {
    std::string note;
    bool started = true;
    if (!NoteOf(r, &note, &started) || started) continue;
    (r.running ? absent : left)
        .push_back(std::to_string(r.placement.rank) +
                   (r.remote ? " on host " + r.placement.host : std::string()));
  }
  auto list = [](const std::vector<std::string>& ranks) {
    std::string text = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size() && i < 8; ++i) text += (i ? ", " : "") + ranks[i];
    if (ranks.size() > 8) text += " and " + std::to_string(ranks.size() - 8) + " more";
    return text;
  };
  const std::string waited = "the likely cause of the failure above, which waited "
                             "--start-timeout for ";
  if (!absent.empty()) {
    Say(list(absent) + (absent.size() == 1 ? " is" : " are") +
        " still running but never reached the rendezvous (hvd's init not called yet, failed "
        "before it connected, or stuck before it): " + waited +
        (absent.size() == 1 ? "it" : "them"));
  }
  if (!left.empty()) {
    Say(list(left) + " exited without having reached the rendezvous (hvd's init never "
        "called): " + waited + (left.size() == 1 ? "it" : "them"));
  }
}

// The rank's failure note, its first line and at most 400 characters.
bool Supervisor::NoteOf(const RankProcess& r, std::string* note, bool* started) const {
  note->clear();
  bool joined = false;
  if (started != nullptr) *started = false;
  if (!notes_ || r.label >= 0 || !notes_(r.placement.rank, note, &joined)) return false;
  if (started != nullptr) *started = joined;
  *note = note->substr(0, note->find('\n'));
  if (note->size() > 400) *note = note->substr(0, 397) + "...";
  return true;
}

void Supervisor::OnHvdrunSignal(int sig) {
  StopWaitingForConsole();  // a reader that stopped reading holds the stop back no more
  if (!exit_code_set_) {
    exit_code_ = 128 + sig;
    exit_code_set_ = true;
  }
  if (phase_ == Phase::kRunning || phase_ == Phase::kGrace) {
    Say("received " + SignalName(sig) + ", stopping all ranks");
    SignalLiveGroups(SIGTERM);
    phase_ = Phase::kTerminating;
    phase_deadline_ = After(options_.kill_after_seconds);
  } else if (phase_ == Phase::kTerminating) {
    Say("received " + SignalName(sig) + " again, killing all ranks");
    SignalLiveGroups(SIGKILL);
    phase_ = Phase::kKilled;
    phase_deadline_ = Clock::now() + kGiveUpAfterKill;
  }
}

void Supervisor::Stop(pid_t pid) {
  for (auto& r : ranks_) {
    if (r.pid != pid || !r.running) continue;
    if (r.remote && r.in_fd >= 0) {
      CloseInput(&r);
    } else {
      if (::killpg(r.pid, SIGTERM) != 0) ::kill(r.pid, SIGTERM);
      // A stopped worker acts on SIGTERM only once continued (as in SignalLiveGroups).
      if (::killpg(r.pid, SIGCONT) != 0) ::kill(r.pid, SIGCONT);
    }
  }
}

void Supervisor::Kill(pid_t pid) {
  for (auto& r : ranks_) {
    if (r.pid == pid && r.running && ::killpg(r.pid, SIGKILL) != 0) ::kill(r.pid, SIGKILL);
  }
}

void Supervisor::CloseInput(RankProcess* r) {
  std::lock_guard<std::mutex> l(inputs_mu_);
  if (r->in_fd < 0) return;
  ::close(r->in_fd);
  r->in_fd = -1;
}

// A remote rank is stopped by closing its ssh's stdin: the watcher on that host sends SIGTERM
// and, after kill_after_seconds, SIGKILL to the rank's group (remote.h). SIGKILL (or a second
// SIGTERM) goes to the local ssh client, which drops the connection; the watcher still acts.
void Supervisor::SignalLiveGroups(int sig) {
  for (auto& r : ranks_) {
    if (!r.running) continue;
    if (r.remote && sig == SIGTERM && r.in_fd >= 0) {
      Verbose("stopping rank " + std::to_string(r.placement.rank) + " on host " +
              r.placement.host + " (closing its ssh input)");
      CloseInput(&r);
      continue;
    }
    Verbose("sending " + SignalName(sig) + " to rank " + std::to_string(r.placement.rank) +
            " (process group " + std::to_string(r.pid) + ")");
    if (::killpg(r.pid, sig) != 0) ::kill(r.pid, sig);
    // A stopped process acts on SIGTERM only once continued: without this a frozen rank would
    // wait for the SIGKILL kill_after_seconds later.
    if (sig == SIGTERM && ::killpg(r.pid, SIGCONT) != 0) ::kill(r.pid, SIGCONT);
  }
}

void Supervisor::AdvancePhase() {
  if (Clock::now() < phase_deadline_ || AllReaped()) return;
  if (phase_ == Phase::kGrace) {
    Verbose("grace period over");
    SignalLiveGroups(SIGTERM);
    phase_ = Phase::kTerminating;
    phase_deadline_ = After(options_.kill_after_seconds);
  } else if (phase_ == Phase::kTerminating) {
    for (const auto& r : ranks_) {
      if (!r.running) continue;
      std::ostringstream os;
      os << "rank " << r.placement.rank;
      if (r.remote) {
        os << " on host " << r.placement.host << " did not stop within "
           << options_.kill_after_seconds
           << " s of being asked (the rank is stopped or ignores SIGTERM, or its host is down "
              "or cut off); ending its ssh connection";
      } else {
        os << " did not exit within " << options_.kill_after_seconds
           << " s of SIGTERM; sending SIGKILL";
      }
      Say(os.str());
    }
    SignalLiveGroups(SIGKILL);
    phase_ = Phase::kKilled;
    phase_deadline_ = Clock::now() + kGiveUpAfterKill;
  }
}

int Supervisor::NextTimeoutMs() const {
  TimePoint next = std::min(phase_deadline_, drain_deadline_);
  auto now = Clock::now();
  if (next == TimePoint::max()) return 1000;
  if (next <= now) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  return static_cast<int>(std::min<long long>(ms, 1000));
}

bool Supervisor::AllReaped() const {
  return std::none_of(ranks_.begin(), ranks_.end(), [](const RankProcess& r) { return r.running; });
}

bool Supervisor::AllPipesClosed() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const RankProcess& r) { return r.out_fd < 0 && r.err_fd < 0; });
}

void Supervisor::ClosePipes() {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    for (bool is_err : {false, true}) {
      int& fd = is_err ? ranks_[i].err_fd : ranks_[i].out_fd;
      if (fd < 0) continue;
      LinePump& pump = is_err ? *err_pumps_[i] : *out_pumps_[i];
      pump.Pump(fd);
      pump.Flush();
      ::close(fd);
      fd = -1;
    }
    CloseInput(&ranks_[i]);
  }
}

// Processes the ranks left behind in their process groups (background children): SIGTERM,
// up to one second to go, then SIGKILL; orphans re-parented to hvdrun are reaped.
void Supervisor::StopLeftoverGroups() {
  auto any_left = [this] {
    ReapChildren();
    bool left = false;
    for (const auto& r : ranks_) left = left || (!r.group_gone && ::killpg(r.pid, 0) == 0);
    return left;
  };
  // A group seen empty is skipped: its number may belong to someone else by now.
  if (!any_left()) return;
  Verbose("stopping processes left behind by the ranks");
  for (const auto& r : ranks_) {
    if (!r.group_gone) ::killpg(r.pid, SIGTERM);
  }
  for (int i = 0; i < 20 && any_left(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!any_left()) return;
  for (const auto& r : ranks_) {
    if (!r.group_gone) ::killpg(r.pid, SIGKILL);
  }
  for (int i = 0; i < 20 && any_left(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace launcher
}  // namespace hvd
