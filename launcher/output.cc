#include "output.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <ctime>
#include <map>
#include <utility>

namespace hvd {
namespace launcher {

namespace {

int g_console[3] = {0, 1, 2};
// Steady-clock nanoseconds after which a full console is no longer waited for (0: not stopping).
std::atomic<int64_t> g_stop_waiting_after{0};

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A signal that stops hvdrun waits to be read from its signalfd (they are blocked: spawn.cc).
bool StopSignalPending() {
  sigset_t pending;
  sigemptyset(&pending);
  if (::sigpending(&pending) != 0) return false;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    if (sigismember(&pending, sig) == 1) return true;
  }
  return false;
}

}  // namespace

void SetUpConsole() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    // The lowest free number, which is fd: the ones below it are open by now.
    const int null = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (null >= 0 && null != fd) {
      ::dup2(null, fd);
      ::close(null);
    }
  }
  for (int fd = 1; fd <= 2; ++fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) continue;
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || (flags & O_NONBLOCK) != 0) continue;  // non-blocking already
    // A new open file description of the same pipe or terminal, with its own O_NONBLOCK (the
    // flag on fd's would be the shell's too). A regular file never waits; a socket cannot be
    // opened so, and stays as it is.
    char path[32];
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    const int own = ::open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (own >= 0) g_console[fd] = own;
  }
}

int Console(int std_fd) { return std_fd >= 0 && std_fd <= 2 ? g_console[std_fd] : std_fd; }

void StopWaitingForConsole() {
  int64_t none = 0;
  g_stop_waiting_after.compare_exchange_strong(none, NowNanos() + 2'000'000'000);
}

void WriteAll(int fd, const std::string& s) {
  const bool console = fd == g_console[1] || fd == g_console[2];
  size_t done = 0;
  int waits = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (console) {
        // Its reader is slow or stopped: wait for it while the job runs (the ranks' output
        // waits in their pipes meanwhile); not past a signal that stops hvdrun.
        const int64_t after = g_stop_waiting_after.load();
        if (StopSignalPending() || (after != 0 && NowNanos() > after)) return;
      } else if (waits++ >= 10) {
        return;  // 10 x 1 s
      }
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, console ? 100 : 1000);
      continue;
    }
    return;  // EPIPE or another error: the output is lost, the job goes on
  }
}

LinePump::LinePump(int rank, const char* stream_name, int out_fd, bool prefix, int file_fd,
                   bool timestamp)
    : out_fd_(out_fd), file_fd_(file_fd), timestamp_(timestamp) {
  if (prefix) prefix_ = "[" + std::to_string(rank) + "]<" + stream_name + ">:";
  // The console by what it is (stdout and stderr on one terminal are one), else by descriptor.
  static std::map<std::pair<uint64_t, uint64_t>, ConsoleLine> consoles;
  struct stat st {};
  const auto key = ::fstat(out_fd, &st) == 0
                       ? std::make_pair(static_cast<uint64_t>(st.st_dev),
                                        static_cast<uint64_t>(st.st_ino))
                       : std::make_pair(~uint64_t{0}, static_cast<uint64_t>(out_fd));
  console_ = &consoles[key];
}

LinePump::~LinePump() {
  if (file_fd_ >= 0) ::close(file_fd_);
}

// horovodrun's --prefix-output-with-timestamp: the local time as Python's time.ctime() gives
// it, before the rank's prefix.
static std::string TimeStamp() {
  time_t now = ::time(nullptr);
  tm local{};
  ::localtime_r(&now, &local);
  char text[64];
  size_t n = std::strftime(text, sizeof(text), "%a %b %e %H:%M:%S %Y", &local);
  return std::string(text, n);
}

void LinePump::Emit(const char* data, size_t len, char end) {
  // The rank's prefix and the time at the start of a line only: a line longer than kMaxLine
  // goes out in pieces, with nothing added between them unless another stream wrote to the
  // console in between (output.h).
  // `stamp`: the time, where asked; `head`: it and the rank's prefix (a space between the time
  // and a line that has no prefix).
  ConsoleLine& c = *console_;
  const bool someone_else = c.last != nullptr && c.last != this;
  std::string stamp, head;
  if (!mid_line_ || someone_else) {
    if (timestamp_) stamp = TimeStamp();
    head = stamp + (prefix_.empty() && timestamp_ ? " " : "") + prefix_;
  }
  std::string line;
  line.reserve(1 + head.size() + len + 1);
  if (someone_else && c.open) line.push_back('\n');  // the other stream's piece, ended
  line += head;
  line.append(data, len);
  if (end != 0) line.push_back(end);
  c.last = this;
  c.open = end == 0;
  const bool started = !mid_line_;
  mid_line_ = end == 0;
  WriteAll(out_fd_, line);
  if (file_fd_ >= 0) {  // the file: the time and a space at a line's start, never the prefix
    std::string piece = started && timestamp_ ? stamp + " " : std::string();
    piece.append(data, len);
    if (end != 0) piece.push_back(end);
    WriteAll(file_fd_, piece);
  }
}

bool LinePump::Pump(int in_fd) {
  char buf[16384];
  for (int rounds = 0; rounds < 64; ++rounds) {  // bounded, so one chatty rank can't starve
    ssize_t n = ::read(in_fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) return false;
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    while (true) {
      size_t at = partial_.find_first_of("\r\n", start);
      if (at == std::string::npos) break;
      const char end = partial_[at];
      if (end == '\n' && at == start && after_cr_) {
        // The '\n' of a "\r\n": its line went out with the '\r'.
        WriteAll(out_fd_, "\n");
        if (file_fd_ >= 0) WriteAll(file_fd_, "\n");
      } else {
        Emit(partial_.data() + start, at - start, end);
      }
      after_cr_ = end == '\r';
      start = at + 1;
    }
    partial_.erase(0, start);
    if (partial_.size() >= kMaxLine) {  // part of a longer line: out now, unbroken
      Emit(partial_.data(), partial_.size(), /*end=*/0);
      after_cr_ = false;
      partial_.clear();
    }
  }
  return true;
}

void LinePump::Flush() {
  if (partial_.empty() && !mid_line_) return;
  Emit(partial_.data(), partial_.size(), '\n');
  after_cr_ = false;
  partial_.clear();
}

}  // namespace launcher
}  // namespace hvd
