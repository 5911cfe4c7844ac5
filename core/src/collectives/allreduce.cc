// Allreduce dispatcher: picks the algorithm for one buffer.
//
//   1. Validate the arguments; an empty buffer or a world of one rank has nothing to do.
//   2. kAuto takes the planner's rule for a flat allreduce (planner/plan.h), from the
//      arguments alone, so that every rank picks the same algorithm.
//   3. Run the algorithm; its status (a transport failure unchanged) is returned.
#include "collectives/collectives.h"
#include "planner/plan.h"

namespace hvd {

size_t AllreduceScratchBytes(size_t count, DataType dtype, int ranks) {
  const size_t esize = DataTypeSize(dtype);
  if (count == 0 || ranks <= 1 || esize == 0) return 0;
  if (FlatAllreduceAlgorithm(count * esize) == AllreduceAlgorithm::kRecursiveDoubling) {
    return count * esize;
  }
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
  if (algo == AllreduceAlgorithm::kAuto) algo = FlatAllreduceAlgorithm(count * esize);
  if (algo == AllreduceAlgorithm::kRecursiveDoubling) {
    return RecursiveDoublingAllreduce(t, buf, count, dtype, op, scratch, deadline);
  }
  return RingAllreduce(t, buf, count, dtype, op, scratch, deadline);
}

bool OffersAllreducePieces(const Transport& t) {
  return t.offload() != nullptr && t.offload()->OffersAllreducePieces();
}

Status AllreducePieces(Transport& t, const std::vector<AllreducePiece>& pieces, DataType dtype,
                       ReduceOp op, double prescale, Deadline deadline) {
  if (DataTypeSize(dtype) == 0) return Status::InvalidArgument("allreduce: unknown dtype");
  if (static_cast<int>(op) >= kNumReduceOps) {
    return Status::InvalidArgument("allreduce: unknown reduce op");
  }
  if (!OffersAllreducePieces(t)) {
    return Status::InvalidArgument("allreduce in pieces: the transport does not offer it");
  }
  if (t.size() == 1) return Status::OK();  // the offload does not run a world of one
  return t.offload()->AllreducePieces(pieces, dtype, op, prescale, deadline);
}

}  // namespace hvd
