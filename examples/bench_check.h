// Fill pattern and result check of hvd_bench, for every dtype, op and collective.
//
// Rank r fills element i with v(r, i) = (r + 1) * ((i % 13) + 1), stored in the dtype (integers
// wrap, bool keeps the lowest bit, float16/bfloat16 round to nearest even). The expected result
// of every element is computed by formula from the 13 * p distinct stored values, never by
// running a second collective.
//
// Thread-safety: a Checker is immutable after construction; the functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hvd/raw.h"
#include "hvd/types.h"

namespace hvd_bench {

// Writes v(rank, i) for i in [0, count) into buf (dtype elements).
void Fill(void* buf, size_t count, hvd::DataType dtype, int rank);

class Checker {
 public:
  Checker(hvd::RawCollective coll, hvd::DataType dtype, hvd::ReduceOp op, int rank, int size);

  // Elements this rank's output holds when each rank's input has in_count elements.
  size_t OutputCount(size_t in_count) const;
  // Number of elements of out (OutputCount(in_count) of them) that differ from the formula.
  int64_t CountWrong(const void* out, size_t in_count) const;

 private:
  double Expected(size_t j, size_t in_count) const;
  bool Matches(double got, double want) const;

  hvd::RawCollective coll_;
  hvd::DataType dtype_;
  hvd::ReduceOp op_;
  int rank_;
  int size_;
  std::vector<double> stored_;   // [r * 13 + k]: v(r, k) as stored in the dtype
  std::vector<double> reduced_;  // [k]: the reduction over ranks, rounded to the dtype
};

}  // namespace hvd_bench
