// The timeline (HVD_TIMELINE=path, or HOROVOD_TIMELINE): a Chrome trace (chrome://tracing,
// Perfetto) of what the engine did with each tensor, in Horovod's names: NEGOTIATE_ALLREDUCE
// (announced until its response ran), then ALLREDUCE (the collective, with bytes and the number
// of fused tensors as arguments), one row per tensor; with mark_cycles (HVD_TIMELINE_MARK_CYCLES)
// a CYCLE_START mark each time the engine's loop starts a cycle of work.
//
// Every rank writes its own file: "%r" in the path is replaced by the rank; a path without
// "%r" is written by rank 0 only. Events are buffered and written when the engine goes idle
// (at most every 10 ms), at least every second while it is busy, and when it shuts down, so
// the hot path stays cheap and a job that hangs or is killed leaves its timeline on disk.
//
// Thread-safety: not thread-safe; used by one thread at a time, the one running the engine's
// work (the background thread or a waiting caller; engine/engine_impl.h).
#pragma once

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

  void Negotiate(const std::string& name);  // a tensor was announced
  void Begin(const std::string& op, const std::vector<std::string>& names, size_t bytes);
  void End(const std::string& status);
  void MarkCycle(Clock::time_point start);  // a CYCLE_START mark, with mark_cycles
  // Writes what is buffered: when `idle` at most every kIdleFlush (10 ms), else every
  // kBusyFlush (1 s). IdleFlushIn: how long an idle engine may sleep before its next Tick.
  void Tick(bool idle);
  Clock::duration IdleFlushIn() const;
  void Flush();

 private:
  double Micros(Clock::time_point t) const;
  void Emit(const std::string& event);

  FILE* file_ = nullptr;
  bool mark_cycles_ = false;
  Clock::time_point start_;
  Clock::time_point flushed_;
  std::unordered_map<std::string, Clock::time_point> negotiating_;
  std::vector<std::string> names_;  // of the response in progress
  std::string op_;
  size_t bytes_ = 0;
  Clock::time_point begin_;
  std::vector<std::string> buffer_;
  bool first_ = true;
};

}  // namespace hvd
