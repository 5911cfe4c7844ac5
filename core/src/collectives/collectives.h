// The collective algorithms, written only against Transport. Each one is called by every rank
// of the transport with matching arguments, from the rank's background thread. When the
// transport carries a CollectiveOffload (HVD_CPU_OPERATIONS=mpi), each entry point below hands
// the call to it after checking the arguments (transport/collective_offload.h).
//
// Every function returns the transport's failure (PeerLost, Timeout) unchanged, or
// InvalidArgument for inconsistent arguments. `scratch` is a reusable buffer owned by the caller
// (the engine keeps one per process so that memory stays flat).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/time.h"
#include "hvd/status.h"
#include "hvd/types.h"
#include "transport/collective_offload.h"
#include "transport/transport.h"

namespace hvd {

class ScratchBuffer {
 public:
  // Returns at least `bytes` bytes, 64-byte aligned; contents undefined. Valid until the next
  // Get with a larger size. Null when the memory cannot be had (never throws: it runs on the
  // background thread); the buffer is then empty.
  void* Get(size_t bytes);
  size_t capacity() const { return capacity_; }
  ~ScratchBuffer();

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

enum class AllreduceAlgorithm { kAuto = 0, kRing, kRecursiveDoubling };

// Buffers at or under this size use recursive doubling under kAuto; larger ones the ring
// (the planner's rule: planner/plan.h).
constexpr size_t kSmallAllreduceBytes = 64 * 1024;

// In place: buf holds this rank's count elements and ends with the reduction over all ranks.
// ReduceOp::kAverage reduces like kSum here (the engine applies the scale factors).
Status Allreduce(Transport& t, void* buf, size_t count, DataType dtype, ReduceOp op,
                 ScratchBuffer& scratch, Deadline deadline,
                 AllreduceAlgorithm algo = AllreduceAlgorithm::kAuto);

// The same over the concatenation of `pieces`, read and written where they lie, where the
// transport's offload offers it (transport/collective_offload.h; the same on every rank).
bool OffersAllreducePieces(const Transport& t);
Status AllreducePieces(Transport& t, const std::vector<AllreducePiece>& pieces, DataType dtype,
                       ReduceOp op, double prescale, Deadline deadline);

// Ring: reduce-scatter then allgather, each step pipelined in segments so that sending,
// receiving and reducing overlap.
Status RingAllreduce(Transport& t, void* buf, size_t count, DataType dtype, ReduceOp op,
                     ScratchBuffer& scratch, Deadline deadline);
size_t RingAllreduceScratchBytes(size_t count, DataType dtype, int ranks);
// Latency-optimised: log2(p) exchanges of the whole buffer (non-powers of two fold the extra
// ranks in first and out last).
Status RecursiveDoublingAllreduce(Transport& t, void* buf, size_t count, DataType dtype,
                                  ReduceOp op, ScratchBuffer& scratch, Deadline deadline);

// Reduce-scatter over `local`, allreduce of this rank's part over `cross`, allgather over
// `local` (collectives/hierarchical.cc). local and cross are group views of one transport: the
// ranks of this host, and the ranks with this rank's local index on every host; every host has
// local.size() ranks.
// `cross_algo` runs across hosts.
Status HierarchicalAllreduce(Transport& local, Transport& cross, void* buf, size_t count,
                             DataType dtype, ReduceOp op, ScratchBuffer& scratch,
                             Deadline deadline,
                             AllreduceAlgorithm cross_algo = AllreduceAlgorithm::kAuto);
// The elements of `count` each of a host's n ranks reduces (and holds after the reduce-scatter)
// in hierarchical allreduce: count / n each, the first count % n one more.
std::vector<size_t> HierarchicalParts(size_t count, int n);
size_t HierarchicalAllreduceScratchBytes(size_t count, DataType dtype, int local_size,
                                         int cross_size);

// Allgatherv over the same two views (collectives/hierarchical.cc): each host's bytes cross the
// network once, split among its ranks. hosts[k] lists, in `local`'s order, the world ranks of
// the host of `cross`'s member k; bytes[r] is world rank r's part, and `out` receives every part
// in world-rank order, as Allgatherv. `in` must not overlap `out`.
Status HierarchicalAllgatherv(Transport& local, Transport& cross,
                              const std::vector<std::vector<int>>& hosts, const void* in,
                              void* out, const std::vector<size_t>& bytes, ScratchBuffer& scratch,
                              Deadline deadline);
size_t HierarchicalAllgatherScratchBytes(const std::vector<std::vector<int>>& hosts,
                                         const std::vector<size_t>& bytes);

// out = concatenation over ranks r of bytes[r] bytes; this rank's part is `in`
// (in may already sit at its place inside out).
Status Allgatherv(Transport& t, const void* in, void* out, const std::vector<size_t>& bytes,
                  Deadline deadline);

// Root's buf is copied into every other rank's buf.
Status Broadcast(Transport& t, void* buf, size_t bytes, int root, Deadline deadline);

// send_bytes[j] bytes starting at the sum of send_bytes[0..j) go to rank j; from rank j
// recv_bytes[j] bytes land at the sum of recv_bytes[0..j) in out.
Status Alltoallv(Transport& t, const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes, Deadline deadline);

// in holds sum(counts) elements; rank r ends with the reduction of elements
// [sum(counts[0..r)), +counts[r]) in out (counts[r] elements).
Status ReduceScatter(Transport& t, const void* in, void* out, const std::vector<size_t>& counts,
                     DataType dtype, ReduceOp op, ScratchBuffer& scratch, Deadline deadline);

// Returns once every rank has entered.
Status Barrier(Transport& t, Deadline deadline);

// Adasum (adasum.cc) of a buffer holding tensors of `counts` elements one after the other, each
// combined with its own dot products; float32 or float64, on a power-of-two number of ranks.
// Every rank ends with the same result.
Status AdasumAllreduce(Transport& t, void* buf, const std::vector<size_t>& counts, DataType dtype,
                       ScratchBuffer& scratch, Deadline deadline);
size_t AdasumScratchBytes(size_t count, DataType dtype);

// The bytes of `scratch` that Allreduce (kAuto) and ReduceScatter use for these arguments on
// `ranks` ranks. The engine reserves them before a collective starts, so that running out of
// memory is found before any byte moves (engine/execute.cc). A collective whose scratch cannot
// be had anyway returns ResourceExhausted.
size_t AllreduceScratchBytes(size_t count, DataType dtype, int ranks);
size_t ReduceScatterScratchBytes(const std::vector<size_t>& counts, DataType dtype);

}  // namespace hvd
