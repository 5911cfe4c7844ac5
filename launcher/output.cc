#include "output.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace hvd {
namespace launcher {

void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  int waits = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // A non-blocking stdout that is full: wait for it, but not forever (10 x 1 s).
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && waits++ < 10) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
      continue;
    }
    return;  // EPIPE or another error: the output is lost, the job goes on
  }
}

LinePump::LinePump(int rank, const char* stream_name, int out_fd, bool prefix, int file_fd)
    : out_fd_(out_fd), file_fd_(file_fd) {
  if (prefix) prefix_ = "[" + std::to_string(rank) + "]<" + stream_name + ">:";
}

LinePump::~LinePump() {
  if (file_fd_ >= 0) ::close(file_fd_);
}

void LinePump::Emit(const char* data, size_t len) {
  std::string line;
  line.reserve(prefix_.size() + len + 1);
  line += prefix_;
  line.append(data, len);
  line.push_back('\n');
  WriteAll(out_fd_, line);
  if (file_fd_ >= 0) WriteAll(file_fd_, line.substr(prefix_.size()));
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
      size_t nl = partial_.find('\n', start);
      if (nl == std::string::npos) break;
      Emit(partial_.data() + start, nl - start);
      start = nl + 1;
    }
    partial_.erase(0, start);
    while (partial_.size() >= kMaxLine) {
      Emit(partial_.data(), kMaxLine);
      partial_.erase(0, kMaxLine);
    }
  }
  return true;
}

void LinePump::Flush() {
  if (partial_.empty()) return;
  Emit(partial_.data(), partial_.size());
  partial_.clear();
}

}  // namespace launcher
}  // namespace hvd
