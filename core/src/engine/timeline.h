// The timeline (HVD_TIMELINE=path): a Chrome trace (chrome://tracing, Perfetto) of what the
// background thread did with each tensor: when it was announced (NEGOTIATE) and when its
// collective ran (the op's name), with bytes and fused names as arguments.
//
// Every rank writes its own file: "%r" in the path is replaced by the rank; a path without
// "%r" is written by rank 0 only. Events are buffered and written when the engine shuts down
// or the buffer grows past a few thousand events, so the hot path stays cheap.
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

class Timeline {
 public:
  Timeline(const std::string& path_pattern, int rank);
  ~Timeline();
  bool enabled() const { return file_ != nullptr; }

  void Negotiate(const std::string& name);  // a tensor was announced
  void Begin(const std::string& op, const std::vector<std::string>& names, size_t bytes);
  void End(const std::string& status);
  void Flush();

 private:
  double Micros(Clock::time_point t) const;
  void Emit(const std::string& event);

  FILE* file_ = nullptr;
  Clock::time_point start_;
  std::unordered_map<std::string, Clock::time_point> negotiating_;
  std::vector<std::string> names_;  // of the response in progress
  std::string op_;
  size_t bytes_ = 0;
  Clock::time_point begin_;
  std::vector<std::string> buffer_;
  bool first_ = true;
};

}  // namespace hvd
