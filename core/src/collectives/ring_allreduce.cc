// Ring allreduce: a reduce-scatter then an allgather around the ring, pipelined in segments.
//
// Rank r sends only to right = r+1 and receives only from left = r-1 (mod p). The buffer is
// split into p chunks (EvenChunks; empty chunks when count < p send nothing). Ring steps
// t = 0 .. 2p-3:
//   1. Step 0 sends chunk r, the rank's own data, segment by segment (kSegmentBytes) to the right.
//   2. Every step t receives chunk c_t = r-t-1 (mod p) from the left, segment by segment.
//      Reduce-scatter steps (t < p-1) receive into a scratch slot and reduce it straight into
//      buf; allgather steps (t >= p-1) receive straight into buf, the data's final place.
//   3. As soon as a segment of step t is reduced (or, in the allgather, has arrived) it is sent on
//      to the right as the same segment of step t+1, unless t is the last step. After step p-2
//      rank r holds the full reduction of chunk r+1, which step p-1 starts to circulate.
//   4. Receives are posted kLookahead segments ahead of the one being reduced, so that the next
//      segments are on the wire while this one is reduced.
//   5. Hazard rule: allgather step t overwrites chunk c_t, which step a = t+1-p sent from. Before
//      its first receive is posted, every send of step a is waited for; those sends are posted
//      while step a-1 is processed, so such a receive is posted only once step a-1 is done.
//   6. Finally every send not yet waited for is waited for.
// Each chunk is reduced along one path and then copied, so every rank ends bitwise identical.
#include <cstdint>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/pipeline.h"
#include "reduce/reduce.h"

namespace hvd {
namespace {

class RingAllreduceRun {
 public:
  RingAllreduceRun(Transport& t, void* buf, size_t count, DataType dtype, ReduceOp op,
                   ScratchBuffer& scratch, Deadline deadline);
  Status Run();

 private:
  uint8_t* At(size_t elem) const { return buf_ + elem * esize_; }
  uint8_t* Slot(size_t k) const { return slots_ + (k % kRecvSlots) * slot_bytes_; }
  bool CanPost(size_t k) const;
  Status Post(size_t k);
  Status Process(size_t k);
  Status WaitSendsOfStep(int step);

