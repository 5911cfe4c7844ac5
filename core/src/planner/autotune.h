// Autotune (HVD_AUTOTUNE=1, as HOROVOD_AUTOTUNE): rank 0 tunes the fusion threshold and the
// cycle time while the job runs, from the throughput it measures.
//
// A sample is `steps_per_sample` response lists that rank 0 sends under one setting; its score
// is the bytes of the tensors in them after the first list, over the time from the first list
// to the last (bytes per second: the training step's compute between lists counts in, the same
// for every setting). The first `warmup_samples` samples run the starting setting and are not
// scored. Then every candidate of a grid (fusion threshold x cycle time, the starting setting
// included) is sampled in turn, the whole grid kRounds times (a shared machine is noisy), and
// the candidate with the best mean score is kept for the rest of the job.
// Every sample, and the choice, go to the log file when one is given (CSV).
//
// Both settings take effect on rank 0 alone: it fuses the responses and waits the cycle time,
// and every rank rebuilds cached responses with the threshold rank 0 sends in each list.
//
// Thread-safety: not thread-safe; rank 0's background thread only.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "common/time.h"

namespace hvd {

class Autotuner {
 public:
  struct Setting {
    size_t fusion_bytes = 0;
    double cycle_ms = 0;
  };

  Autotuner(Setting start, int warmup_samples, int steps_per_sample, const std::string& log_path);
  ~Autotuner();
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // A response list carrying `bytes` of tensors went out at `now`.
  void Record(size_t bytes, Clock::time_point now);
  const Setting& current() const { return current_; }
  bool done() const { return done_; }
  // The candidates in the order they are sampled (the starting setting first).
  const std::vector<Setting>& candidates() const { return candidates_; }

 private:
  void FinishSample(double score);

  static constexpr int kRounds = 2;

  std::vector<Setting> candidates_;
  std::vector<double> totals_;  // per candidate: the sum of its scores
  Setting current_;
  const int warmup_samples_;
  const int steps_per_sample_;
  int sample_ = 0;       // samples finished (warm-up included)
  int steps_ = 0;        // lists in the current sample
  size_t bytes_ = 0;     // after its first list
  Clock::time_point first_;
  bool done_ = false;
  std::FILE* log_ = nullptr;
};

}  // namespace hvd
