// Line-prefixed forwarding of one rank stream (stdout or stderr) to hvdrun's own stream:
// "[3]<stdout>:text", and, with --output-filename, the lines unprefixed to a file as well. Each complete line goes out in one write, so lines of different ranks
// never interleave inside a line. A line longer than kMaxLine is cut into kMaxLine pieces.
//
// Thread-safety: one thread (hvdrun's supervisor loop).
#pragma once

#include <string>

namespace hvd {
namespace launcher {

class LinePump {
 public:
  static constexpr size_t kMaxLine = 64 << 10;

  // Reads from `in_fd` (non-blocking, not owned) and writes to `out_fd`, and to `file_fd`
  // (owned; -1: none).
  LinePump(int rank, const char* stream_name, int out_fd, bool prefix, int file_fd = -1);
  ~LinePump();
  LinePump(const LinePump&) = delete;
  LinePump& operator=(const LinePump&) = delete;

  // Reads what is available; returns false once the stream reached EOF (or failed).
  bool Pump(int in_fd);
  // Writes a last partial line, with a newline added.
  void Flush();

 private:
  void Emit(const char* data, size_t len);

  std::string prefix_;
  int out_fd_;
  int file_fd_;
  std::string partial_;
};

// Writes all of `s` to `fd`, retrying on EINTR/EAGAIN for a bounded time; gives up silently
// when the reader is gone (EPIPE).
void WriteAll(int fd, const std::string& s);

}  // namespace launcher
}  // namespace hvd
