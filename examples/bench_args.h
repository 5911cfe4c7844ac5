// Command-line options of hvd_bench (see Usage() in bench_args.cc for the flags).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <string>

#include "hvd/raw.h"
#include "hvd/types.h"

namespace hvd_bench {

struct BenchArgs {
  hvd::RawCollective coll = hvd::RawCollective::kAllreduce;
  size_t min_bytes = 4;
  size_t max_bytes = size_t{64} << 20;
  size_t factor = 4;
  int iters = 0;             // 0: derived per size from budget_mb, clamped to [5, 100]
  double budget_mb = 2048;   // -B: per-size data budget in MiB
  int warmup = 3;
  hvd::DataType dtype = hvd::DataType::kFloat32;
  hvd::ReduceOp op = hvd::ReduceOp::kSum;
  bool raw = false;
  int tensors = 1;           // --tensors: allreduces per step
  bool paired = false;       // --paired: each step of --tensors also as one tensor of the same bytes
  bool grouped = false;      // --grouped: each step of --tensors as one GroupedAllreduce
  int sets = 1;              // --sets: process sets (rank % sets) that run the sweep at once
  bool csv = false;
  bool check = true;
  bool help = false;
};

// Parses argv. On failure returns false and sets *error to a one-line message.
bool ParseBenchArgs(int argc, char** argv, BenchArgs* out, std::string* error);

// The usage text, for --help and after a bad flag.
std::string BenchUsage(const char* argv0);

const char* CollectiveName(hvd::RawCollective c);

// Timed iterations for one size: the -n value, or clamp(budget / bytes, 5, 100).
int ItersForSize(const BenchArgs& args, size_t bytes);

}  // namespace hvd_bench
