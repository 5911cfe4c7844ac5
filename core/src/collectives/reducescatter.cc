// ReduceScatter on a ring with arbitrary per-rank counts, pipelined in segments.
//
// Chunk c holds counts[c] elements at offset sum(counts[0..c)) of `in`; rank r must end with
// the reduction of chunk r in `out`. Rank r sends only to r+1 and receives only from r-1.
// Ring steps s = 0 .. p-2: rank r sends chunk r-s-1 and receives chunk r-s-2 (mod p), so the
// chunk it receives in the last step is its own, r.
//   1. Step 0 sends chunk r-1 of `in` (this rank's contribution), segment by segment.
//   2. Each received segment of an intermediate step lands in a scratch slot; the rank reduces
//      its own contribution from `in` into the slot and sends the slot on to the right as the
//      same segment of step s+1. A slot is reused only after the send reading it completed.
//      The right neighbour receives that send only after its own step-0 segments, so the wait
//      could close a cycle around the ring if a rank had fewer slots than the segments of one
//      chunk: there are (segments of the largest chunk) + kLookahead + 1 slots, about one
//      chunk of scratch.
//   3. Segments of the last step land straight in `out` and this rank's contribution from `in`
//      is reduced into them. When `out` is this rank's chunk of `in` itself (in place), it
//      already holds the contribution: they land in a slot and are reduced into `out`.
//   4. Receives are posted kLookahead segments ahead of the one being reduced.
//   5. Every send is waited for.
// `in` is never written, except its chunk r when `out` is that chunk.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/pipeline.h"
#include "reduce/reduce.h"

namespace hvd {
namespace {

// Receive-and-send slots for a largest chunk of `largest` elements: one per segment of it plus
// the lookahead, so a slot is reused only after its send has completed.
size_t SlotCount(size_t largest, size_t seg_elems) {
  return (largest + seg_elems - 1) / seg_elems + kLookahead + 1;
}

class ReduceScatterRun {
 public:
  ReduceScatterRun(Transport& t, const void* in, void* out, bool in_place,
                   const std::vector<size_t>& counts, DataType dtype, ReduceOp op,
                   ScratchBuffer& scratch, Deadline deadline);
  Status Run();

 private:
  const uint8_t* In(size_t elem) const { return in_ + elem * esize_; }
  uint8_t* Out(size_t elem) const { return out_ + (elem - out_offset_) * esize_; }
  uint8_t* Slot(size_t k) const { return slots_ + (k % slot_send_.size()) * slot_bytes_; }
  bool IntoSlot(const Segment& s) const { return s.step < last_step_ || aliased_; }
  Status Post(size_t k);
  Status Process(size_t k);

