// Broadcast from `root`: binomial tree for small buffers, pipelined chain for large ones.
//
// Ranks are renumbered relative to the root: v = r - root (mod p), so the root is v = 0.
// Small (bytes <= kSmallBroadcastBytes), binomial tree, ceil(log2(p)) hops of the whole buffer:
//   1. A rank v > 0 receives from v minus its lowest set bit.
//   2. It then sends to v + m for every power of two m below its lowest set bit (the root: below
//      p), largest first, and waits for those sends.
// Large, chain v = 0 -> 1 -> .. -> p-1, pipelined in segments of kSegmentBytes:
//   1. The root sends every segment to v = 1.
//   2. Every other rank posts all its receives (straight into buf) at once; as each segment
//      arrives it is sent on to v + 1 (the last rank sends nothing). Each byte is written once,
//      by its receive, before any send reads it.
//   3. Every send is waited for.
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/pipeline.h"

namespace hvd {
namespace {

Status TreeBroadcast(Transport& t, void* buf, size_t bytes, int root, Deadline deadline) {
  const int p = t.size();
  const int v = PositiveMod(t.rank() - root, p);
  int mask = 1;
  while (mask < p) {
    if (v & mask) {
      HVD_RETURN_IF_ERROR(t.Recv(PositiveMod(v - mask + root, p), buf, bytes, deadline));
      break;
    }
    mask <<= 1;
  }
  std::vector<TransportRequest> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < p) sends.push_back(t.Isend(PositiveMod(v + mask + root, p), buf, bytes));
  }
  return t.WaitAll(sends, deadline);
}

Status ChainBroadcast(Transport& t, void* buf, size_t bytes, int root, Deadline deadline) {
  const int p = t.size();
  const int v = PositiveMod(t.rank() - root, p);
  const int prev = PositiveMod(t.rank() - 1, p);
  const int next = PositiveMod(t.rank() + 1, p);
  auto* base = static_cast<uint8_t*>(buf);
  std::vector<Segment> segs;
  AppendSegments(&segs, 0, 0, bytes, kSegmentBytes);
  std::vector<TransportRequest> sends;
  if (v == 0) {
    for (const Segment& s : segs) sends.push_back(t.Isend(next, base + s.offset, s.count));
    return t.WaitAll(sends, deadline);
  }
  std::vector<TransportRequest> recvs;
  recvs.reserve(segs.size());
  for (const Segment& s : segs) recvs.push_back(t.Irecv(prev, base + s.offset, s.count));
  for (size_t k = 0; k < segs.size(); ++k) {
    HVD_RETURN_IF_ERROR(t.Wait(recvs[k], deadline));
    if (v < p - 1) sends.push_back(t.Isend(next, base + segs[k].offset, segs[k].count));
  }
  return t.WaitAll(sends, deadline);
}

}  // namespace

Status Broadcast(Transport& t, void* buf, size_t bytes, int root, Deadline deadline) {
  const int p = t.size();
  if (root < 0 || root >= p) {
    return Status::InvalidArgument("broadcast: root " + std::to_string(root) +
                                   " outside a world of " + std::to_string(p));
  }
  if (p == 1 || bytes == 0) return Status::OK();
  if (buf == nullptr) return Status::InvalidArgument("broadcast: null buffer");
  if (CollectiveOffload* o = t.offload()) {
    if (std::optional<Status> s = o->Broadcast(buf, bytes, root, deadline)) return *s;
  }
  if (bytes <= kSmallBroadcastBytes) return TreeBroadcast(t, buf, bytes, root, deadline);
  return ChainBroadcast(t, buf, bytes, root, deadline);
}

}  // namespace hvd
