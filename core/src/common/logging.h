// Minimal leveled logging to stderr: HVD_LOG(kWarning) << "text";
// The level is set once (from HVD_LOG_LEVEL) by the engine or the launcher.
//
// Thread-safety: a message is written with one write() call, so lines from several threads do
// not interleave.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "hvd/options.h"

namespace hvd {

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void SetLogPrefix(const std::string& prefix);  // e.g. "rank 3"

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

// Warnings about what a stranger can repeat at will (connections dropped for failing the
// handshake): the first `each` (10) are logged one by one, then at most one line every
// `period` (10 s) with the count since. A count still untold is logged by the next event after the period, or
// by Flush() (the owner's shutdown).
//
// Thread-safety: Note and Flush may be called from any thread.
class LimitedWarning {
 public:
  explicit LimitedWarning(std::string what, int each = 10,
                          std::chrono::seconds period = std::chrono::seconds(10));
  ~LimitedWarning() { Flush(); }
  void Note(const std::string& detail);
  void Flush();

 private:
  const std::string what_;
  const int each_;
  const std::chrono::seconds period_;
  std::mutex mu_;
  int logged_ = 0;
  uint64_t since_ = 0;  // not logged yet
  std::string last_;
  std::chrono::steady_clock::time_point told_;
};

// Ranks in a message: "0, 2, 5"; past `shown` of them, "0, 1, ..., (12)" with the count.
std::string RankList(const std::vector<int>& ranks, size_t shown = SIZE_MAX);

}  // namespace hvd

#define HVD_LOG(level)                                               \
  if (::hvd::LogLevel::level < ::hvd::GetLogLevel()) {               \
  } else                                                             \
    ::hvd::LogMessage(::hvd::LogLevel::level, __FILE__, __LINE__).stream()
