#include "planner/plan.h"

namespace hvd {

AllreduceAlgorithm FlatAllreduceAlgorithm(size_t bytes) {
  return bytes <= kSmallAllreduceBytes ? AllreduceAlgorithm::kRecursiveDoubling
                                       : AllreduceAlgorithm::kRing;
}

AllreducePlan PlanAllreduce(size_t count, DataType dtype, const PlanContext& c) {
  const size_t bytes = count * DataTypeSize(dtype);
  AllreducePlan plan;
  plan.algorithm = FlatAllreduceAlgorithm(bytes);
  if (c.offload || !c.hierarchical) return plan;
  const bool on = c.hierarchical_allreduce == Options::Toggle::kOn ||
                  (c.hierarchical_allreduce == Options::Toggle::kAuto &&
                   bytes >= kSmallAllreduceBytes);
  if (!on) return plan;
  plan.hierarchical = true;
  // Each rank's part of the buffer crosses the hosts.
  plan.algorithm = FlatAllreduceAlgorithm((bytes + c.local_size - 1) / c.local_size);
  return plan;
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
  return AllreduceScratchBytes(count, dtype, c.size);
}

}  // namespace hvd
