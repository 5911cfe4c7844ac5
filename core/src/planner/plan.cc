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

bool PlanHierarchicalAllgather(size_t total_bytes, const PlanContext& c) {
  if (c.offload || !c.hierarchical) return false;
  return c.hierarchical_allgather == Options::Toggle::kOn ||
         (c.hierarchical_allgather == Options::Toggle::kAuto &&
          total_bytes >= kSmallAllreduceBytes);
}

size_t PlanScratchBytes(const AllreducePlan& plan, size_t count, DataType dtype,
                        const PlanContext& c) {
  if (plan.hierarchical) {
    return HierarchicalAllreduceScratchBytes(count, dtype, c.local_size, c.cross_size);
  }
  return AllreduceScratchBytes(count, dtype, c.size);
}

}  // namespace hvd
