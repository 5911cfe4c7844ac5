// Alltoallv: post everything, then wait.
//
//   1. Check that both split vectors have one entry per rank and that the bytes this rank keeps
//      agree (send_bytes[r] == recv_bytes[r]).
//   2. Post the receives from r-1, r-2, .. (mod p) straight into their places in out, then the
//      sends to r+1, r+2, .. (mod p): staggering the peers spreads the load so that no rank is
//      everyone's first partner. Zero-byte splits post nothing.
//   3. Copy this rank's own part from in to out locally.
//   4. Wait for every receive, then every send.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/pipeline.h"

namespace hvd {

Status Alltoallv(Transport& t, const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes, Deadline deadline) {
  const int p = t.size();
  const int r = t.rank();
  if (static_cast<int>(send_bytes.size()) != p || static_cast<int>(recv_bytes.size()) != p) {
    return Status::InvalidArgument("alltoallv: split vectors need " + std::to_string(p) +
                                   " entries, got " + std::to_string(send_bytes.size()) +
                                   " and " + std::to_string(recv_bytes.size()));
  }
  if (send_bytes[r] != recv_bytes[r]) {
    return Status::InvalidArgument("alltoallv: rank " + std::to_string(r) + " sends itself " +
                                   std::to_string(send_bytes[r]) + " bytes but expects " +
                                   std::to_string(recv_bytes[r]));
  }
  if (CollectiveOffload* o = t.offload()) {
    if (std::optional<Status> s = o->Alltoallv(in, send_bytes, out, recv_bytes, deadline)) return *s;
  }
  const std::vector<size_t> soff = PrefixOffsets(send_bytes);
  const std::vector<size_t> roff = PrefixOffsets(recv_bytes);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  std::vector<TransportRequest> recvs;
  std::vector<TransportRequest> sends;
  for (int k = 1; k < p; ++k) {
    const int from = PositiveMod(r - k, p);
    if (recv_bytes[from] > 0) recvs.push_back(t.Irecv(from, dst + roff[from], recv_bytes[from]));
  }
  for (int k = 1; k < p; ++k) {
    const int to = PositiveMod(r + k, p);
    if (send_bytes[to] > 0) sends.push_back(t.Isend(to, src + soff[to], send_bytes[to]));
  }
  if (send_bytes[r] > 0 && src + soff[r] != dst + roff[r]) {
    std::memcpy(dst + roff[r], src + soff[r], send_bytes[r]);
  }
  HVD_RETURN_IF_ERROR(t.WaitAll(recvs, deadline));
  return t.WaitAll(sends, deadline);
}

}  // namespace hvd
