// The timeline (HVD_TIMELINE=path, or HOROVOD_TIMELINE): a Chrome trace (chrome://tracing,
// Perfetto) of what the engine did with each tensor, in Horovod's names: NEGOTIATE_ALLREDUCE
// (from the first rank known ready until its response ran), then ALLREDUCE (the collective, with
// bytes and the number of fused tensors as arguments), one row per tensor (a tensor of a process
// set other than the global one: its name and "(process set N)"); with mark_cycles
// (HVD_TIMELINE_MARK_CYCLES) a CYCLE_START mark each time the engine's loop starts a cycle of
// work.
//
// Under NEGOTIATE_ALLREDUCE each rank's readiness is a tick (a zero-length event named by the
// rank), as in Horovod, so a late rank shows: this rank's own when it announced the tensor, and
// the others' as their announcements reached it (rank 0 sees every rank's: the requests and
// cached bits the coordinator takes, and the parts of each symmetric round). As in Horovod the
// bar is written as it opens (a "B" event at the first rank seen ready, each tick as it comes,
// the "E" when the response runs), so a negotiation that never ends (a rank that never submits
// the tensor) shows as an open bar with the ticks of the ranks that did.
//
// Every rank writes its own file: "%r" in the path is replaced by the rank; a path without
// "%r" is written by rank 0 only. Events are buffered and written when the engine goes idle
// (at most every 10 ms), at least every second while it is busy, and when it shuts down, so
// the hot path stays cheap and a job that hangs or is killed leaves its timeline on disk. Each
// write ends the file with the array's closing bracket (the next one writes over it), so the
// file is whole JSON between writes: also after a SIGTERM or SIGKILL (where it can seek: a pipe
// gets the bracket at the end only). Timestamps and durations
// are microseconds since the file began, to the nanosecond, however long the job runs.
//
// Thread-safety: not thread-safe; used by one thread at a time, the one running the engine's
// work (the background thread or a waiting caller; engine/engine_impl.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/time.h"

namespace hvd {

// HVD_TIMELINE=DYNAMIC (any case): no file until Engine::StartTimeline.
bool IsDynamicTimeline(const std::string& path);

class Timeline {
 public:
  Timeline(const std::string& path_pattern, int rank, bool mark_cycles = false);
  ~Timeline();
  bool enabled() const { return file_ != nullptr; }
  bool marks_cycles() const { return file_ != nullptr && mark_cycles_; }

  // This rank announced a tensor of process set `set`; `op`: its kind (OpTypeName). Inline:
  // the drain calls it for every tensor.
  void Negotiate(int32_t set, const std::string& name, const char* op) {
    if (file_) RankReady(set, name, op, rank_, Clock::now());
  }
  // World rank `rank` was seen ready for `name` at `t` (its first sighting counts).
  void RankReady(int32_t set, const std::string& name, const char* op, int rank,
                 Clock::time_point t);
  // The response of `names` (of process set `set`) runs now, then ends with `status`.
  void Begin(int32_t set, const std::string& op, const std::vector<std::string>& names,
             size_t bytes);
  void End(const std::string& status);
  // How the response in progress runs (an allreduce's plan), shown in its bars' args as
  // "algorithm"; cleared at the next Begin.
  void Algorithm(const char* how) {
    if (file_) how_ = how;
  }
  void MarkCycle(Clock::time_point start);  // a CYCLE_START mark, with mark_cycles
  // Writes what is buffered: when `idle` at most every kIdleFlush (10 ms), else every
  // kBusyFlush (1 s). IdleFlushIn: how long an idle engine may sleep before its next Tick.
  void Tick(bool idle);
  Clock::duration IdleFlushIn() const;
  void Flush();

 private:
  double Micros(Clock::time_point t) const;
  // A number of microseconds as JSON, in fixed notation with three decimals.
  static std::string Us(double micros);
  void Emit(const std::string& event);

  // The row of `name` of process set `set`, escaped for JSON.
  static std::string Tid(int32_t set, const std::string& name);

  // A tensor being negotiated, its bar open in the file: the bar's name and start, and the
  // ranks seen ready.
  struct Negotiation {
    std::string event;
    double start = 0;
    std::vector<int> ranks;
  };

  FILE* file_ = nullptr;
  int rank_ = 0;
  bool mark_cycles_ = false;
  Clock::time_point start_;
  Clock::time_point flushed_;
  std::unordered_map<std::string, Negotiation> negotiating_;  // by row (Tid)
  std::vector<std::string> rows_;  // of the response in progress
  std::string op_;
  size_t bytes_ = 0;
  const char* how_ = nullptr;  // static text (Algorithm)
  Clock::time_point begin_;
  std::vector<std::string> buffer_;
  bool first_ = true;
  bool closed_ = false;  // the file ends with kTail (timeline.cc)
  // A file that cannot seek (a pipe, /dev/stdout) gets kTail once, at the end.
  bool seekable_ = false;
};

}  // namespace hvd