  Transport& t_;
  uint8_t* buf_;
  DataType dtype_;
  ReduceOp op_;
  Deadline deadline_;
  size_t esize_;
  int p_;
  int left_;
  int right_;
  int last_step_;
  std::vector<Segment> segs_;                         // every receive, in order
  std::vector<TransportRequest> recvs_;               // parallel to segs_
  std::vector<std::vector<TransportRequest>> sends_;  // per step
  std::vector<bool> sends_waited_;                    // per step
  uint8_t* slots_ = nullptr;                          // owned by the caller's ScratchBuffer
  size_t slot_bytes_ = 0;
  size_t processed_ = 0;  // segments [0, processed_) are reduced and forwarded
};

RingAllreduceRun::RingAllreduceRun(Transport& t, void* buf, size_t count, DataType dtype,
                                   ReduceOp op, ScratchBuffer& scratch, Deadline deadline)
    : t_(t), buf_(static_cast<uint8_t*>(buf)), dtype_(dtype), op_(op), deadline_(deadline),
      esize_(DataTypeSize(dtype)), p_(t.size()) {
  const int r = t.rank();
  left_ = PositiveMod(r - 1, p_);
  right_ = PositiveMod(r + 1, p_);
  last_step_ = 2 * p_ - 3;
  const EvenChunks chunks(count, p_);
  const size_t seg_elems = kSegmentBytes / esize_;
  for (int step = 0; step <= last_step_; ++step) {
    const int c = PositiveMod(r - step - 1, p_);
    AppendSegments(&segs_, step, chunks.Offset(c), chunks.Count(c), seg_elems);
  }
  recvs_.resize(segs_.size());
  sends_.resize(last_step_ + 1);
  sends_waited_.assign(last_step_ + 1, false);
  const size_t largest = chunks.Count(0);
  slot_bytes_ = (largest < seg_elems ? largest : seg_elems) * esize_;
  slots_ = static_cast<uint8_t*>(scratch.Get(RingAllreduceScratchBytes(count, dtype, p_)));
  if (slots_ == nullptr) return;  // Run() reports it; nothing was sent
  // Step 0: this rank's own chunk goes out first.
  std::vector<Segment> own;
  AppendSegments(&own, 0, chunks.Offset(r), chunks.Count(r), seg_elems);
  for (const Segment& s : own) {
    sends_[0].push_back(t_.Isend(right_, At(s.offset), s.count * esize_));
  }
}

bool RingAllreduceRun::CanPost(size_t k) const {
  const int a = segs_[k].step + 1 - p_;  // the step whose sends read the chunk received into
  if (a <= 0) return true;               // scratch receive, or step 0's sends (already posted)
  return processed_ == segs_.size() || segs_[processed_].step >= a;
}

Status RingAllreduceRun::WaitSendsOfStep(int step) {
  if (sends_waited_[step]) return Status::OK();
  sends_waited_[step] = true;
  return t_.WaitAll(sends_[step], deadline_);
}

Status RingAllreduceRun::Post(size_t k) {
  const Segment& s = segs_[k];
  if (s.step >= p_ - 1) {
    HVD_RETURN_IF_ERROR(WaitSendsOfStep(s.step + 1 - p_));
    recvs_[k] = t_.Irecv(left_, At(s.offset), s.count * esize_);
  } else {
    recvs_[k] = t_.Irecv(left_, Slot(k), s.count * esize_);
  }
  return Status::OK();
}

Status RingAllreduceRun::Process(size_t k) {
  const Segment& s = segs_[k];
  HVD_RETURN_IF_ERROR(t_.Wait(recvs_[k], deadline_));
  if (s.step < p_ - 1) ReduceInto(At(s.offset), Slot(k), s.count, dtype_, op_);
  if (s.step < last_step_) {
    sends_[s.step + 1].push_back(t_.Isend(right_, At(s.offset), s.count * esize_));
  }
  return Status::OK();
}

Status RingAllreduceRun::Run() {
  if (slots_ == nullptr) {
    return Status::ResourceExhausted("ring allreduce: no memory for " +
                                     std::to_string(kRecvSlots * slot_bytes_) +
                                     " bytes of receive slots");
  }
  const size_t n = segs_.size();
  size_t next = 0;  // next segment whose receive is to be posted
  for (size_t k = 0; k < n; ++k) {
    while (next < n && next <= k + kLookahead && CanPost(next)) {
      HVD_RETURN_IF_ERROR(Post(next++));
    }
    if (next <= k) return Status::Internal("ring allreduce: receive not posted in order");
    HVD_RETURN_IF_ERROR(Process(k));
    processed_ = k + 1;
  }
  for (int step = 0; step <= last_step_; ++step) HVD_RETURN_IF_ERROR(WaitSendsOfStep(step));
  return Status::OK();
}

}  // namespace

size_t RingAllreduceScratchBytes(size_t count, DataType dtype, int ranks) {
  const size_t esize = DataTypeSize(dtype);
  if (esize == 0 || ranks <= 0) return 0;
  const size_t largest = EvenChunks(count, ranks).Count(0);
  const size_t seg_elems = kSegmentBytes / esize;
  return kRecvSlots * (largest < seg_elems ? largest : seg_elems) * esize;
}

Status RingAllreduce(Transport& t, void* buf, size_t count, DataType dtype, ReduceOp op,
                     ScratchBuffer& scratch, Deadline deadline) {
  if (DataTypeSize(dtype) == 0) return Status::InvalidArgument("ring allreduce: unknown dtype");
  if (count == 0 || t.size() == 1) return Status::OK();
  if (buf == nullptr) return Status::InvalidArgument("ring allreduce: null buffer");
  RingAllreduceRun run(t, buf, count, dtype, op, scratch, deadline);
  return run.Run();
}

}  // namespace hvd
