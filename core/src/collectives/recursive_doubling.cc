// Recursive-doubling allreduce: latency-optimised, log2(p) exchanges of the whole buffer.
//
// Let q be the largest power of two <= p and rem = p - q.
//   1. Fold in: among ranks 0 .. 2*rem-1, each even rank sends its buffer to the odd rank above
//      it and sits out; the odd rank reduces it into its own. Now q ranks take part, with
//      virtual ranks v = r/2 (odd r < 2*rem) or v = r - rem (r >= 2*rem).
//   2. For mask = 1, 2, 4, .. < q: exchange the whole buffer with virtual rank v ^ mask
//      (receiving into scratch), wait for both the send and the receive, then reduce the
//      scratch into buf. Both partners compute a (op) b with the operands swapped, which every
//      op gives bitwise the same, so all ranks end identical.
//   3. Fold out: each odd rank below 2*rem sends the result to the even rank below it, which
//      receives straight into buf.
#include <cstdint>

#include "collectives/collectives.h"
#include "reduce/reduce.h"

namespace hvd {
namespace {

// Real rank of virtual rank v in the power-of-two group.
int RealRank(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }

}  // namespace

Status RecursiveDoublingAllreduce(Transport& t, void* buf, size_t count, DataType dtype,
                                  ReduceOp op, ScratchBuffer& scratch, Deadline deadline) {
  const size_t bytes = count * DataTypeSize(dtype);
  if (DataTypeSize(dtype) == 0) {
    return Status::InvalidArgument("recursive doubling allreduce: unknown dtype");
  }
  const int p = t.size();
  const int r = t.rank();
  if (count == 0 || p == 1) return Status::OK();
  if (buf == nullptr) return Status::InvalidArgument("recursive doubling allreduce: null buffer");
  int q = 1;
  while (q * 2 <= p) q *= 2;
  const int rem = p - q;
  void* tmp = scratch.Get(bytes);  // owned by the caller's ScratchBuffer
  if (tmp == nullptr) {
    return Status::ResourceExhausted("recursive doubling allreduce: no memory for " +
                                     std::to_string(bytes) + " bytes of scratch");
  }

  // 1. Fold the extra ranks in.
  int v = r >= 2 * rem ? r - rem : -1;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      HVD_RETURN_IF_ERROR(t.Send(r + 1, buf, bytes, deadline));
    } else {
      HVD_RETURN_IF_ERROR(t.Recv(r - 1, tmp, bytes, deadline));
      ReduceInto(buf, tmp, count, dtype, op);
      v = r / 2;
    }
  }
  // 2. Exchange and reduce with partners at distance 1, 2, 4, ...
  if (v >= 0) {
    for (int mask = 1; mask < q; mask <<= 1) {
      const int peer = RealRank(v ^ mask, rem);
      HVD_RETURN_IF_ERROR(t.SendRecv(peer, buf, bytes, peer, tmp, bytes, deadline));
      ReduceInto(buf, tmp, count, dtype, op);
    }
  }
  // 3. Fold the result back out.
  if (r < 2 * rem) {
    if (r % 2 == 1) return t.Send(r - 1, buf, bytes, deadline);
    return t.Recv(r + 1, buf, bytes, deadline);
  }
  return Status::OK();
}

}  // namespace hvd
