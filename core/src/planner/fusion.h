// Fusion: merges ready allreduce responses that can share one buffer and one collective.
//
// Two responses fuse when they have the same op (allreduce), dtype, reduce op, scale factors
// and neither is an error, and the fused byte count stays within the threshold (0 disables
// fusion). Order is kept: a fused response takes the place of its first member.
//
// Thread-safety: pure function.
#pragma once

#include <vector>

#include "coordinator/messages.h"

namespace hvd {

std::vector<Response> FuseResponses(std::vector<Response> responses, size_t threshold_bytes);

// Bytes the tensors of an allreduce response occupy.
size_t ResponseBytes(const Response& r);

}  // namespace hvd
