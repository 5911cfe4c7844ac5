#include "planner/autotune.h"

#include <chrono>

namespace hvd {

Autotuner::Autotuner(Setting start, int warmup_samples, int steps_per_sample,
                     const std::string& log_path)
    : start_(start),
      current_(start),
      warmup_samples_(warmup_samples < 0 ? 0 : warmup_samples),
      steps_per_sample_(steps_per_sample < 2 ? 2 : steps_per_sample) {
  // Phase 1: the cycle times, at the starting threshold.
  for (double ms : {start.cycle_ms, 0.0, 1.0, 5.0}) Add(Setting{start.fusion_bytes, ms});
  totals_.assign(candidates_.size(), 0.0);
  if (!log_path.empty()) {
    log_ = std::fopen(log_path.c_str(), "w");
    if (log_) std::fprintf(log_, "sample,fusion_threshold_bytes,cycle_time_ms,score_bytes_per_s\n");
  }
}

void Autotuner::Add(Setting s) {
  for (const Setting& c : candidates_) {
    if (c.fusion_bytes == s.fusion_bytes && c.cycle_ms == s.cycle_ms) return;
  }
  candidates_.push_back(s);
}

Autotuner::~Autotuner() {
  if (log_) std::fclose(log_);
}

void Autotuner::Record(size_t bytes, Clock::time_point now) {
  if (done_) return;
  if (steps_ == 0) {
    first_ = now;
    bytes_ = 0;
  } else {
    bytes_ += bytes;
  }
  if (++steps_ < steps_per_sample_) return;
  const double seconds = std::chrono::duration<double>(now - first_).count();
  steps_ = 0;
  FinishSample(seconds > 0 ? static_cast<double>(bytes_) / seconds : 0.0);
}

void Autotuner::FinishSample(double score) {
  const int scored = sample_ - warmup_samples_;  // scored samples before this one, if >= 0
  ++sample_;
  if (scored < 0) return;  // warm-up: the starting setting (candidate 0) runs on
  const size_t n = candidates_.size();
  const size_t ran = index_ % n;
  totals_[ran] += score;
  if (log_) {
    std::fprintf(log_, "%d,%zu,%g,%.0f\n", scored, candidates_[ran].fusion_bytes,
                 candidates_[ran].cycle_ms, score);
    std::fflush(log_);
  }
  if (++index_ < n * kRounds) {
    current_ = candidates_[index_ % n];
    return;
  }
  size_t best = 0;
  for (size_t i = 1; i < n; ++i) {
    if (totals_[i] > totals_[best]) best = i;
  }
  if (phase_ == 0) {
    // Phase 2: the fusion thresholds, at the best cycle time.
    const double cycle = candidates_[best].cycle_ms;
    candidates_.clear();
    Add(Setting{start_.fusion_bytes, cycle});
    for (size_t mib : {1, 4, 16, 64, 128}) Add(Setting{mib << 20, cycle});
    totals_.assign(candidates_.size(), 0.0);
    index_ = 0;
    phase_ = 1;
    current_ = candidates_[0];
    return;
  }
  current_ = candidates_[best];
  done_ = true;
  if (log_) {
    std::fprintf(log_, "best,%zu,%g,%.0f\n", current_.fusion_bytes, current_.cycle_ms,
                 totals_[best] / kRounds);
    std::fflush(log_);
  }
}

}  // namespace hvd
