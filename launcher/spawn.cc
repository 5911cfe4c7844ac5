#include "spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>
#include <stdexcept>

#include "bootstrap/auth.h"
#include "common/descriptors.h"

extern char** environ;

namespace hvd {
namespace launcher {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  const int err = errno;
  throw std::runtime_error(what + ": " + std::strerror(err) + DescriptorLimitNote(err));
}

sigset_t HandledSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
  return set;
}

// The watchdog (StartWatchdog): hvdrun writes +pgid for each rank's process group it starts and
// -pgid for one it found empty; the pipe's end of file means hvdrun is gone.
int g_watch_fd = -1;
constexpr int kMaxWatched = 1 << 16;
pid_t g_watched[kMaxWatched];  // the watchdog's own copy holds its list

void TellWatchdog(int32_t v) {
  if (g_watch_fd < 0) return;
  while (::write(g_watch_fd, &v, sizeof(v)) < 0 && errno == EINTR) {
  }
}

void SayFromWatchdog(const char* a, long n, const char* b) {
  char buf[256];
  int len = std::snprintf(buf, sizeof(buf), "%s%ld%s", a, n, b);
  if (len > 0) {
    ssize_t ignored = ::write(STDERR_FILENO, buf, std::min<size_t>(len, sizeof(buf) - 1));
    (void)ignored;
  }
}

// Runs in the forked watchdog, which allocates nothing and runs no destructor of hvdrun's.
[[noreturn]] void RunWatchdog(int fd, pid_t hvdrun, double kill_after_seconds) {
  int n = 0;
  while (true) {
    int32_t v = 0;
    ssize_t got = ::read(fd, &v, sizeof(v));  // writes of 4 bytes are never split
    if (got < 0 && errno == EINTR) continue;
    if (got != static_cast<ssize_t>(sizeof(v))) break;  // end of file: hvdrun is gone
    if (v > 0 && n < kMaxWatched) g_watched[n++] = v;
    if (v < 0) {
      for (int i = 0; i < n; ++i) {
        if (g_watched[i] == -v) {
          g_watched[i] = g_watched[--n];
          break;
        }
      }
    }
  }
  int alive = 0;
  for (int i = 0; i < n; ++i) {
    if (::killpg(g_watched[i], 0) == 0) g_watched[alive++] = g_watched[i];
  }
  if (alive == 0) ::_exit(0);
  SayFromWatchdog("hvdrun: hvdrun (pid ", hvdrun, ") is gone; stopping the processes its ranks left");
  SayFromWatchdog(" (", alive, " process group(s))\n");
  for (int i = 0; i < alive; ++i) {
    ::killpg(g_watched[i], SIGTERM);
    ::killpg(g_watched[i], SIGCONT);
  }
  for (int64_t waited_ms = 0; waited_ms < kill_after_seconds * 1000; waited_ms += 50) {
    bool any = false;
    for (int i = 0; i < alive; ++i) any = any || ::killpg(g_watched[i], 0) == 0;
    if (!any) ::_exit(0);
    struct timespec t = {0, 50 * 1000 * 1000};
    ::nanosleep(&t, nullptr);
  }
  for (int i = 0; i < alive; ++i) ::killpg(g_watched[i], SIGKILL);
  ::_exit(0);
}

