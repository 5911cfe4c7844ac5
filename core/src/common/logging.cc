#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

namespace hvd {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};

// The prefix and its lock, never destroyed: a log line may come from another object's
// destructor during static destruction (a LimitedWarning's last count).
struct Prefix {
  std::mutex mu;
  std::string text;  // guarded by mu
};
Prefix& ThePrefix() {
  static Prefix* p = new Prefix;
  return *p;
}
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
void SetLogPrefix(const std::string& prefix) {
  Prefix& p = ThePrefix();
  std::lock_guard<std::mutex> l(p.mu);
  p.text = prefix;
}

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
    case LogLevel::kFatal: return "fatal";
  }
  return "unknown";
}

bool ParseLogLevel(const std::string& s, LogLevel* out) {
  static const char* const names[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  for (int i = 0; i < 6; ++i) {
    if (strcasecmp(s.c_str(), names[i]) == 0) {
      *out = static_cast<LogLevel>(i);
      return true;
    }
  }
  if (strcasecmp(s.c_str(), "warn") == 0) { *out = LogLevel::kWarning; return true; }
  return false;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = strrchr(file, '/');
  std::string prefix;
  {
    Prefix& p = ThePrefix();
    std::lock_guard<std::mutex> l(p.mu);
    prefix = p.text;
  }
  os_ << "[hvd " << LogLevelName(level);
  if (!prefix.empty()) os_ << " " << prefix;
  os_ << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  os_ << "\n";
  std::string s = os_.str();
  ssize_t ignored = ::write(STDERR_FILENO, s.data(), s.size());
  (void)ignored;
}

LimitedWarning::LimitedWarning(std::string what, int each, std::chrono::seconds period)
    : what_(std::move(what)), each_(each), period_(period) {}

void LimitedWarning::Note(const std::string& detail) {
  std::lock_guard<std::mutex> l(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (logged_ < each_) {
    ++logged_;
    told_ = now;
    HVD_LOG(kWarning) << what_ << ": " << detail;
    if (logged_ == each_) {
      HVD_LOG(kWarning) << "further such lines (" << what_ << ") are counted, one line at most every "
                        << period_.count() << " s";
    }
    return;
  }
  ++since_;
  last_ = detail;
  if (now - told_ < period_) return;
  HVD_LOG(kWarning) << what_ << ": " << since_ << " more in the last "
                    << std::chrono::duration_cast<std::chrono::seconds>(now - told_).count()
                    << " s; the last: " << last_;
  since_ = 0;
  told_ = now;
}

void LimitedWarning::Flush() {
  std::lock_guard<std::mutex> l(mu_);
  if (since_ == 0) return;
  HVD_LOG(kWarning) << what_ << ": " << since_ << " more since the last line; the last: " << last_;
  since_ = 0;
  told_ = std::chrono::steady_clock::now();
}

std::string RankList(const std::vector<int>& ranks, size_t shown) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < shown; ++i) {
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  if (ranks.size() > shown) s += ", ... (" + std::to_string(ranks.size()) + ")";
  return s;
}

}  // namespace hvd
