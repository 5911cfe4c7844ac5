// Executing a response: every rank runs the same responses in the same order. Tensors this rank
// does not have (it has joined) take part as zeros (allreduce) or as empty (allgather).
#include <cstring>
#include <numeric>
#include <optional>

#include "common/logging.h"
#include "engine/engine_impl.h"
#include "reduce/reduce.h"

namespace hvd {

namespace {

int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// Rows of a first dimension of `rows` that rank r gets in a reducescatter.
int64_t PartRows(int64_t rows, int size, int r) { return rows / size + (r < rows % size ? 1 : 0); }

}  // namespace

Deadline EngineImpl::CollectiveDeadline() const {
  return DeadlineAfterSeconds(options_.timeout_seconds);
}

void EngineImpl::CompleteEntry(TensorEntry& e, const Status& status) {
  {
    std::lock_guard<std::mutex> l(mu_);
    in_flight_.erase(e.request.name);
  }
  e.handle->Complete(status);
}

void EngineImpl::Execute(const Response& r) {
  responses_executed_.fetch_add(1);
  // This rank's entries, taken out of pending_; null where this rank has joined.
  std::vector<std::optional<TensorEntry>> owned(r.names.size());
  std::vector<TensorEntry*> entries(r.names.size(), nullptr);
  bool mine = false;
  for (size_t i = 0; i < r.names.size(); ++i) {
    auto it = pending_.find(r.names[i]);
    if (it == pending_.end()) continue;
    owned[i] = std::move(it->second);
    pending_.erase(it);
    entries[i] = &*owned[i];
    mine = true;
  }
  if (!mine && !joined_ && r.type != OpType::kJoin && r.type != OpType::kError) {
    HVD_LOG(kError) << "response for '" << r.names[0] << "' that this rank never announced";
  }

  size_t bytes = 0;
  for (const auto& shape : r.shapes) bytes += static_cast<size_t>(NumElements(shape)) * DataTypeSize(r.dtype);
  timeline_->Begin(OpTypeName(r.type), r.names, bytes);
  Status s;
  switch (r.type) {
    case OpType::kError:
      s = Status(r.error_code, r.error);
      break;
    case OpType::kAllreduce:
      s = ExecuteAllreduce(r, entries);
      break;
    case OpType::kAllgather:
      s = ExecuteAllgather(r, entries[0]);
      break;
    case OpType::kBroadcast:
      s = ExecuteBroadcast(r, entries[0]);
      break;
    case OpType::kAlltoall:  // the coordinator refuses these while a rank has joined
      s = entries[0] ? ExecuteAlltoall(r, entries[0])
                     : Status::Internal("alltoall '" + r.names[0] + "' without a local tensor");
      break;
    case OpType::kReducescatter:
      s = entries[0] ? ExecuteReducescatter(r, entries[0])
                     : Status::Internal("reducescatter '" + r.names[0] + "' without a local tensor");
      break;
    case OpType::kBarrier:
      s = hvd::Barrier(*transport_, CollectiveDeadline());
      break;
    case OpType::kJoin:
      joined_ = false;
      for (auto* e : entries) {
        if (e) e->handle->join_last_rank_ = r.last_joined;
      }
      break;
  }
  timeline_->End(s.ok() ? "ok" : StatusCodeName(s.code()));
  bool comm_gone = r.type != OpType::kError &&
                   (s.code() == StatusCode::kPeerLost || s.code() == StatusCode::kTimeout);
  if (comm_gone) s = AwaitRootCause(s);
  if (!s.ok() && r.type != OpType::kError) {
    s = s.WithContext(std::string(OpTypeName(r.type)) + " '" + r.names[0] + "'" +
                      (r.names.size() > 1 ? " (fused with " + std::to_string(r.names.size() - 1) + " more)" : ""));
  }
  for (auto* e : entries) {
    if (e) CompleteEntry(*e, s);
  }
  if (comm_gone && abort_.ok()) abort_ = s;
}

Status EngineImpl::ExecuteAllreduce(const Response& r, std::vector<TensorEntry*>& entries) {
  const size_t esize = DataTypeSize(r.dtype);
  std::vector<size_t> counts;
  for (const auto& shape : r.shapes) counts.push_back(static_cast<size_t>(NumElements(shape)));
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  uint8_t* buf;
  bool fused = entries.size() > 1 || entries[0] == nullptr;
  if (!fused) {
    TensorEntry* e = entries[0];
    buf = static_cast<uint8_t*>(e->output.data);
    if (e->output.data != e->input.data && total > 0) std::memcpy(buf, e->input.data, total * esize);
  } else {
    buf = static_cast<uint8_t*>(fusion_.Get(total * esize));
    size_t off = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      size_t bytes = counts[i] * esize;
      if (entries[i]) {
        if (bytes) std::memcpy(buf + off, entries[i]->input.data, bytes);
      } else {
        std::memset(buf + off, 0, bytes);
      }
      off += bytes;
    }
  }
  Scale(buf, total, r.dtype, r.prescale);
  ReduceOp op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
  HVD_RETURN_IF_ERROR(hvd::Allreduce(*transport_, buf, total, r.dtype, op, scratch_,
                                     CollectiveDeadline()));
  double post = r.postscale;
  if (r.op == ReduceOp::kAverage) post /= options_.size;
  Scale(buf, total, r.dtype, post);
  if (fused) {
    size_t off = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      size_t bytes = counts[i] * esize;
      if (entries[i] && bytes) std::memcpy(entries[i]->output.data, buf + off, bytes);
      off += bytes;
    }
  }
  return Status::OK();
}

