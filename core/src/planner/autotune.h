// Autotune (HVD_AUTOTUNE=1, as HOROVOD_AUTOTUNE): rank 0 tunes the fusion threshold and the
// cycle time while the job runs, from the throughput it measures, and where they matter the
// hierarchical allreduce choice and the flat algorithms' threshold.
//
// A sample is `steps_per_sample` response lists that rank 0 sends under one setting; its score
// is the bytes of the tensors in them after the first list, over the time from the first list
// to the last (bytes per second: the training step's compute between lists counts in, the same
// for every setting). The first `warmup_samples` samples run the starting setting and are not
// scored. Then the search goes one setting at a time (coordinate descent):
//   1. the cycle times (the starting one, 0, 1 and 5 ms) at the starting fusion threshold;
//   2. the fusion thresholds (the starting one, 1, 4, 16, 64 and 128 MiB) at the best cycle;
//   3. when the layout allows hierarchical allreduce and the job left it to the planner
//      (Scope::hierarchical): the planner's rule, on, and off, at the best of 1 and 2;
//   4. when hvd's own algorithms move the bytes (Scope::algorithm: no backend runs whole
//      allreduces itself): the largest allreduce that recursive doubling takes (the starting
//      one, 0: the ring always, 16 KiB, 256 KiB and 1 MiB; the ring above it).
// As in Horovod, a knob the job set itself (HVD_/HOROVOD_CYCLE_TIME, _FUSION_THRESHOLD, and so
// hvdrun's --cycle-time-ms, --fusion-threshold-mb; the hierarchical choice when not left at
// auto) is held constant: its phase is left out (Scope), and the others tune around its value.
// In each phase every candidate is sampled in turn, kRounds times (a shared machine is noisy),
// and the best mean score wins; the last phase's winner is kept for the rest of the job. The
// settings act almost independently (the cycle is a wait per list, the threshold how many
// ready tensors one collective takes, the last two how a fused buffer crosses the links), so
// this finds the grid's best in few candidates, and spends fewer samples on the slow ones.
// Every sample, and the choice, go to the log file when one is given (CSV).
//
// The first two take effect on rank 0 alone: it fuses the responses and waits the cycle time,
// and every rank rebuilds cached responses with the threshold rank 0 sends in each list. The
// last two travel with each response list as its PlanKnobs, so every member plans the list's
// allreduces alike.
//
// Thread-safety: not thread-safe; on rank 0, used by one thread at a time, the one running the
// engine's work (the background thread or a waiting caller; engine/engine_impl.h).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "common/time.h"
#include "coordinator/messages.h"

namespace hvd {

class Autotuner {
 public:
  struct Setting {
    size_t fusion_bytes = 0;
    double cycle_ms = 0;
    PlanKnobs knobs;
  };
  // The phases that apply to this job (see above): the first two unless the job set their
  // knob, the last two where the job allows them.
  struct Scope {
    bool cycle = true;
    bool fusion = true;
    bool hierarchical = false;
    bool algorithm = false;
  };

  Autotuner(Setting start, int warmup_samples, int steps_per_sample, const std::string& log_path,
            Scope scope);
  // The first two phases only.
  Autotuner(Setting start, int warmup_samples, int steps_per_sample, const std::string& log_path)
      : Autotuner(start, warmup_samples, steps_per_sample, log_path, Scope{}) {}
  ~Autotuner();
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // Whether any phase applies (else done() from the start, with the starting setting).
  bool tunes_anything() const { return phase_ >= 0; }
  // A response list carrying `bytes` of tensors went out at `now`.
  void Record(size_t bytes, Clock::time_point now);
  const Setting& current() const { return current_; }
  bool done() const { return done_; }
  // The current phase's candidates in the order they are sampled (phase 1 starts with the
  // starting setting; phase 2 with the starting threshold at the best cycle time).
  const std::vector<Setting>& candidates() const { return candidates_; }
  // 0: cycle times; 1: fusion thresholds; 2: hierarchical allreduce; 3: algorithm threshold
  // (-1: none applies).
  int phase() const { return phase_; }

 private:
  void FinishSample(double score);
  bool StartPhase(int phase, const Setting& best);  // false: the phase does not apply
  void Add(Setting s);  // a candidate, unless it is one already

  static constexpr int kRounds = 2;

  std::vector<Setting> candidates_;  // of the current phase
  std::vector<double> totals_;  // per candidate: the sum of its scores
  const Setting start_;
  const Scope scope_;
  Setting current_;
  int phase_ = 0;
  size_t index_ = 0;  // samples scored in this phase
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
