// HVD_CPU_OPERATIONS=mpi: the collectives on the engine's buffers run as MPI's non-blocking
// collectives (MPI_Iallreduce, MPI_Iallgatherv, MPI_Ibcast, MPI_Ialltoallv,
// MPI_Ireduce_scatter, MPI_Ibarrier) on hvd's private communicator, each completed by
// MpiContext::Wait under the collective's deadline.
//
// Types and ops: the integer and float types map to MPI's own types and MPI_SUM / MIN / MAX /
// PROD (bool: MPI_LOR for sum and max, MPI_LAND for min and product, as hvd's kernels do).
// float16 and bfloat16 travel as MPI_UINT16_T with user-defined commutative ops that call
// hvd's reduction kernels (reduce/reduce.h).
//
// Sizes: no MPI call moves more than 64 MiB, so that heartbeats go out between calls (MPI's
// calls hold the thread) and the deadline bounds each call, not the whole collective.
// Allreduce and broadcast go in chunks of their buffer; allgatherv, alltoallv and
// reducescatter in rounds, each moving a share of every rank's block (a reducescatter's round
// packed into one run first, as MPI takes it). MPI-3 counts and displacements are ints:
// allgatherv and reducescatter whose totals exceed INT_MAX are left to hvd's algorithms (every
// rank sees the same sizes, so every rank decides alike); alltoallv, whose sizes differ per
// rank, first agrees on that and on its number of rounds with one MPI_Iallreduce.
//
// Thread-safety: not thread-safe; used by one thread at a time, the one running the engine's
// work (the background thread or a waiting caller; engine/engine_impl.h).
#pragma once

#include <vector>

#include "transport/collective_offload.h"
#include "transport/mpi/mpi_context.h"

namespace hvd {

class MpiCollectives : public CollectiveOffload {
 public:
  explicit MpiCollectives(MpiContext& mpi);  // `mpi` must outlive this object
  ~MpiCollectives() override;

  void SetWaitPoll(std::function<Status()> poll) override { mpi_.SetWaitPoll(std::move(poll)); }

  std::optional<Status> Allreduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                                  Deadline deadline) override;
  std::optional<Status> Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes,
                                   Deadline deadline) override;
  std::optional<Status> Broadcast(void* buf, size_t bytes, int root, Deadline deadline) override;
  std::optional<Status> Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                                  const std::vector<size_t>& recv_bytes, Deadline deadline) override;
  std::optional<Status> ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                      DataType dtype, ReduceOp op, Deadline deadline) override;
  std::optional<Status> Barrier(Deadline deadline) override;

  // Frees the MPI operations it made (before MPI_Finalize; MpiContext::FinishEarly). No
  // collective may run afterwards. Idempotent.
  void ReleaseOps();

 private:
  MPI_Op OpFor(DataType dtype, ReduceOp op) const;
  // Starts one MPI call (which fills *req) and waits for it.
  template <typename Start>
  Status Run(const char* what, Deadline deadline, Start start);
  // `in` itself, or a copy of its first `bytes` bytes when it overlaps [out, out + out_bytes).
  const void* Unaliased(const void* in, size_t bytes, const void* out, size_t out_bytes);

  MpiContext& mpi_;
  // [float16, bfloat16][op]; MPI_OP_NULL for Adasum, which MPI does not run.
  MPI_Op half_ops_[2][kNumReduceOps];
  std::vector<uint8_t> copy_;          // input copies for aliased buffers
  std::vector<uint8_t> stage_;         // a reducescatter round's packed input
};

}  // namespace hvd