void* EngineImpl::AllocateOutput(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes) {
  e->handle->output_shape_ = shape;
  if (e->allocator) {
    void* p = e->allocator(shape);
    e->handle->output_data_ = p;
    return p;
  }
  e->handle->output_bytes_.resize(bytes);
  e->handle->output_data_ = e->handle->output_bytes_.data();
  return e->handle->output_data_;
}

Status EngineImpl::ExecuteAllgather(const Response& r, TensorEntry* e) {
  const int n = options_.size;
  const size_t row_bytes = static_cast<size_t>(RowElements(r.shapes[0])) * DataTypeSize(r.dtype);
  std::vector<size_t> bytes(n);
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) {
    bytes[i] = static_cast<size_t>(r.sizes[i]) * row_bytes;
    rows += r.sizes[i];
  }
  const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
  const size_t offset = std::accumulate(bytes.begin(), bytes.begin() + options_.rank, size_t{0});
  uint8_t* out;
  if (e) {
    std::vector<int64_t> shape = e->request.shape;
    shape[0] = rows;
    out = static_cast<uint8_t*>(AllocateOutput(e, shape, total));
    if (out == nullptr && total > 0) {
      return Status::InvalidArgument("the output allocator returned null");
    }
    if (bytes[options_.rank]) std::memcpy(out + offset, e->input.data, bytes[options_.rank]);
  } else {
    out = static_cast<uint8_t*>(scratch_.Get(total));
  }
  return Allgatherv(*transport_, out + offset, out, bytes, CollectiveDeadline());
}

Status EngineImpl::ExecuteBroadcast(const Response& r, TensorEntry* e) {
  const size_t bytes = static_cast<size_t>(NumElements(r.shapes[0])) * DataTypeSize(r.dtype);
  void* buf;
  if (e) {
    buf = e->output.data;
    if (options_.rank == r.root && e->output.data != e->input.data && bytes) {
      std::memcpy(buf, e->input.data, bytes);
    }
  } else {
    buf = scratch_.Get(bytes);
  }
  return hvd::Broadcast(*transport_, buf, bytes, r.root, CollectiveDeadline());
}

Status EngineImpl::ExecuteAlltoall(const Response& r, TensorEntry* e) {
  const int n = options_.size, me = options_.rank;
  const size_t row_bytes = static_cast<size_t>(RowElements(e->request.shape)) * DataTypeSize(r.dtype);
  std::vector<size_t> send(n), recv(n);
  int64_t rows = 0;
  e->handle->received_splits_.assign(n, 0);
  for (int j = 0; j < n; ++j) {
    send[j] = static_cast<size_t>(r.sizes[me * n + j]) * row_bytes;
    recv[j] = static_cast<size_t>(r.sizes[j * n + me]) * row_bytes;
    e->handle->received_splits_[j] = r.sizes[j * n + me];
    rows += r.sizes[j * n + me];
  }
  std::vector<int64_t> shape = e->request.shape;
  shape[0] = rows;
  size_t total = std::accumulate(recv.begin(), recv.end(), size_t{0});
  void* out = AllocateOutput(e, shape, total);
  if (out == nullptr && total > 0) return Status::InvalidArgument("the output allocator returned null");
  return Alltoallv(*transport_, e->input.data, send, out, recv, CollectiveDeadline());
}

Status EngineImpl::ExecuteReducescatter(const Response& r, TensorEntry* e) {
  const int n = options_.size;
  const std::vector<int64_t>& shape = r.shapes[0];
  const int64_t rows = shape[0], row = RowElements(shape);
  const size_t esize = DataTypeSize(r.dtype);
  std::vector<size_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = static_cast<size_t>(PartRows(rows, n, i) * row);
  const size_t total = static_cast<size_t>(rows * row);
  const void* in = e->input.data;
  if (r.prescale != 1.0) {
    void* copy = fusion_.Get(total * esize);
    if (total) std::memcpy(copy, in, total * esize);
    Scale(copy, total, r.dtype, r.prescale);
    in = copy;
  }
  std::vector<int64_t> out_shape = shape;
  out_shape[0] = PartRows(rows, n, options_.rank);
  size_t out_count = counts[options_.rank];
  void* out = AllocateOutput(e, out_shape, out_count * esize);
  if (out == nullptr && out_count > 0) return Status::InvalidArgument("the output allocator returned null");
  ReduceOp op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
  HVD_RETURN_IF_ERROR(ReduceScatter(*transport_, in, out, counts, r.dtype, op, scratch_,
                                    CollectiveDeadline()));
  double post = r.postscale;
  if (r.op == ReduceOp::kAverage) post /= n;
  Scale(out, out_count, r.dtype, post);
  return Status::OK();
}

}  // namespace hvd
