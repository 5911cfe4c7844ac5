#include "planner/plan.h"

#include <algorithm>

namespace hvd {

static_assert(PlanKnobs().small_allreduce_bytes == kSmallAllreduceBytes,
              "the knobs' default is the planner's");
static_assert(PlanKnobs().staging_piece_bytes == PlanContext().staging_piece_bytes,
              "one default piece of a staged allreduce (Options' is checked by a unit test)");

AllreduceAlgorithm FlatAllreduceAlgorithm(size_t bytes, size_t small_bytes) {
  return bytes <= small_bytes ? AllreduceAlgorithm::kRecursiveDoubling : AllreduceAlgorithm::kRing;
}

PlanContext WithKnobs(PlanContext c, const PlanKnobs& knobs) {
  c.hierarchical_allreduce = static_cast<Options::Toggle>(knobs.hierarchical_allreduce);
  c.small_allreduce_bytes = static_cast<size_t>(knobs.small_allreduce_bytes);
  c.staging_piece_bytes = static_cast<size_t>(knobs.staging_piece_bytes);
  return c;
}

PlanKnobs DefaultKnobs(const Options& options) {
  PlanKnobs k;
  k.hierarchical_allreduce = static_cast<int32_t>(options.hierarchical_allreduce);
  k.staging_piece_bytes = options.staging_piece_bytes;
  return k;
}

std::vector<StagingPiece> PlanStagingPieces(size_t bytes, const PlanContext& c) {
  std::vector<StagingPiece> pieces;
  if (bytes == 0) return pieces;
  if (c.staging_piece_bytes == 0 || bytes <= c.staging_piece_bytes) return {{0, bytes}};
  size_t piece = std::max(c.staging_piece_bytes, (bytes + kMaxStagingPieces - 1) / kMaxStagingPieces);
  piece = (piece + 15) / 16 * 16;
  for (size_t at = 0; at < bytes; at += piece) pieces.push_back({at, std::min(piece, bytes - at)});
  return pieces;
}

AllreducePlan PlanAllreduce(size_t count, DataType dtype, const PlanContext& c) {
  const size_t bytes = count * DataTypeSize(dtype);
  AllreducePlan plan;
  plan.algorithm = FlatAllreduceAlgorithm(bytes, c.small_allreduce_bytes);
  if (c.offload) {
    plan.backend = c.offload_pieces ? AllreduceBackend::kOffloadPieces : AllreduceBackend::kOffload;
    return plan;
  }
  if (!c.hierarchical) return plan;
  const bool on = c.hierarchical_allreduce == Options::Toggle::kOn ||
                  (c.hierarchical_allreduce == Options::Toggle::kAuto &&
                   bytes >= kSmallAllreduceBytes);
  if (!on) return plan;
  plan.hierarchical = true;
  // Each rank's part of the buffer crosses the hosts.
  plan.algorithm = FlatAllreduceAlgorithm((bytes + c.local_size - 1) / c.local_size,
                                         c.small_allreduce_bytes);
  return plan;
}

bool PlanHierarchicalDeviceAllreduce(const PlanContext& c) {
  return c.hierarchical && c.hierarchical_allreduce == Options::Toggle::kOn;
}

// Measured over rate-limited veth (2 hosts x 2 ranks, 2 Gbit/s): hierarchical allgather is
// 1.1-1.6x the flat ring from 256 KiB of output up, and slower below (0.6x at 64 KiB).
constexpr size_t kHierarchicalAllgatherBytes = 256 << 10;

bool PlanHierarchicalAllgather(size_t total_bytes, const PlanContext& c) {
  if (c.offload || !c.hierarchical) return false;
  return c.hierarchical_allgather == Options::Toggle::kOn ||
         (c.hierarchical_allgather == Options::Toggle::kAuto &&
          total_bytes >= kHierarchicalAllgatherBytes);
}

size_t PlanScratchBytes(const AllreducePlan& plan, size_t count, DataType dtype,
                        const PlanContext& c) {
  if (plan.hierarchical) {
    return HierarchicalAllreduceScratchBytes(count, dtype, c.local_size, c.cross_size);
  }
  if (count == 0 || c.size <= 1) return 0;
  // What the plan's algorithm uses (the threshold may be tuned away from the default).
  return plan.algorithm == AllreduceAlgorithm::kRecursiveDoubling
             ? count * DataTypeSize(dtype)
             : RingAllreduceScratchBytes(count, dtype, c.size);
}

}  // namespace hvd
