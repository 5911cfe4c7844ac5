#include "engine/timeline.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <sstream>

#include "common/logging.h"

namespace hvd {

namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

constexpr auto kIdleFlush = std::chrono::milliseconds(10);
constexpr auto kBusyFlush = std::chrono::seconds(1);
constexpr char kTail[] = "\n]\n";  // the array's end, after every write

}  // namespace

bool IsDynamicTimeline(const std::string& path) { return Upper(path) == "DYNAMIC"; }

Timeline::Timeline(const std::string& pattern, int rank, bool mark_cycles)
    : rank_(rank), mark_cycles_(mark_cycles), start_(Clock::now()), flushed_(start_ - kBusyFlush) {
  if (pattern.empty()) return;
  std::string path = pattern;
  auto pos = path.find("%r");
  if (pos == std::string::npos && rank != 0) return;
  if (pos != std::string::npos) path.replace(pos, 2, std::to_string(rank));
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) {
    HVD_LOG(kWarning) << "HVD_TIMELINE: cannot write " << path << "; no timeline";
    return;
  }
  // Unbuffered: each Flush is one write of what it adds, the bracket included, so the file is
  // cut short only where the process dies inside that write (with stdio's buffer it went out
  // in pieces of 4 KiB, and a job stopped meanwhile left a file cut in an event).
  std::setvbuf(file_, nullptr, _IONBF, 0);
  seekable_ = std::fseek(file_, 0, SEEK_END) == 0;
  // Horovod's first events: the process's name with the wall-clock time the timestamps count
  // from, which tools use to line up the files of several ranks.
  const auto epoch_us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  std::ostringstream os;
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"hvd rank " << rank
     << "\",\"start_time_since_epoch_in_micros\":" << epoch_us << "}}";
  Emit(os.str());
  Emit("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":0,\"args\":{\"sort_index\":0}}");
  Flush();  // whole JSON from the start
}

Timeline::~Timeline() {
  if (!file_) return;
  Flush();
  if (!closed_) std::fputs(kTail, file_);
  std::fclose(file_);
}

double Timeline::Micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - start_).count();
}

std::string Timeline::Us(double micros) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.3f", micros);
  return text;
}

void Timeline::Emit(const std::string& event) {
  buffer_.push_back(event);
  if (buffer_.size() >= 4096) Flush();
}

void Timeline::Tick(bool idle) {
  if (!file_ || buffer_.empty()) return;
  const auto since = Clock::now() - flushed_;
  if (since >= kBusyFlush || (idle && since >= kIdleFlush)) Flush();
}

Clock::duration Timeline::IdleFlushIn() const {
  if (!file_ || buffer_.empty()) return Clock::duration::max();
  const auto since = Clock::now() - flushed_;
  return since >= kIdleFlush ? Clock::duration::zero() : kIdleFlush - since;
}

void Timeline::MarkCycle(Clock::time_point t) {
  // A cycle that began before this file did (it was switched to within the cycle) has no mark.
  if (!file_ || !mark_cycles_ || t < start_) return;
  std::ostringstream os;
  os << "{\"name\":\"CYCLE_START\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"ts\":" << Us(Micros(t)) << "}";
  Emit(os.str());
}

void Timeline::Flush() {
  if (!file_) return;
  flushed_ = Clock::now();
  if (buffer_.empty() && (closed_ || !seekable_)) return;
  // Over the closing bracket the last write left.
  if (closed_ && std::fseek(file_, -static_cast<long>(sizeof(kTail) - 1), SEEK_END) != 0) {
    seekable_ = false;  // appended after it from here on: the file is not JSON; said once
    closed_ = false;
    HVD_LOG(kWarning) << "HVD_TIMELINE: cannot seek in the file; it ends with ']' only where the "
                         "engine stops";
  }
  std::string chunk;
  for (const auto& e : buffer_) {
    chunk += first_ ? "[\n" : ",\n";
    chunk += e;
    first_ = false;
  }
  if (seekable_) {
    chunk += kTail;
    closed_ = true;
  }
  buffer_.clear();
  std::fwrite(chunk.data(), 1, chunk.size(), file_);
}

std::string Timeline::Tid(int32_t set, const std::string& name) {
  if (set == 0) return JsonEscape(name);
  return JsonEscape(name) + " (process set " + std::to_string(set) + ")";
}

void Timeline::RankReady(int32_t set, const std::string& name, const char* op, int rank,
                         Clock::time_point t) {
  if (!file_) return;
  const std::string tid = Tid(set, name);
  auto [it, fresh] = negotiating_.try_emplace(tid);
  Negotiation& n = it->second;
  // A rank's readiness that reached this rank before the file began (a part of a round that
  // completes after a start_timeline) is shown at the file's start: no timestamp is negative.
  double at = Micros(std::max(t, start_));
  if (fresh) {
    n.event = "NEGOTIATE_" + Upper(op);
    n.start = at;
    std::ostringstream os;
    os << "{\"name\":\"" << n.event << "\",\"ph\":\"B\",\"pid\":0,\"tid\":\"" << tid
       << "\",\"ts\":" << Us(at) << "}";
    Emit(os.str());
  } else {
    if (std::find(n.ranks.begin(), n.ranks.end(), rank) != n.ranks.end()) return;
    // Stamped before the bar opened but taken after (a round's part read late): at its start.
    at = std::max(at, n.start);
  }
  n.ranks.push_back(rank);
  std::ostringstream tick;  // Horovod's ticks: zero-length, named by the rank
  tick << "{\"name\":\"" << rank << "\",\"ph\":\"X\",\"pid\":0,\"tid\":\"" << tid
       << "\",\"ts\":" << Us(at) << ",\"dur\":0}";
  Emit(tick.str());
}

void Timeline::Begin(int32_t set, const std::string& op, const std::vector<std::string>& names,
                     size_t bytes) {
  if (!file_) return;
  begin_ = Clock::now();
  op_ = Upper(op);
  rows_.clear();
  for (const auto& name : names) {
    rows_.push_back(Tid(set, name));
    auto it = negotiating_.find(rows_.back());
    if (it == negotiating_.end()) continue;
    std::ostringstream os;
    os << "{\"name\":\"" << it->second.event << "\",\"ph\":\"E\",\"pid\":0,\"tid\":\""
       << rows_.back() << "\",\"ts\":" << Us(Micros(begin_)) << "}";
    Emit(os.str());
    negotiating_.erase(it);
  }
  bytes_ = bytes;
  how_ = nullptr;
}

void Timeline::End(const std::string& status) {
  if (!file_ || rows_.empty()) return;
  auto end = Clock::now();
  for (const auto& tid : rows_) {
    std::ostringstream os;
    os << "{\"name\":\"" << op_ << "\",\"ph\":\"X\",\"pid\":0,\"tid\":\"" << tid
       << "\",\"ts\":" << Us(Micros(begin_)) << ",\"dur\":" << Us(Micros(end) - Micros(begin_))
       << ",\"args\":{\"bytes\":" << bytes_ << ",\"fused\":" << rows_.size() << ",\"status\":\""
       << JsonEscape(status) << "\"";
    if (how_ != nullptr) os << ",\"algorithm\":\"" << how_ << "\"";
    os << "}}";
    Emit(os.str());
  }
  rows_.clear();
}

}  // namespace hvd
