// Hierarchical allreduce over two group views of one transport (transport/group_view.h):
//   1. Reduce-scatter over `local` (this host's ranks): local rank i ends with part i of the
//      host's sum, parts split as evenly as the count allows.
//   2. Allreduce of part i over `cross` (rank i of every host): each part crosses the network
//      once per host instead of the whole buffer crossing it 2(p-1)/p times on a flat ring.
//   3. Allgather over `local`: every rank gets every part.
// Every host must have local.size() ranks (the cross view of each part has one rank per host);
// the planner uses a flat algorithm otherwise.
#include <algorithm>
#include <vector>

#include "collectives/collectives.h"

namespace hvd {

namespace {

std::vector<size_t> Parts(size_t count, int n) {
  std::vector<size_t> parts(static_cast<size_t>(n), count / n);
  for (size_t i = 0; i < count % n; ++i) ++parts[i];
  return parts;
}

}  // namespace

size_t HierarchicalAllreduceScratchBytes(size_t count, DataType dtype, int local_size,
                                         int cross_size) {
  if (count == 0 || local_size < 1) return 0;
  std::vector<size_t> parts = Parts(count, local_size);
  size_t rs = local_size > 1 ? ReduceScatterScratchBytes(parts, dtype) : 0;
  // The largest part sets the most scratch either algorithm uses across hosts.
  size_t ar = 0;
  if (cross_size > 1) {
    ar = std::max(RingAllreduceScratchBytes(parts[0], dtype, cross_size),
                  parts[0] * DataTypeSize(dtype));
  }
  return rs > ar ? rs : ar;
}

Status HierarchicalAllreduce(Transport& local, Transport& cross, void* buf, size_t count,
                             DataType dtype, ReduceOp op, ScratchBuffer& scratch,
                             Deadline deadline, AllreduceAlgorithm cross_algo) {
  const size_t esize = DataTypeSize(dtype);
  if (esize == 0) return Status::InvalidArgument("hierarchical allreduce: unknown dtype");
  if (count == 0 || local.size() * cross.size() == 1) return Status::OK();
  if (buf == nullptr) return Status::InvalidArgument("hierarchical allreduce: null buffer");
  const int l = local.rank();
  const std::vector<size_t> parts = Parts(count, local.size());
  size_t offset = 0;
  for (int i = 0; i < l; ++i) offset += parts[i];
  char* mine = static_cast<char*>(buf) + offset * esize;
  if (local.size() > 1) {
    HVD_RETURN_IF_ERROR(ReduceScatter(local, buf, mine, parts, dtype, op, scratch, deadline));
  }
  if (cross.size() > 1 && parts[l] > 0) {
    HVD_RETURN_IF_ERROR(Allreduce(cross, mine, parts[l], dtype, op, scratch, deadline, cross_algo));
  }
  if (local.size() > 1) {
    std::vector<size_t> bytes(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) bytes[i] = parts[i] * esize;
    HVD_RETURN_IF_ERROR(Allgatherv(local, mine, buf, bytes, deadline));
  }
  return Status::OK();
}

}  // namespace hvd
