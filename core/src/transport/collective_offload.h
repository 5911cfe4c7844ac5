// A backend that runs whole collectives itself instead of hvd's algorithms over point-to-point
// messages: MPI's collectives when HVD_CPU_OPERATIONS=mpi. A Transport may carry one
// (Transport::offload()); the entry points in collectives/collectives.h then hand each call to
// it after checking the arguments. The algorithms themselves never see it.
//
// Every method has the meaning of the entry point of the same name in collectives.h. It returns
// nullopt when it leaves this call to hvd's algorithm (the decision depends only on arguments
// that are equal on every rank, so all ranks decide alike), or the collective's status:
// PeerLost or Timeout mean, as for a Transport, that the communicator is gone.
//
// Waiting: a collective in flight polls `poll` (SetWaitPoll) every few tens of microseconds, so
// the engine's control plane (heartbeats, negotiation of other process sets, the relay of an
// abort) goes on while it waits; a backend whose waits run the engine's io_context themselves
// (shared memory) has no need of it. A non-OK status from it ends the wait with that status;
// the communicator is then gone, as after a timeout.
//
// Thread-safety: not thread-safe; used only by the thread running the engine's work (see
// engine/engine_impl.h), like the transport.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "common/time.h"
#include "hvd/status.h"
#include "hvd/types.h"

namespace hvd {

// One tensor of a fused allreduce handed over in place (AllreducePieces): `count` elements
// read from `in` (null: this rank contributes zeros) and the result written to `out` (null:
// dropped; may equal `in`).
struct AllreducePiece {
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
};

class CollectiveOffload {
 public:
  virtual ~CollectiveOffload() = default;

  // Called by the engine once, before the first collective (see Waiting above).
  virtual void SetWaitPoll(std::function<Status()> poll) = 0;

  // Whether AllreducePieces is offered. It depends on the backend alone, so it is the same on
  // every rank; where it is not, the caller fuses into a buffer and calls Allreduce.
  virtual bool OffersAllreducePieces() const { return false; }
  // Allreduce of the pieces' concatenation, each input read where it lies (times `prescale`)
  // and each output written there, with no fusion buffer between. Every rank calls it with the
  // same counts.
  virtual Status AllreducePieces(const std::vector<AllreducePiece>& pieces, DataType dtype,
                                 ReduceOp op, double prescale, Deadline deadline) {
    (void)pieces, (void)dtype, (void)op, (void)prescale, (void)deadline;
    return Status::Internal("this backend does not take an allreduce in pieces");
  }

  // In place; kAverage reduces like kSum (the caller scales).
  virtual std::optional<Status> Allreduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                                          Deadline deadline) = 0;
  virtual std::optional<Status> Allgatherv(const void* in, void* out,
                                           const std::vector<size_t>& bytes, Deadline deadline) = 0;
  virtual std::optional<Status> Broadcast(void* buf, size_t bytes, int root, Deadline deadline) = 0;
  virtual std::optional<Status> Alltoallv(const void* in, const std::vector<size_t>& send_bytes,
                                          void* out, const std::vector<size_t>& recv_bytes,
                                          Deadline deadline) = 0;
  virtual std::optional<Status> ReduceScatter(const void* in, void* out,
                                              const std::vector<size_t>& counts, DataType dtype,
                                              ReduceOp op, Deadline deadline) = 0;
  virtual std::optional<Status> Barrier(Deadline deadline) = 0;
};

}  // namespace hvd
