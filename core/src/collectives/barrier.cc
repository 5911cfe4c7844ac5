// Barrier by dissemination: ceil(log2(p)) rounds of 1-byte messages.
//
//   1. Round k (distance d = 1, 2, 4, .. < p): send one byte to rank r+d and receive one byte
//      from rank r-d (mod p), both posted at once.
//   2. After round k a rank has heard, directly or through others, from the 2d ranks below it;
//      after the last round from every rank, so no rank leaves before all have entered.
#include <cstdint>

#include "collectives/collectives.h"
#include "collectives/pipeline.h"

namespace hvd {

Status Barrier(Transport& t, Deadline deadline) {
  const int p = t.size();
  const int r = t.rank();
  if (CollectiveOffload* o = t.offload()) {
    if (std::optional<Status> s = o->Barrier(deadline)) return *s;
  }
  for (int d = 1; d < p; d <<= 1) {
    const uint8_t token = 1;
    uint8_t got = 0;
    HVD_RETURN_IF_ERROR(t.SendRecv(PositiveMod(r + d, p), &token, 1, PositiveMod(r - d, p), &got,
                                   1, deadline));
  }
  return Status::OK();
}

}  // namespace hvd
