// Allreduce dispatcher: picks the algorithm for one buffer.
//
//   1. Validate the arguments; an empty buffer or a world of one rank has nothing to do.
//   2. kAuto picks from the arguments alone (count x dtype size), never from timings, so that
//      every rank picks the same algorithm: up to kSmallAllreduceBytes recursive doubling
//      (fewest messages), above it the pipelined ring (each byte crosses 2(p-1)/p links).
//   3. Run the algorithm; its status (a transport failure unchanged) is returned.
#include "collectives/collectives.h"

namespace hvd {

size_t AllreduceScratchBytes(size_t count, DataType dtype, int ranks) {
  const size_t esize = DataTypeSize(dtype);
  if (count == 0 || ranks <= 1 || esize == 0) return 0;
  if (count * esize <= kSmallAllreduceBytes) return count * esize;  // recursive doubling
  return RingAllreduceScratchBytes(count, dtype, ranks);
}

Status Allreduce(Transport& t, void* buf, size_t count, DataType dtype, ReduceOp op,
                 ScratchBuffer& scratch, Deadline deadline, AllreduceAlgorithm algo) {
  const size_t esize = DataTypeSize(dtype);
  if (esize == 0) return Status::InvalidArgument("allreduce: unknown dtype");
  if (static_cast<int>(op) >= kNumReduceOps) {
    return Status::InvalidArgument("allreduce: unknown reduce op");
  }
  if (count == 0 || t.size() == 1) return Status::OK();
  if (buf == nullptr) return Status::InvalidArgument("allreduce: null buffer");
  if (CollectiveOffload* o = t.offload()) {
    if (std::optional<Status> s = o->Allreduce(buf, count, dtype, op, deadline)) return *s;
  }
  if (algo == AllreduceAlgorithm::kAuto) {
    algo = count * esize <= kSmallAllreduceBytes ? AllreduceAlgorithm::kRecursiveDoubling
                                                 : AllreduceAlgorithm::kRing;
  }
  if (algo == AllreduceAlgorithm::kRecursiveDoubling) {
    return RecursiveDoublingAllreduce(t, buf, count, dtype, op, scratch, deadline);
  }
  return RingAllreduce(t, buf, count, dtype, op, scratch, deadline);
}

}  // namespace hvd
