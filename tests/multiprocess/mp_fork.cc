#include "mp_fork.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

struct ForkedWorld::Impl {
  std::unique_ptr<hvd::StoreServer> store;
};

ForkedWorld::ForkedWorld(int size, double timeout_seconds)
    : size_(size), timeout_seconds_(timeout_seconds), impl_(new Impl), children_(size),
      fds_(size, -1) {
  auto s = hvd::StoreServer::Start("127.0.0.1", 0);
  if (s.ok()) {
    impl_->store = std::move(*s);
    store_ok_ = true;
  }
}

ForkedWorld::~ForkedWorld() {
  KillAll();
  for (int& fd : fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (impl_->store) impl_->store->Stop();
}

bool ForkedWorld::Start(const Body& body) {
  started_ = Clock::now();
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
      o.rendezvous_port = impl_->store->port();
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