// Should hvdrun be SIGKILLed, its ranks go with it (PR_SET_PDEATHSIG), but not what they started:
// a rank run through a shell or a wrapper script leaves the program it started running. A
// watchdog process, forked here, outlives hvdrun, and then stops every process group of a rank:
// SIGTERM, and SIGKILL after kill_after_seconds (as hvdrun stops them).
void StartWatchdog(double kill_after_seconds) {
  if (g_watch_fd >= 0) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;  // no watchdog: PR_SET_PDEATHSIG still holds
  const pid_t hvdrun = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  if (pid == 0) {
    // A process group of its own: a SIGKILL (or Ctrl-C) for hvdrun's whole group, the usual
    // way hvdrun gets one, leaves it be. Default signal handling, but for the stops a
    // terminal's job control sends (its one write to stderr must not stop it) and SIGHUP.
    ::setpgid(0, 0);
    for (int sig : {SIGTTOU, SIGTTIN, SIGTSTP, SIGHUP, SIGPIPE}) ::signal(sig, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // It keeps stderr, for that message, and the pipe's read end as fd 3; stdin and stdout are
    // /dev/null (a reader of hvdrun's output sees its end when hvdrun ends), and every other
    // descriptor closes: the pipe's write end above all, or hvdrun's end would never show.
    ::close(fds[1]);
    if (fds[0] != 3) {
      ::dup2(fds[0], 3);
      ::close(fds[0]);
    }
    if (::syscall(SYS_close_range, 4U, ~0U, 0U) != 0) {  // kernels before 5.9
      rlimit files{};
      const rlim_t top = ::getrlimit(RLIMIT_NOFILE, &files) == 0 ? files.rlim_cur : 1024;
      for (rlim_t fd = 4; fd < std::min<rlim_t>(top, 1 << 16); ++fd) ::close(static_cast<int>(fd));
    }
    int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, STDIN_FILENO);
      ::dup2(null, STDOUT_FILENO);
      if (null > 3) ::close(null);
    }
    RunWatchdog(3, hvdrun, kill_after_seconds);
  }
  ::close(fds[0]);
  g_watch_fd = fds[1];
}

}  // namespace

void WatchGroup(pid_t pgid) { TellWatchdog(pgid); }

