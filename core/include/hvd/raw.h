// Benchmark hook: runs one collective directly on the engine's transport, without negotiation,
// fusion or the response cache, to separate the algorithm's cost from the engine's.
//
// Thread-safety: every rank must call it in the same order, from one thread, while none of its
// other operations are in flight. Blocks until the collective has finished.
#pragma once

#include <cstddef>

#include "hvd/engine.h"

namespace hvd {

enum class RawCollective { kAllreduce, kAllgather, kBroadcast, kAlltoall, kReducescatter };

// Buffers, by collective (count = elements in `in`):
//   allreduce      in -> out, count elements (out may equal in)
//   allgather      in: count elements; out: count * size elements
//   broadcast      in -> out from rank 0, count elements (out may equal in)
//   alltoall       in: count elements, count divisible by size; out: count elements
//   reducescatter  in: count elements, count divisible by size; out: count / size elements
// op applies to allreduce and reducescatter (kAverage reduces like kSum, then scales).
//
// With `seconds`, the background thread first meets the other ranks in a barrier on the
// transport, then times the collective alone and stores its duration there: the bare
// collective, as MPI benchmarks time MPI_Allreduce after MPI_Barrier, without the hand-over to
// and from the background thread.
HVD_EXPORT Status RunRawCollective(Engine& engine, RawCollective coll, const void* in, void* out,
                                   size_t count, DataType dtype, ReduceOp op,
                                   double* seconds = nullptr);

// What negotiation has cost this rank since the engine started: the background thread's time
// announcing tensors, agreeing on them (rank 0: the AND of the ranks' bits and the coordinator)
// and building the responses to execute; the request and response lists it sent; the tensors
// that went as response-cache bits. Read before and after a run to separate negotiation from
// the rest of a step.
struct NegotiationCounters {
  uint64_t nanoseconds = 0;
  uint64_t messages = 0;
  uint64_t cache_hits = 0;
  // Of nanoseconds: the per-tensor part (the pending table and the response-cache lookup of each
  // tensor taken in, the agreed responses built from cache bits). The rest is the agreement.
  uint64_t bookkeeping_nanoseconds = 0;
  // Fast-path steps (the cached tensors agreed at once, by a round or a list of bits from rank
  // 0), and of them those whose responses were taken again from one of the last few steps of
  // the same bits instead of being rebuilt from the cache.
  uint64_t fast_path_steps = 0;
  uint64_t fast_path_steps_reused = 0;
};
HVD_EXPORT NegotiationCounters ReadNegotiationCounters(Engine& engine);

// Whether the global set agrees on cached tensors in rounds, every rank sending its part to
// every other (HVD_SYMMETRIC_NEGOTIATION), rather than rank 0 answering. Fixed at creation.
HVD_EXPORT bool NegotiatesInRounds(Engine& engine);

}  // namespace hvd