  Transport& t_;
  const uint8_t* in_;
  uint8_t* out_;
  DataType dtype_;
  ReduceOp op_;
  Deadline deadline_;
  size_t esize_;
  int left_;
  int right_;
  int last_step_;
  size_t out_offset_ = 0;  // element offset of this rank's chunk in `in`
  bool aliased_;           // `out` is chunk r of `in`
  std::vector<Segment> segs_;
  std::vector<TransportRequest> recvs_;
  std::vector<TransportRequest> sends_;  // step 0's sends, which read `in`
  std::vector<std::optional<TransportRequest>> slot_send_;  // per slot, the send reading it
  uint8_t* slots_ = nullptr;  // owned by the caller's ScratchBuffer
  size_t slot_bytes_ = 0;
};

ReduceScatterRun::ReduceScatterRun(Transport& t, const void* in, void* out, bool in_place,
                                   const std::vector<size_t>& counts, DataType dtype, ReduceOp op,
                                   ScratchBuffer& scratch, Deadline deadline)
    : t_(t), in_(static_cast<const uint8_t*>(in)), out_(static_cast<uint8_t*>(out)),
      dtype_(dtype), op_(op), deadline_(deadline), esize_(DataTypeSize(dtype)),
      aliased_(in_place) {
  const int p = t.size();
  const int r = t.rank();
  left_ = PositiveMod(r - 1, p);
  right_ = PositiveMod(r + 1, p);
  last_step_ = p - 2;
  const std::vector<size_t> offsets = PrefixOffsets(counts);
  out_offset_ = offsets[r];
  const size_t seg_elems = kSegmentBytes / esize_;
  for (int step = 0; step <= last_step_; ++step) {
    const int c = PositiveMod(r - step - 2, p);
    AppendSegments(&segs_, step, offsets[c], counts[c], seg_elems);
  }
  recvs_.resize(segs_.size());
  size_t largest = 0;
  for (size_t c : counts) largest = c > largest ? c : largest;
  slot_bytes_ = (largest < seg_elems ? largest : seg_elems) * esize_;
  slot_send_.resize(SlotCount(largest, seg_elems));
  slots_ = static_cast<uint8_t*>(scratch.Get(ReduceScatterScratchBytes(counts, dtype)));
  if (slots_ == nullptr) return;  // Run() reports it; nothing was sent
  const int first = PositiveMod(r - 1, p);
  std::vector<Segment> own;
  AppendSegments(&own, 0, offsets[first], counts[first], seg_elems);
  for (const Segment& s : own) sends_.push_back(t_.Isend(right_, In(s.offset), s.count * esize_));
}

Status ReduceScatterRun::Post(size_t k) {
  const Segment& s = segs_[k];
  if (!IntoSlot(s)) {
    recvs_[k] = t_.Irecv(left_, Out(s.offset), s.count * esize_);
    return Status::OK();
  }
  std::optional<TransportRequest>& pending = slot_send_[k % slot_send_.size()];
  if (pending) {
    const TransportRequest req = *pending;
    pending.reset();
    HVD_RETURN_IF_ERROR(t_.Wait(req, deadline_));
  }
  recvs_[k] = t_.Irecv(left_, Slot(k), s.count * esize_);
  return Status::OK();
}

Status ReduceScatterRun::Process(size_t k) {
  const Segment& s = segs_[k];
  HVD_RETURN_IF_ERROR(t_.Wait(recvs_[k], deadline_));
  if (s.step < last_step_) {
    ReduceInto(Slot(k), In(s.offset), s.count, dtype_, op_);
    slot_send_[k % slot_send_.size()] = t_.Isend(right_, Slot(k), s.count * esize_);
  } else if (aliased_) {
    ReduceInto(Out(s.offset), Slot(k), s.count, dtype_, op_);
  } else {
    ReduceInto(Out(s.offset), In(s.offset), s.count, dtype_, op_);
  }
  return Status::OK();
}

Status ReduceScatterRun::Run() {
  if (slots_ == nullptr) {
    return Status::ResourceExhausted("reducescatter: no memory for " +
                                     std::to_string(slot_send_.size() * slot_bytes_) +
                                     " bytes of slots");
  }
  const size_t n = segs_.size();
  size_t next = 0;
  for (size_t k = 0; k < n; ++k) {
    while (next < n && next <= k + kLookahead) HVD_RETURN_IF_ERROR(Post(next++));
    HVD_RETURN_IF_ERROR(Process(k));
  }
  for (std::optional<TransportRequest>& pending : slot_send_) {
    if (pending) HVD_RETURN_IF_ERROR(t_.Wait(*pending, deadline_));
    pending.reset();
  }
  return t_.WaitAll(sends_, deadline_);
}

}  // namespace

size_t ReduceScatterScratchBytes(const std::vector<size_t>& counts, DataType dtype) {
  const size_t esize = DataTypeSize(dtype);
  if (esize == 0 || counts.size() <= 1) return 0;
  size_t largest = 0;
  for (size_t c : counts) largest = c > largest ? c : largest;
  const size_t seg_elems = kSegmentBytes / esize;
  return SlotCount(largest, seg_elems) * (largest < seg_elems ? largest : seg_elems) * esize;
}

Status ReduceScatter(Transport& t, const void* in, void* out, const std::vector<size_t>& counts,
                     DataType dtype, ReduceOp op, ScratchBuffer& scratch, Deadline deadline) {
  const int p = t.size();
  const size_t esize = DataTypeSize(dtype);
  if (esize == 0) return Status::InvalidArgument("reducescatter: unknown dtype");
  if (static_cast<int>(counts.size()) != p) {
    return Status::InvalidArgument("reducescatter: " + std::to_string(counts.size()) +
                                   " counts for " + std::to_string(p) + " ranks");
  }
  const int r = t.rank();
  size_t before = 0;
  size_t total = 0;
  for (int c = 0; c < p; ++c) (c < r ? before : total) += counts[c];
  total += before;
  const auto* in_begin = static_cast<const uint8_t*>(in);
  const auto* out_begin = static_cast<const uint8_t*>(out);
  const bool in_place = out_begin == in_begin + before * esize;
  const bool overlap =
      out_begin < in_begin + total * esize && in_begin < out_begin + counts[r] * esize;
  if (overlap && !in_place) {
    return Status::InvalidArgument("reducescatter: out overlaps in other than at rank " +
                                   std::to_string(r) + "'s own chunk");
  }
  if (p == 1) {
    if (counts[0] > 0 && !in_place) std::memcpy(out, in, counts[0] * esize);
    return Status::OK();
  }
  if (CollectiveOffload* o = t.offload()) {
    if (std::optional<Status> s = o->ReduceScatter(in, out, counts, dtype, op, deadline)) return *s;
  }
  ReduceScatterRun run(t, in, out, in_place, counts, dtype, op, scratch, deadline);
  return run.Run();
}

}  // namespace hvd