namespace {

// Runs in the child between fork and exec: async-signal-safe calls only.
// `sh_argv`: the command as /bin/sh's script, for a file exec cannot start (ENOEXEC: a script
// without a "#!" line), which /bin/sh runs, as execvp and horovodrun's shell do.
[[noreturn]] void ExecChild(int in_r, int out_w, int err_w, int report_w, pid_t parent,
                            const char* path, char* const* argv, char* const* sh_argv,
                            char* const* envp) {
  ::setpgid(0, 0);
  // Should hvdrun itself be SIGKILLed, its ranks do not outlive it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  int in = in_r >= 0 ? in_r : ::open("/dev/null", O_RDONLY);
  if (in >= 0) ::dup2(in, STDIN_FILENO);
  ::dup2(out_w, STDOUT_FILENO);
  ::dup2(err_w, STDERR_FILENO);
  // Every other descriptor (pipes of other ranks, the store's sockets) closes on exec.
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    for (int fd = 3; fd < 4096; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int s : {SIGPIPE, SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(path, argv, envp);
  int err = errno;
  if (err == ENOEXEC) ::execve(sh_argv[0], sh_argv, envp);
  ssize_t ignored = ::write(report_w, &err, sizeof(err));
  (void)ignored;
  ::_exit(127);
}

// Waits (bounded) for the exec report of a child: 0 when exec succeeded.
int ReadExecReport(int report_r, double timeout_seconds) {
  pollfd p{report_r, POLLIN, 0};
  int ms = static_cast<int>(timeout_seconds * 1000);
  int err = 0;
  while (true) {
    int n = ::poll(&p, 1, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;  // no report in time: treat as started; waitpid tells the rest
    ssize_t got = ::read(report_r, &err, sizeof(err));
    if (got < 0 && errno == EINTR) continue;
    return got == static_cast<ssize_t>(sizeof(err)) ? err : 0;
  }
}

std::vector<char*> CStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::string RandomSecret() {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail("cannot open /dev/urandom");
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = ::read(fd, bytes + got, sizeof(bytes) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      Fail("cannot read /dev/urandom");
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return auth::Hex(bytes, sizeof(bytes));
}

std::map<std::string, std::string> ContractVariables(const Placement& p, const JobEnvironment& job) {
  std::map<std::string, std::string> set = job.knobs;
  set["HVD_RANK"] = std::to_string(p.rank);
  set["HVD_SIZE"] = std::to_string(p.size);
  set["HVD_LOCAL_RANK"] = std::to_string(p.local_rank);
  set["HVD_LOCAL_SIZE"] = std::to_string(p.local_size);
  set["HVD_CROSS_RANK"] = std::to_string(p.cross_rank);
  set["HVD_CROSS_SIZE"] = std::to_string(p.cross_size);
  set["HVD_HOSTNAME"] = p.host;
  // The same identity under the names horovodrun gives its ranks, for scripts (and Horovod's
  // own tests) that read them.
  for (const char* name : {"RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
                           "CROSS_SIZE", "HOSTNAME"}) {
    set[std::string("HOROVOD_") + name] = set[std::string("HVD_") + name];
  }
  set["HVD_RENDEZVOUS_ADDR"] = job.rendezvous_addr;
  set["HVD_RENDEZVOUS_PORT"] = std::to_string(job.rendezvous_port);
  set["HVD_SECRET"] = job.secret;
  return set;
}

std::vector<std::string> RankEnvironment(const Placement& p, const JobEnvironment& job) {
  std::map<std::string, std::string> set = ContractVariables(p, job);
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    if (set.count(kv.substr(0, kv.find('='))) == 0) env.push_back(kv);
  }
  for (const auto& kv : set) env.push_back(kv.first + "=" + kv.second);
  return env;
}

std::string ResolveProgram(const std::string& program) {
  auto runnable = [](const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (runnable(program)) return program;
    struct stat st;
    std::string why = "no such file";
    if (::stat(program.c_str(), &st) == 0) {
      why = !S_ISREG(st.st_mode) ? "not a regular file"
                                 : "not executable (chmod +x it, or name its interpreter first)";
    }
    throw LaunchError("cannot execute '" + program + "': " + why);
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (runnable(candidate)) return candidate;
    start = end + 1;
  }
  throw LaunchError("command not found: " + program);
}

int SetUpSignals(double kill_after_seconds) {
  sigset_t set = HandledSignals();
  if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) Fail("sigprocmask");
  ::signal(SIGPIPE, SIG_IGN);
  // Children of ranks that exit are re-parented to hvdrun, so hvdrun can reap them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  StartWatchdog(kill_after_seconds);
  int fd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) Fail("signalfd");
  return fd;
}

RankProcess SpawnRank(const Placement& p, const std::vector<std::string>& command,
                      const std::vector<std::string>& env, double start_timeout_seconds,
                      int stdin_fd) {
  int out[2], err[2], report[2];
  if (::pipe2(out, O_CLOEXEC) != 0) Fail("pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) Fail("pipe");
  if (::pipe2(report, O_CLOEXEC) != 0) Fail("pipe");
  std::vector<char*> argv = CStrings(command);
  std::vector<std::string> as_script = {"/bin/sh"};
  as_script.insert(as_script.end(), command.begin(), command.end());
  std::vector<char*> sh_argv = CStrings(as_script);
  std::vector<char*> envp = CStrings(env);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) Fail("fork");
  if (pid == 0) {
    ExecChild(stdin_fd, out[1], err[1], report[1], parent, argv[0], argv.data(), sh_argv.data(),
              envp.data());
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we might signal it
  TellWatchdog(pid);
  ::close(out[1]);
  ::close(err[1]);
  ::close(report[1]);
  int exec_errno = ReadExecReport(report[0], start_timeout_seconds);
  ::close(report[0]);
  if (exec_errno != 0) {
    std::string msg = "hvdrun: rank " + std::to_string(p.rank) + ": cannot execute '" +
                      command[0] + "': " + std::strerror(exec_errno) + "\n";
    ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
    (void)ignored;
  }
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
  RankProcess r;
  r.placement = p;
  r.pid = pid;
  r.out_fd = out[0];
  r.err_fd = err[0];
  r.running = true;
  return r;
}

bool ForgetGroupIfGone(pid_t pgid) {
  if (::killpg(pgid, 0) == 0 || errno != ESRCH) return false;
  TellWatchdog(-pgid);
  return true;
}

void ForgetKilledGroup(pid_t pgid) { TellWatchdog(-pgid); }

}  // namespace launcher
}  // namespace hvd
