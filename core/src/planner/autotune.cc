#include "planner/autotune.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/logging.h"

namespace hvd {

namespace {
const char* ToggleName(int32_t t) { return t == 1 ? "on" : t == 2 ? "off" : "auto"; }
}  // namespace

Autotuner::Autotuner(Setting start, int warmup_samples, int steps_per_sample,
                     const std::string& log_path, Scope scope)
    : start_(start),
      scope_(scope),
      current_(start),
      warmup_samples_(warmup_samples < 0 ? 0 : warmup_samples),
      steps_per_sample_(steps_per_sample < 2 ? 2 : steps_per_sample) {
  phase_ = -1;
  for (int phase = 0; phase <= 3; ++phase) {
    if (StartPhase(phase, start)) break;
  }
  if (phase_ < 0) {
    done_ = true;  // the job set every knob there is to tune here
    return;
  }
  if (!log_path.empty()) {
    log_ = std::fopen(log_path.c_str(), "w");
    if (!log_) {
      HVD_LOG(kWarning) << "HVD_AUTOTUNE_LOG: cannot write " << log_path << " ("
                        << std::strerror(errno) << "); autotune runs without its log";
    } else {
      std::fprintf(log_, "sample,fusion_threshold_bytes,cycle_time_ms,hierarchical_allreduce,"
                         "small_allreduce_bytes,score_bytes_per_s\n");
    }
  }
}

void Autotuner::Add(Setting s) {
  for (const Setting& c : candidates_) {
    if (c.fusion_bytes == s.fusion_bytes && c.cycle_ms == s.cycle_ms && c.knobs == s.knobs) {
      return;
    }
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
    const Setting& c = candidates_[ran];
    std::fprintf(log_, "%d,%zu,%g,%s,%llu,%.0f\n", scored, c.fusion_bytes, c.cycle_ms,
                 ToggleName(c.knobs.hierarchical_allreduce),
                 static_cast<unsigned long long>(c.knobs.small_allreduce_bytes), score);
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
  const Setting winner = candidates_[best];
  for (int next = phase_ + 1; next <= 3; ++next) {
    if (StartPhase(next, winner)) return;
  }
  current_ = winner;
  done_ = true;
  if (log_) {
    std::fprintf(log_, "best,%zu,%g,%s,%llu,%.0f\n", current_.fusion_bytes, current_.cycle_ms,
                 ToggleName(current_.knobs.hierarchical_allreduce),
                 static_cast<unsigned long long>(current_.knobs.small_allreduce_bytes),
                 totals_[best] / kRounds);
    std::fflush(log_);
  }
}

bool Autotuner::StartPhase(int phase, const Setting& best) {
  if ((phase == 0 && !scope_.cycle) || (phase == 1 && !scope_.fusion) ||
      (phase == 2 && !scope_.hierarchical) || (phase == 3 && !scope_.algorithm)) {
    return false;
  }
  candidates_.clear();
  Add(best);  // each phase starts from the best so far
  Setting c = best;
  if (phase == 0) {  // the cycle times (the starting one first), at the starting threshold
    for (double ms : {0.0, 1.0, 5.0}) {
      c.cycle_ms = ms;
      Add(c);
    }
  } else if (phase == 1) {  // the fusion thresholds, at the best cycle time
    candidates_.clear();
    c.fusion_bytes = start_.fusion_bytes;
    Add(c);
    for (size_t mib : {1, 4, 16, 64, 128}) {
      c.fusion_bytes = mib << 20;
      Add(c);
    }
  } else if (phase == 2) {  // hierarchical allreduce: the planner's rule, on, off
    for (int32_t t : {0, 1, 2}) {
      c.knobs.hierarchical_allreduce = t;
      Add(c);
    }
  } else if (phase == 3) {  // the largest allreduce recursive doubling takes
    for (uint64_t bytes : {uint64_t{0}, uint64_t{16} << 10, uint64_t{256} << 10, uint64_t{1} << 20}) {
      c.knobs.small_allreduce_bytes = bytes;
      Add(c);
    }
  }
  totals_.assign(candidates_.size(), 0.0);
  index_ = 0;
  phase_ = phase;
  current_ = candidates_[0];
  return true;
}

}  // namespace hvd
