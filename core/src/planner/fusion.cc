#include "planner/fusion.h"

#include <iterator>

namespace hvd {

namespace {

bool Fusable(const Response& a, const Response& b) {
  return a.type == OpType::kAllreduce && b.type == OpType::kAllreduce && a.dtype == b.dtype &&
         a.op == b.op && a.prescale == b.prescale && a.postscale == b.postscale &&
         a.joined == b.joined && a.device == b.device;
}

}  // namespace

size_t ResponseBytes(const Response& r) {
  size_t n = 0;
  for (const auto& s : r.shapes) n += static_cast<size_t>(NumElements(s));
  return n * DataTypeSize(r.dtype);
}

size_t RequestBytes(const Request& q) {
  return static_cast<size_t>(NumElements(q.shape)) * DataTypeSize(q.dtype);
}

Response* ResponseFuser::Join(const Response& like, size_t bytes) {
  if (threshold_ == 0 || like.type != OpType::kAllreduce || bytes >= threshold_) return nullptr;
  // The most recent compatible fused response that still has room.
  for (size_t i = out_.size(); i-- > 0;) {
    if (Fusable(out_[i], like) && bytes_[i] + bytes <= threshold_) {
      bytes_[i] += bytes;
      return &out_[i];
    }
  }
  return nullptr;
}

Response& ResponseFuser::Start(Response r, size_t bytes) {
  bytes_.push_back(bytes);
  out_.push_back(std::move(r));
  return out_.back();
}

std::vector<Response> FuseResponses(std::vector<Response> responses, size_t threshold_bytes) {
  if (threshold_bytes == 0) return responses;
  ResponseFuser fuser(threshold_bytes);
  for (auto& r : responses) {
    const size_t bytes = r.type == OpType::kAllreduce ? ResponseBytes(r) : 0;
    if (Response* into = fuser.Join(r, bytes)) {
      if (!into->groups.empty() || !r.groups.empty()) {  // parallel to the names, or empty
        into->groups.resize(into->names.size());
        into->group_sizes.resize(into->names.size(), 0);
        r.groups.resize(r.names.size());
        r.group_sizes.resize(r.names.size(), 0);
        into->groups.insert(into->groups.end(), std::make_move_iterator(r.groups.begin()),
                            std::make_move_iterator(r.groups.end()));
        into->group_sizes.insert(into->group_sizes.end(), r.group_sizes.begin(),
                                 r.group_sizes.end());
      }
      into->names.insert(into->names.end(), std::make_move_iterator(r.names.begin()),
                         std::make_move_iterator(r.names.end()));
      into->shapes.insert(into->shapes.end(), std::make_move_iterator(r.shapes.begin()),
                          std::make_move_iterator(r.shapes.end()));
    } else {
      fuser.Start(std::move(r), bytes);
    }
  }
  return fuser.Take();
}

}  // namespace hvd
