// Allgatherv on a ring, pipelined in segments, receiving straight into the final place.
//
// Block b (bytes[b] bytes) sits at offset sum(bytes[0..b)) of out. Rank r sends only to r+1 and
// receives only from r-1 (mod p).
//   1. Copy this rank's block from `in` to its place in out, unless it already sits there.
//   2. Post every receive at once: ring step t = 0 .. p-2 receives block r-t-1 (mod p), segment
//      by segment (kSegmentBytes), straight into its place in out. Each byte of out is written
//      by one receive only and read by sends only after that receive completed, so no buffer
//      is touched while a request on it is pending.
//   3. Step 0 sends this rank's own block (from `in`) to the right.
//   4. In order, wait for each received segment and, unless t is the last step, send it on to
//      the right as the same segment of step t+1.
//   5. Wait for every send.
// Zero-byte blocks have no segments, so they cost no messages.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/pipeline.h"

namespace hvd {

Status Allgatherv(Transport& t, const void* in, void* out, const std::vector<size_t>& bytes,
                  Deadline deadline) {
  const int p = t.size();
  const int r = t.rank();
  if (static_cast<int>(bytes.size()) != p) {
    return Status::InvalidArgument("allgatherv: " + std::to_string(bytes.size()) +
                                   " block sizes for " + std::to_string(p) + " ranks");
  }
  const std::vector<size_t> offsets = PrefixOffsets(bytes);
  auto* base = static_cast<uint8_t*>(out);
  const auto* mine = static_cast<const uint8_t*>(in);
  // 1. Own block into place.
  if (bytes[r] > 0 && mine != base + offsets[r]) std::memcpy(base + offsets[r], mine, bytes[r]);
  if (p == 1) return Status::OK();
  if (CollectiveOffload* o = t.offload()) {
    if (std::optional<Status> s = o->Allgatherv(base + offsets[r], out, bytes, deadline)) return *s;
  }
  const int left = PositiveMod(r - 1, p);
  const int right = PositiveMod(r + 1, p);
  // 2. Every receive up front.
  std::vector<Segment> segs;
  for (int step = 0; step < p - 1; ++step) {
    const int b = PositiveMod(r - step - 1, p);
    AppendSegments(&segs, step, offsets[b], bytes[b], kSegmentBytes);
  }
  std::vector<TransportRequest> recvs;
  recvs.reserve(segs.size());
  for (const Segment& s : segs) recvs.push_back(t.Irecv(left, base + s.offset, s.count));
  // 3. Own block out.
  std::vector<TransportRequest> sends;
  for (size_t done = 0; done < bytes[r]; done += kSegmentBytes) {
    const size_t n = bytes[r] - done < kSegmentBytes ? bytes[r] - done : kSegmentBytes;
    sends.push_back(t.Isend(right, mine + done, n));
  }
  // 4. Forward what arrives.
  for (size_t k = 0; k < segs.size(); ++k) {
    HVD_RETURN_IF_ERROR(t.Wait(recvs[k], deadline));
    if (segs[k].step < p - 2) sends.push_back(t.Isend(right, base + segs[k].offset, segs[k].count));
  }
  // 5. Drain the sends.
  return t.WaitAll(sends, deadline);
}

}  // namespace hvd
