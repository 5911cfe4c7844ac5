// Line-prefixed forwarding of one rank stream (stdout or stderr) to hvdrun's own stream:
// "[3]<stdout>:text" (with the time first, as horovodrun's --prefix-output-with-timestamp
// writes it, where asked), and, with --output-filename, the lines without the rank's prefix to
// a file as well. Each line of up to kMaxLine bytes goes out in one write, so lines of
// different ranks never interleave inside it; a longer one goes out in pieces as it comes,
// with nothing inserted between them while no other stream writes to the same console. Where
// another rank's line comes between two pieces, the piece before it is ended with a newline
// and the next piece starts with the rank's prefix again, so that every piece says whose it
// is (the --output-filename file gets the line unbroken). As in
// horovodrun, a carriage return ends a line too (a progress bar redrawn in place goes out as
// it is drawn, each redraw with the prefix), kept as it is: "\r\n" stays one line end.
//
// Thread-safety: one thread (hvdrun's supervisor loop).
#pragma once

#include <string>

namespace hvd {
namespace launcher {

class LinePump {
 public:
  static constexpr size_t kMaxLine = 1 << 20;

  // Reads from `in_fd` (non-blocking, not owned) and writes to `out_fd`, and to `file_fd`
  // (owned; -1: none).
  LinePump(int rank, const char* stream_name, int out_fd, bool prefix, int file_fd = -1,
           bool timestamp = false);
  ~LinePump();
  LinePump(const LinePump&) = delete;
  LinePump& operator=(const LinePump&) = delete;

  // Reads what is available; returns false once the stream reached EOF (or failed).
  bool Pump(int in_fd);
  // Writes a last partial line, with a newline added.
  void Flush();

 private:
  // `end`: what ends the line here ('\n' or '\r'); 0: it goes on.
  void Emit(const char* data, size_t len, char end);

  // Of everything written to one console (a file, a pipe or a terminal, however many
  // descriptors hvdrun has on it): the stream that wrote last, and whether it left a line open.
  struct ConsoleLine {
    const LinePump* last = nullptr;
    bool open = false;
  };

  std::string prefix_;
  int out_fd_;
  ConsoleLine* console_;  // out_fd_'s (shared by every pump that writes there; never freed)
  int file_fd_;
  bool timestamp_;
  bool mid_line_ = false;  // the last Emit ended inside a line
  bool after_cr_ = false;  // the last thing out was a line ended by '\r'
  std::string partial_;
};

// hvdrun's console, set up first thing in main:
// - stdin, stdout and stderr opened on /dev/null where the caller closed them, so that no pipe
//   of hvdrun's takes their numbers (its watchdog's pipe on 2 read rank output as process groups);
// - where stdout or stderr is a pipe or a terminal, hvdrun writes through a descriptor of its own
//   on it that does not block (the file's other users, ranks started through mpirun included,
//   keep theirs as they were): a reader that stops reading (`| less`, a stalled terminal) holds
//   the output back, but not the signals that stop the job.
void SetUpConsole();
// The descriptor hvdrun writes its stdout (1) or its stderr (2) through.
int Console(int std_fd);
// hvdrun was asked to stop (a signal): from now on a write to the console that cannot go out
// waits at most a second or two, then drops what is left.
void StopWaitingForConsole();

// Writes all of `s` to `fd`, retrying on EINTR/EAGAIN; gives up silently when the reader is gone
// (EPIPE). A full console waits for its reader for as long as it takes, until a signal that
// stops hvdrun is pending (hvdrun then handles it, and drops the rest); any other descriptor
// that is full for 10 s is given up on.
void WriteAll(int fd, const std::string& s);

}  // namespace launcher
}  // namespace hvd
