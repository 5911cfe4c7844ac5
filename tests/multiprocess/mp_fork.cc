#include "mp_fork.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "bootstrap/store.h"

namespace mp {

void Reporter::Say(const std::string& key, const std::string& value) const {
  std::string line = key + "=" + value;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  line += "\n";
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t w = ::write(fd_, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    left -= static_cast<size_t>(w);
  }
}

int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

StoreProcess::StoreProcess(const std::string& secret) {
  int p[2];
  if (::pipe(p) != 0) return;
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(p[0]);
    ::close(p[1]);
    return;
  }
  if (pid_ == 0) {
    ::close(p[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(0);
    ::alarm(600);  // watchdog, in case the test process is stopped rather than killed
    auto s = hvd::StoreServer::Start("127.0.0.1", 0, secret);
    int port = s.ok() ? (*s)->port() : -1;
    ssize_t ignored = ::write(p[1], &port, sizeof(port));
    (void)ignored;
    ::close(p[1]);
    while (true) ::pause();  // serves on its own thread until killed
  }
  ::close(p[1]);
  pollfd pfd{p[0], POLLIN, 0};
  int port = -1;
  if (::poll(&pfd, 1, 10000) == 1 && ::read(p[0], &port, sizeof(port)) == sizeof(port)) {
    port_ = port > 0 ? port : 0;
  }
  ::close(p[0]);
}

StoreProcess::~StoreProcess() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

ForkedWorld::ForkedWorld(int size, double timeout_seconds, const std::string& secret)
    : size_(size), timeout_seconds_(timeout_seconds), secret_(secret), store_(secret),
      children_(size), fds_(size, -1) {
  store_ok_ = store_.ok();
}

ForkedWorld::~ForkedWorld() {
  KillAll();
  for (int& fd : fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

bool ForkedWorld::Start(const Body& body) {
  started_ = Clock::now();
  if (int threads = ThreadCount(); threads != 1) {
    std::fprintf(stderr, "ForkedWorld: the test process has %d threads; a fork now could copy a "
                 "lock held by another thread into the ranks\n", threads);
    return false;
  }
  for (int r = 0; r < size_; ++r) {
    int p[2];
    if (::pipe(p) != 0) return false;
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
      ::close(p[0]);
      for (int fd : fds_) {
        if (fd >= 0) ::close(fd);
      }
      ::alarm(120);  // watchdog: a stuck child dies instead of outliving the test
      hvd::Options o;
      o.rank = r;
      o.size = size_;
      o.local_rank = r;
      o.local_size = size_;
      o.rendezvous_addr = "127.0.0.1";
      o.rendezvous_port = store_.port();
      o.secret = secret_;
      o.timeout_seconds = timeout_seconds_;
      o.log_level = hvd::LogLevel::kError;
      Reporter out(p[1]);
      int code = body(r, o, out);
      ::_exit(code);
    }
    ::close(p[1]);
    fds_[r] = p[0];
    children_[r].pid = pid;
  }
  return true;
}

double ForkedWorld::Elapsed() const {
  return std::chrono::duration<double>(Clock::now() - started_).count();
}

void ForkedWorld::Pump(int timeout_ms) {
  std::vector<pollfd> pfds;
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if (fds_[r] >= 0) {
      pfds.push_back({fds_[r], POLLIN, 0});
      ranks.push_back(r);
    }
  }
  if (pfds.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return;
  }
  if (::poll(pfds.data(), pfds.size(), timeout_ms) <= 0) return;
  for (size_t k = 0; k < pfds.size(); ++k) {
    if (!(pfds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char buf[4096];
    ssize_t n = ::read(pfds[k].fd, buf, sizeof(buf));
    if (n > 0) {
      children_[ranks[k]].output.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      ::close(fds_[ranks[k]]);
      fds_[ranks[k]] = -1;
    }
  }
}

void ForkedWorld::Reap() {
  for (auto& c : children_) {
    if (c.pid <= 0 || c.reaped) continue;
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    c.reaped = true;
    c.seconds = Elapsed();
    if (WIFEXITED(status)) c.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) c.term_signal = WTERMSIG(status);
  }
}

bool ForkedWorld::Wait(const std::vector<int>& ranks, double seconds) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(seconds));
  auto all_done = [&] {
    for (int r : ranks) {
      if (!children_[r].reaped || fds_[r] >= 0) return false;
    }
    return true;
  };
  while (!all_done() && Clock::now() < deadline) {
    Pump(20);
    Reap();
  }
  for (auto& c : children_) {
    c.values.clear();
    std::istringstream lines(c.output);
    std::string line;
    while (std::getline(lines, line)) {
      auto eq = line.find('=');
      if (eq != std::string::npos) c.values[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return all_done();
}

bool ForkedWorld::WaitAll(double seconds) {
  std::vector<int> all;
  for (int r = 0; r < size_; ++r) all.push_back(r);
  return Wait(all, seconds);
}

void ForkedWorld::Signal(int rank, int sig) {
  if (children_[rank].pid > 0 && !children_[rank].reaped) ::kill(children_[rank].pid, sig);
}

void ForkedWorld::KillAll() {
  for (int r = 0; r < size_; ++r) Signal(r, SIGKILL);
  for (auto& c : children_) {
    if (c.pid <= 0 || c.reaped) continue;
    int status = 0;
    // SIGKILL cannot be ignored, and a stopped process dies of it too: this returns.
    if (::waitpid(c.pid, &status, 0) == c.pid) {
      c.reaped = true;
      if (WIFSIGNALED(status)) c.term_signal = WTERMSIG(status);
      if (WIFEXITED(status)) c.exit_code = WEXITSTATUS(status);
    }
  }
}

std::string Value(const ChildResult& r, const std::string& key) {
  auto it = r.values.find(key);
  return it == r.values.end() ? std::string() : it->second;
}

std::string Describe(const ChildResult& r) {
  std::ostringstream os;
  os << "pid " << r.pid;
  if (!r.reaped) {
    os << " still running";
  } else if (r.term_signal) {
    os << " killed by signal " << r.term_signal << " (" << strsignal(r.term_signal) << ")";
  } else {
    os << " exited with " << r.exit_code;
  }
  os << " after " << r.seconds << " s; reported:\n" << r.output;
  return os.str();
}

}  // namespace mp
