// Minimal leveled logging to stderr: HVD_LOG(kWarning) << "text";
// The level is set once (from HVD_LOG_LEVEL) by the engine or the launcher.
//
// Thread-safety: a message is written with one write() call, so lines from several threads do
// not interleave.
#pragma once

#include <sstream>

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

}  // namespace hvd

#define HVD_LOG(level)                                               \
  if (::hvd::LogLevel::level < ::hvd::GetLogLevel()) {               \
  } else                                                             \
    ::hvd::LogMessage(::hvd::LogLevel::level, __FILE__, __LINE__).stream()
