// Starting ranks: the per-rank environment, fork/exec into a process group of its own with
// stdout and stderr on pipes, and the signal set-up hvdrun needs to supervise them.
//
// Thread-safety: call from hvdrun's main thread only (fork, signal masks).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "hosts.h"

namespace hvd {
namespace launcher {

// What every rank of the job shares.
struct JobEnvironment {
  std::string rendezvous_addr;
  int rendezvous_port = 0;
  std::string secret;
  std::map<std::string, std::string> knobs;
};

// A started rank. pid is also its process group id. For a rank on a remote host, pid is the
// local ssh client that runs it there (see remote.h).
struct RankProcess {
  Placement placement;
  pid_t pid = -1;
  bool remote = false;
  int in_fd = -1;   // remote ranks: write end of ssh's stdin; closing it stops the rank
  int out_fd = -1;  // read end of the rank's stdout pipe (non-blocking), -1 once closed
  int err_fd = -1;  // read end of the rank's stderr pipe (non-blocking), -1 once closed
  bool running = false;
  int wait_status = 0;  // from waitpid, valid once !running
  int label = -1;       // the [N] of its output lines; -1: placement.rank
  bool group_gone = false;  // !running, and no process is left in its group
};

// 32 random bytes from /dev/urandom as 64 hex digits. Throws std::runtime_error.
std::string RandomSecret();

// The contract variables and knobs of this rank.
std::map<std::string, std::string> ContractVariables(const Placement& p, const JobEnvironment& job);

// hvdrun's own environment with the contract variables and knobs of this rank set.
std::vector<std::string> RankEnvironment(const Placement& p, const JobEnvironment& job);

// The absolute path of `program` (searched on PATH when it has no '/'). Throws LaunchError
// "command not found" when there is none.
std::string ResolveProgram(const std::string& program);

// Blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP (call before any thread starts, so every thread
// inherits the mask), ignores SIGPIPE, makes hvdrun the subreaper of the ranks' children, starts
// the watchdog that stops the ranks' process groups should hvdrun be killed (SIGTERM, SIGKILL
// kill_after_seconds later), and returns a signalfd for the blocked signals. Throws
// std::runtime_error.
int SetUpSignals(double kill_after_seconds);

// The watchdog stops process group `pgid` too, should hvdrun be killed (SpawnRank's ranks are
// watched already).
void WatchGroup(pid_t pgid);

// Once process group `pgid` (a rank's, or one given to WatchGroup) has no process left, the
// watchdog forgets it (its number may be reused); returns whether it was gone.
bool ForgetGroupIfGone(pid_t pgid);
// hvdrun SIGKILLed every process of group `pgid` itself: the watchdog forgets it now, though
// its processes may not be reaped yet (else, hvdrun ending meanwhile, the watchdog found the
// group alive, said hvdrun was gone and stopped what was left of it).
void ForgetKilledGroup(pid_t pgid);

// Forks and execs `command` (command[0] already resolved) as one rank. The child gets its own
// process group, stdin from `stdin_fd` (not owned; -1: /dev/null), default signal handling,
// and `env`. When exec fails the child exits with 127 and the reason is printed here. Throws
// std::runtime_error when fork or pipe fail.
RankProcess SpawnRank(const Placement& p, const std::vector<std::string>& command,
                      const std::vector<std::string>& env, double start_timeout_seconds,
                      int stdin_fd = -1);

}  // namespace launcher
}  // namespace hvd
