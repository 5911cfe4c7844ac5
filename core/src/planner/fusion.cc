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

std::vector<Response> FuseResponses(std::vector<Response> responses, size_t threshold_bytes) {
  if (threshold_bytes == 0) return responses;
  std::vector<Response> out;
  std::vector<size_t> out_bytes;
  for (auto& r : responses) {
    size_t bytes = r.type == OpType::kAllreduce ? ResponseBytes(r) : 0;
    bool merged = false;
    if (r.type == OpType::kAllreduce && bytes < threshold_bytes) {
      // Join the most recent compatible fused response that still has room.
      for (size_t i = out.size(); i-- > 0;) {
        if (Fusable(out[i], r) && out_bytes[i] + bytes <= threshold_bytes) {
          out[i].names.insert(out[i].names.end(), std::make_move_iterator(r.names.begin()),
                              std::make_move_iterator(r.names.end()));
          out[i].shapes.insert(out[i].shapes.end(), std::make_move_iterator(r.shapes.begin()),
                               std::make_move_iterator(r.shapes.end()));
          out_bytes[i] += bytes;
          merged = true;
          break;
        }
      }
    }
    if (!merged) {
      out_bytes.push_back(bytes);
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace hvd
