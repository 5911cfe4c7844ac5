// The remote rank's bootstrap (launcher/remote.h, step 4), run here under /bin/sh with a pipe
// standing in for ssh's stdin: hvdrun's ticks keep the rank, their silence or EOF stops it, and
// nothing that reads the pipe outlives the rank. Once with bash on PATH (its `read -t`), once
// with a PATH that has `timeout` and `head` but no bash.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "remote.h"

namespace {

using Clock = std::chrono::steady_clock;
using hvd::launcher::RemoteEnvironmentText;
using hvd::launcher::RemoteRankCommand;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/hvd_remote_test.XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A directory of links to the tools the bootstrap runs, without bash: the `timeout head`
// watcher's PATH.
std::string PathWithoutBash(const TempDir& dir) {
  const std::string bin = dir.path() + "/bin";
  ::mkdir(bin.c_str(), 0755);
  for (const char* tool : {"sh", "setsid", "sleep", "timeout", "head", "true"}) {
    for (const char* from : {"/usr/bin/", "/bin/"}) {
      if (::symlink((std::string(from) + tool).c_str(), (bin + "/" + tool).c_str()) == 0) break;
    }
  }
  return bin;
}

// The bootstrap of one rank running `command`, its stdin the read end of a pipe this test
// writes hvdrun's side to.
class Bootstrap {
 public:
  // `socket`: a socket for stdin, as sshd gives (bash then reads ~/.bashrc even with -c);
  // `env`: set in the bootstrap's environment, as a login shell would have it.
  Bootstrap(const std::vector<std::string>& command, int silence_seconds, const std::string& path,
            bool socket = false, const std::map<std::string, std::string>& env = {}) {
    int fds[2];
    if (socket ? ::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0 : ::pipe(fds) != 0) std::abort();
    const std::string line = RemoteRankCommand(command);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[0], 0);
      ::close(fds[0]);
      ::close(fds[1]);
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      if (!path.empty()) ::setenv("PATH", path.c_str(), 1);
      for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[0]);
    in_ = fds[1];
    std::map<std::string, std::string> vars;
    if (!path.empty()) vars["PATH"] = path;
    Write(RemoteEnvironmentText(vars, /*kill_after_seconds=*/1.0, silence_seconds));
  }
  ~Bootstrap() {
    Close();
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  bool Write(const std::string& s) {
    return in_ >= 0 && ::write(in_, s.data(), s.size()) == static_cast<ssize_t>(s.size());
  }
  void Close() {
    if (in_ >= 0) ::close(in_);
    in_ = -1;
  }
  // The bootstrap's exit status (128+N for signal N) once it has exited, waiting at most
  // `seconds`; -1 while it runs.
  int Exit(double seconds) {
    const auto start = Clock::now();
    for (;;) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (Since(start) >= seconds) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // Whether every reader of the pipe is gone within `seconds` (a write fails with EPIPE).
  bool ReadersGone(double seconds) {
    const auto start = Clock::now();
    while (Since(start) < seconds) {
      if (!Write(".") && errno == EPIPE) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  int in_ = -1;
  bool exited_ = false;
};

class RemoteBootstrap : public ::testing::TestWithParam<bool> {  // param: bash on PATH
 protected:
  void SetUp() override {
    ::signal(SIGPIPE, SIG_IGN);
    if (!GetParam()) path_ = PathWithoutBash(dir_);
  }
  TempDir dir_;
  std::string path_;  // "": the test's own PATH (bash on it)
};

constexpr int kTerm = 128 + SIGTERM;

TEST_P(RemoteBootstrap, SilenceStopsTheRank) {
  const auto start = Clock::now();
  Bootstrap b({"sleep", "60"}, /*silence_seconds=*/2, path_);
  const int code = b.Exit(20);
  const double took = Since(start);
  EXPECT_EQ(code, kTerm) << "the rank should be stopped with SIGTERM after 2 s without a tick";
  EXPECT_GE(took, 1.5) << "stopped before the silence limit";
  EXPECT_LE(took, 10.0);
}

TEST_P(RemoteBootstrap, TicksKeepTheRankAndEofStopsIt) {
  Bootstrap b({"sleep", "60"}, /*silence_seconds=*/2, path_);
  const auto start = Clock::now();
  while (Since(start) < 5.0) {  // 2.5 silence limits of ticks
    ASSERT_TRUE(b.Write(".")) << "the bootstrap stopped reading while ticks came";
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_EQ(b.Exit(0), -1) << "the rank was stopped although ticks came every 0.25 s";
  b.Close();
  const auto closed = Clock::now();
  EXPECT_EQ(b.Exit(10), kTerm);
  EXPECT_LE(Since(closed), 3.0) << "EOF should stop the rank at once";
}

TEST_P(RemoteBootstrap, RankExitLeavesNoReader) {
  Bootstrap b({"sh", "-c", "sleep 1; exit 3"}, /*silence_seconds=*/5, path_);
  ASSERT_TRUE(b.Write("."));
  EXPECT_EQ(b.Exit(10), 3) << "the bootstrap exits with the rank's status";
  // With bash the watcher is killed at once; `timeout head` ends within its 2 s.
  EXPECT_TRUE(b.ReadersGone(4.0)) << "a process of the bootstrap still reads hvdrun's stdin";
}

// Under sshd (stdin a socket, SSH_CLIENT set) bash reads ~/.bashrc even for -c, and $BASH_ENV
// always: the watcher reads neither (a .bashrc's work, such as pyenv's rehash with its lock
// file, would be killed half-way when the rank exits, and left the lock for every later login).
TEST_P(RemoteBootstrap, WatcherReadsNoStartupFile) {
  const std::string home = dir_.path();
  for (const char* file : {"/.bashrc", "/env.sh"}) {
    std::ofstream f(home + file);
    f << "touch " << home << file << ".read\n";
  }
  {
    Bootstrap b({"sh", "-c", "sleep 2; exit 0"}, /*silence_seconds=*/5, path_, /*socket=*/true,
                {{"HOME", home}, {"SSH_CLIENT", "10.0.0.1 40000 22"},
                 {"BASH_ENV", home + "/env.sh"}});
    ASSERT_TRUE(b.Write("."));
    EXPECT_EQ(b.Exit(10), 0);
  }
  for (const char* file : {"/.bashrc", "/env.sh"}) {
    EXPECT_NE(0, ::access((home + file + ".read").c_str(), F_OK)) << file << " was read";
  }
}

INSTANTIATE_TEST_SUITE_P(Watchers, RemoteBootstrap, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Bash" : "TimeoutHead";
                         });

}  // namespace
