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

// Builds the same fused responses one tensor at a time, for callers that have the tensors'
// fields without a response each (the response cache's fast path).
class ResponseFuser {
 public:
  explicit ResponseFuser(size_t threshold_bytes) : threshold_(threshold_bytes) {}
  // The fused response that a tensor with `like`'s fields and `bytes` bytes joins (its name
  // and shape are for the caller to append), or null: the caller then appends a response of
  // its own with Start().
  Response* Join(const Response& like, size_t bytes);
  // Appends `r` (its tensors counted as `bytes`) as a response of its own.
  Response& Start(Response r, size_t bytes);
  std::vector<Response> Take() { return std::move(out_); }

 private:
  size_t threshold_;
  std::vector<Response> out_;
  std::vector<size_t> bytes_;
};

// Bytes the tensors of an allreduce response occupy.
size_t ResponseBytes(const Response& r);
// Bytes of a request's tensor (an allgather's or alltoall's output may be larger).
size_t RequestBytes(const Request& q);

}  // namespace hvd
