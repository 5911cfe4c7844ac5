// Plans: how each collective runs. For one response the planner picks the view of the
// transport (the whole world, or a host's ranks and the ranks across hosts) and the algorithm,
// from the response's size and facts every rank shares (the job's layout, the options), never
// from timings: every rank must pick the same plan. Collectives run what they are given.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/collectives.h"
#include "coordinator/messages.h"
#include "hvd/options.h"

namespace hvd {

// What the plans depend on, the same on every rank.
struct PlanContext {
  int size = 1;
  bool offload = false;  // a backend runs whole-world collectives itself (MPI, shared memory)
  bool offload_pieces = false;  // and takes a fused allreduce's tensors where they lie
  bool hierarchical = false;  // the layout allows hierarchical collectives (Topology::Homogeneous)
  int local_size = 1;
  int cross_size = 1;
  Options::Toggle hierarchical_allreduce = Options::Toggle::kAuto;
  Options::Toggle hierarchical_allgather = Options::Toggle::kAuto;
  size_t small_allreduce_bytes = kSmallAllreduceBytes;  // recursive doubling up to this
  size_t staging_piece_bytes = size_t{4} << 20;          // Options::staging_piece_bytes
};

// c with a response list's knobs (rank 0's, the same on every member).
PlanContext WithKnobs(PlanContext c, const PlanKnobs& knobs);
// The knobs a job runs with when nothing tunes them: its options'.
PlanKnobs DefaultKnobs(const Options& options);

// Where a plan's bytes go: hvd's algorithm over the plan's view (flat or hierarchical); a
// backend that runs whole allreduces (MPI); or one that also takes the fused tensors where they
// lie, with no fusion buffer (shared memory between every rank).
enum class AllreduceBackend { kAlgorithm, kOffload, kOffloadPieces };

struct AllreducePlan {
  AllreduceBackend backend = AllreduceBackend::kAlgorithm;
  bool hierarchical = false;
  // The flat algorithm over the world, or, when hierarchical, the one across hosts.
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing;
};

// Up to `small_bytes` (kSmallAllreduceBytes unless tuned) recursive doubling (fewest
// messages), above it the pipelined ring (each byte crosses 2(p-1)/p links).
AllreduceAlgorithm FlatAllreduceAlgorithm(size_t bytes, size_t small_bytes = kSmallAllreduceBytes);

AllreducePlan PlanAllreduce(size_t count, DataType dtype, const PlanContext& c);

// Device tensors on device collectives (NCCL, engine/execute_device.cc): hierarchical, the
// collectives inside each host and the host path across hosts through pinned host memory, only
// when HVD_HIERARCHICAL_ALLREDUCE is on (or tuned on) and the layout allows it. `auto` leaves
// the whole allreduce to NCCL, which spans hosts itself (as Horovod does by default).
bool PlanHierarchicalDeviceAllreduce(const PlanContext& c);

// A staged allreduce's pieces (engine/execute_device.cc): `bytes` of a buffer split into pieces
// of at least `c.staging_piece_bytes` and at most kMaxStagingPieces, each but the last a
// multiple of 16 bytes (so of every element size); one piece when pieces are off (0) or the
// buffer is no larger than one; none for an empty buffer. Each is {offset, bytes}.
constexpr size_t kMaxStagingPieces = 16;
struct StagingPiece {
  size_t offset;
  size_t bytes;
};
std::vector<StagingPiece> PlanStagingPieces(size_t bytes, const PlanContext& c);

// Allgather: hierarchical (collectives/hierarchical.cc) or the flat ring, from the output's size.
bool PlanHierarchicalAllgather(size_t total_bytes, const PlanContext& c);

// The scratch the plan's algorithm uses (engine/execute.cc reserves it before any byte moves).
size_t PlanScratchBytes(const AllreducePlan& plan, size_t count, DataType dtype,
                        const PlanContext& c);

}  // namespace hvd
