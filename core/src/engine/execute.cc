// Executing a response: every rank runs the same responses in the same order. Tensors this rank
// does not have (it has joined) take part as zeros (allreduce) or as empty (allgather).
//
// Memory. Nothing on this thread throws out of it, and running out of memory fails one
// operation, not the process:
//   1. Before a collective moves any byte, each rank allocates what the response needs on it:
//      the fusion buffer (fused tensors, a joined rank's stand-in, a prescaled copy), the
//      algorithm's scratch, and the output of allgather, alltoall and reducescatter. A failed
//      allocation (null, or an exception from a vector or a framework's allocator) becomes a
//      ResourceExhausted status.
//   2. When some rank may have had to allocate kAgreeBytes or more, the ranks agree on the
//      outcome: for a per-call output every time, for the fusion and scratch buffers the first
//      time they grow past their agreed high-water marks (the same on every rank, since every
//      rank executes the same responses). Each rank contributes 8 bytes to an allgather: 0, or
//      the bytes it could not get.
//   3. A failed agreement fails the operation on every rank with ResourceExhausted naming the
//      ranks. Nothing was sent, so the ranks' streams stay in step and the engine goes on.
//   4. A failure that was not agreed on (a small allocation, one only this rank needed, an
//      exception inside a collective) leaves the others in the collective without this rank:
//      the communicator is abandoned and every rank fails fast naming this one (Abandon).
//      Except a small output (allgather, alltoall, reducescatter) that the caller's allocator
//      did not give: the rank receives into a stand-in of its own, and the operation fails on
//      this rank alone once the collective is over (StandInForOutput).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <optional>
#include <sstream>

#include "common/logging.h"
#include "engine/engine_impl.h"
#include "planner/fusion.h"
#include "reduce/reduce.h"

namespace hvd {

namespace {

// How an allreduce's plan runs, for the timeline (static text). `mpi`: the offload backend is
// MPI's (HVD_CPU_OPERATIONS=mpi), else shared memory's.
const char* AllreducePlanText(const AllreducePlan& plan, bool mpi) {
  const bool doubling = plan.algorithm == AllreduceAlgorithm::kRecursiveDoubling;
  switch (plan.backend) {
    case AllreduceBackend::kOffloadPieces:
      return "shared memory, the tensors where they lie";
    case AllreduceBackend::kOffload:
      return mpi ? "MPI" : "shared memory";
    case AllreduceBackend::kAlgorithm:
      break;
  }
  if (plan.hierarchical) {
    return doubling ? "hierarchical: within each host, recursive doubling across hosts"
                    : "hierarchical: within each host, ring across hosts";
  }
  return doubling ? "recursive doubling" : "ring";
}

int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// Allocations of this size or more are agreed on by every rank before a collective (step 2).
constexpr size_t kAgreeBytes = 1 << 20;

// "12000 bytes", or "96.0 MiB (100663296 bytes)".
std::string Bytes(uint64_t bytes) {
  std::ostringstream os;
  if (bytes >= (1u << 20)) {
    os.precision(1);
    os << std::fixed << bytes / 1048576.0 << " MiB (";
  }
  os << bytes << " bytes" << (bytes >= (1u << 20) ? ")" : "");
  return os.str();
}

// Runs `allocate` for `bytes` bytes of `what`; a null result or any exception becomes
// ResourceExhausted.
template <typename F>
Status TryAllocate(size_t bytes, const char* what, F allocate, void** out) {
  *out = nullptr;
  std::string why = "the allocation returned null";
  try {
    *out = allocate();
  } catch (...) {
    why = ExceptionMessage(std::current_exception());
  }
  if (*out != nullptr || bytes == 0) return Status::OK();
  return Status::ResourceExhausted("cannot allocate " + Bytes(bytes) + " for " + what + ": " + why);
}

}  // namespace

std::string ExceptionMessage(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

AllgatherLayout LayOutAllgather(const Response& r, int size, std::vector<int64_t> local_shape) {
  AllgatherLayout l;
  const size_t row_bytes = static_cast<size_t>(RowElements(r.shapes[0])) * DataTypeSize(r.dtype);
  l.bytes.resize(size);
  int64_t rows = 0;
  for (int i = 0; i < size; ++i) {
    l.bytes[i] = static_cast<size_t>(r.sizes[i]) * row_bytes;
    l.total += l.bytes[i];
    rows += r.sizes[i];
  }
  l.shape = std::move(local_shape);
  l.shape[0] = rows;
  return l;
}

AlltoallLayout LayOutAlltoall(const Response& r, int size, int rank,
                              std::vector<int64_t> local_shape) {
  AlltoallLayout l;
  l.row_bytes = static_cast<size_t>(RowElements(local_shape)) * DataTypeSize(r.dtype);
  l.send.resize(size);
  l.recv.resize(size);
  l.received_splits.resize(size);
  int64_t rows = 0;
  for (int j = 0; j < size; ++j) {
    l.send[j] = static_cast<size_t>(r.sizes[rank * size + j]) * l.row_bytes;
    l.recv[j] = static_cast<size_t>(r.sizes[j * size + rank]) * l.row_bytes;
    l.received_splits[j] = r.sizes[j * size + rank];
    l.total += l.recv[j];
    rows += r.sizes[j * size + rank];
  }
  l.shape = std::move(local_shape);
  l.shape[0] = rows;
  return l;
}

ReducescatterLayout LayOutReducescatter(const Response& r, int size, int rank) {
  ReducescatterLayout l;
  const std::vector<int64_t>& shape = r.shapes[0];
  const int64_t rows = shape[0], row = RowElements(shape);
  auto part_rows = [&](int i) { return rows / size + (i < rows % size ? 1 : 0); };
  l.counts.resize(size);
  for (int i = 0; i < size; ++i) l.counts[i] = static_cast<size_t>(part_rows(i) * row);
  l.total = static_cast<size_t>(rows * row);
  l.shape = shape;
  l.shape[0] = part_rows(rank);
  return l;
}

Status EngineImpl::AgreeOnMemory(const MemoryNeeds& need, const Status& local, size_t missing) {
  Comm& c = *comm_;
  const int n = c.size;
  const bool agree = n > 1 &&
                     ((need.fusion >= kAgreeBytes && need.fusion > c.agreed_fusion) ||
                      (need.scratch >= kAgreeBytes && need.scratch > c.agreed_scratch) ||
                      need.output >= kAgreeBytes);
  if (!agree) {
    if (!local.ok() && n > 1) abandon_ = true;  // step 4
    return local;
  }
  uint64_t mine = local.ok() ? 0 : std::max<uint64_t>(missing, 1);
  std::vector<uint64_t> all(n, 0);
  HVD_RETURN_IF_ERROR(Allgatherv(*c.t, &mine, all.data(),
                                 std::vector<size_t>(n, sizeof(uint64_t)), CollectiveDeadline()));
  std::ostringstream os;
  int short_ranks = 0;
  for (int i = 0; i < n; ++i) {
    if (all[i] == 0) continue;
    os << (short_ranks++ ? ", " : "") << "rank " << c.WorldRank(i) << " could not allocate "
       << Bytes(all[i]);
  }
  if (short_ranks == 0) {
    c.agreed_fusion = std::max(c.agreed_fusion, need.fusion);
    c.agreed_scratch = std::max(c.agreed_scratch, need.scratch);
    return Status::OK();
  }
  os << "; no data was exchanged and the engine goes on";
  if (!local.ok()) os << " (here: " << local.message() << ")";
  return Status::ResourceExhausted("no memory for the operation: " + os.str());
}

bool EngineImpl::StandInForOutput(const MemoryNeeds& need, size_t bytes, Status* local,
                                  Status* alone, void** out) {
  if (local->ok() || comm_->size == 1 || need.output >= kAgreeBytes) return false;
  try {
    if (stand_in_.size() < bytes) stand_in_.resize(bytes);
  } catch (...) {
    return false;
  }
  *out = stand_in_.data();
  *alone = Status(local->code(), local->message() + " (on this rank only: the operation "
                                                    "completed on the ranks that had their "
                                                    "output)");
  *local = Status::OK();
  return true;
}

// Step 1 for the buffers the engine keeps (fusion, scratch), then step 2. `fusion` is what this
// rank needs of the fusion buffer (0: none), `need` what any rank may need.
Status EngineImpl::Reserve(const MemoryNeeds& need, size_t fusion, void** fusion_out,
                           Status local, size_t missing) {
  if (local.ok() && fusion > 0) {
    local = TryAllocate(fusion, "the fusion buffer", [&] { return fusion_.Get(fusion); }, fusion_out);
    if (!local.ok()) missing = fusion;
  }
  if (local.ok() && need.scratch > 0) {
    void* ignored;
    local = TryAllocate(need.scratch, "the algorithm's scratch",
                        [&] { return scratch_.Get(need.scratch); }, &ignored);
    if (!local.ok()) missing = need.scratch;
  }
  return AgreeOnMemory(need, local, missing);
}

// Step 4: this rank cannot go on with the others, so none can; tell them who and why.
void EngineImpl::Abandon(const Status& why) {
  std::string msg = "rank " + std::to_string(options_.rank) +
                    " abandoned the communicator: " + why.message();
  HVD_LOG(kError) << msg;
  if (!abort_.ok()) return;
  abort_ = Status::Aborted(msg);
  failing_on_own_ = true;
  if (coordinator()) BroadcastControl(static_cast<uint8_t>(MessageType::kAbort), AbortPayload(abort_));
  transport_->Abort(abort_);
}

namespace {

// A slice of host work between two polls of the control plane: some VMs touch fresh pages at a
// few hundred MB/s, where a copy of 16 MiB takes some 50 ms (and one of 4 GiB half a minute,
// past HVD_TIMEOUT_SECONDS: the peers heard no heartbeat and counted the rank lost).
constexpr size_t kPollSliceBytes = size_t{16} << 20;

// f(offset, length) over [0, bytes) in slices of whole `unit`s, poll() between two slices.
template <typename F, typename P>
void InSlices(size_t bytes, size_t unit, F f, P poll) {
  const size_t slice = std::max(kPollSliceBytes / unit, size_t{1}) * unit;
  for (size_t done = 0; done < bytes; done += slice) {
    if (done > 0) poll();
    f(done, std::min(slice, bytes - done));
  }
}

}  // namespace

void EngineImpl::CopyPolling(void* dst, const void* src, size_t bytes) {
  InSlices(
      bytes, 1,
      [&](size_t at, size_t len) {
        std::memcpy(static_cast<uint8_t*>(dst) + at, static_cast<const uint8_t*>(src) + at, len);
      },
      [this] { PollControlPlane(); });
}

void EngineImpl::FillZeroPolling(void* dst, size_t bytes) {
  InSlices(
      bytes, 1, [&](size_t at, size_t len) { std::memset(static_cast<uint8_t*>(dst) + at, 0, len); },
      [this] { PollControlPlane(); });
}

void EngineImpl::ScalePolling(void* buf, size_t count, DataType dtype, double factor) {
  if (factor == 1.0) return;
  const size_t esize = DataTypeSize(dtype);
  InSlices(
      count * esize, esize,
      [&](size_t at, size_t len) {
        Scale(static_cast<uint8_t*>(buf) + at, len / esize, dtype, factor);
      },
      [this] { PollControlPlane(); });
}

Deadline EngineImpl::CollectiveDeadline() const {
  return DeadlineAfterSeconds(options_.timeout_seconds);
}

void EngineImpl::CompleteEntry(TensorEntry& e, const Status& status) {
  TensorEntry* one = &e;
  CompleteEntries(&one, 1, status);
}

namespace {

// Completion after a large collective: the data it moved has pushed each entry and handle out of
// the nearer caches, and each is reached through a pointer, which the hardware cannot run ahead
// of. A few entries ahead is enough to hide the latency of a line from the last level.
constexpr size_t kCompleteAhead = 6;

void PrefetchLines(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t at = 0; at < bytes; at += 64) __builtin_prefetch(c + at, 1);
}

// The handle and its owners' count, which shares its allocation (NewHandle's allocate_shared)
// and lies just before it in libstdc++'s layout (elsewhere the prefetch is only wasted).
void PrefetchHandle(const HandlePtr& h) {
  if (h) PrefetchLines(reinterpret_cast<const char*>(h.get()) - 16, sizeof(Handle) + 16);
}

}  // namespace

// One lock for all of a response's tensors, each releasing its node of in_flight_. What an
// entry holds goes before, outside the lock (its allocator, its device event); once released
// the node is the callers' again, so the handles are completed from here: a caller that sees
// its handle finish may submit the name again at once.
void EngineImpl::CompleteEntries(TensorEntry* const* entries, size_t n, const Status& status,
                                 ProcessSetState* ps) {
  std::vector<InFlightNode*>& nodes = releasing_;
  std::vector<HandlePtr>& handles = completing_;
  nodes.clear();
  handles.clear();
  nodes.reserve(n);  // before any handle is moved out: the loop below cannot throw
  handles.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (i + kCompleteAhead < n) PrefetchLines(entries[i + kCompleteAhead], sizeof(TensorEntry));
    TensorEntry& e = *entries[i];
    auto* node = static_cast<InFlightNode*>(e.in_flight);
    if (ps != nullptr) {
      // Before the node goes back to the callers: its name and shape storage for new entries,
      // and the bit that leads to it.
      if (!e.keeps_storage) {
        KeepShell(e.request);
        e.hint_contents = 0;  // the request lost its name and shape: not the one found
      }
      const auto bit = static_cast<size_t>(e.announced_bit);
      if (e.announced_bit >= 0 && bit < ps->node_of_bit.size() && ps->node_of_bit[bit] == node) {
        ps->node_of_bit[bit] = nullptr;
      }
    }
    nodes.push_back(node);
    handles.push_back(std::move(e.handle));
    NameTableReset(e);
  }
  {
    std::lock_guard<SpinLock> l(mu_);
    for (InFlightNode* node : nodes) in_flight_.ReleaseReset(node);
  }
  // Each handle let go of as it completes, while its line is at hand.
  for (size_t i = 0; i < handles.size(); ++i) {
    if (i + kCompleteAhead < handles.size()) PrefetchHandle(handles[i + kCompleteAhead]);
    handles[i]->Complete(status);
    handles[i].reset();
  }
  handles.clear();
}

void EngineImpl::KeepShell(Request& r) {
  if (r.name.capacity() <= Shell().name.capacity() && r.shape.capacity() == 0) return;
  if (returning_.size() >= kMaxShells) return;
  returning_.emplace_back();
  returning_.back().name.swap(r.name);
  returning_.back().shape.swap(r.shape);
}

void EngineImpl::ReturnShells() {
  if (returning_.empty()) return;
  {
    std::lock_guard<ShortMutex> l(shells_mu_);
    if (shells_.empty()) {
      shells_.swap(returning_);
    } else {
      for (auto& s : returning_) {
        if (shells_.size() >= kMaxShells) break;
        shells_.push_back(std::move(s));
      }
    }
  }
  returning_.clear();
}

void EngineImpl::Execute(const Response& r) {
  responses_executed_.fetch_add(1);
  ProcessSetState* ps = FindSet(r.process_set);
  if (ps == nullptr || !ps->comm) {  // responses go to members only
    HVD_LOG(kError) << "response for '" << r.names[0] << "' of process set " << r.process_set
                    << ", which this rank is not a member of";
    return;
  }
  comm_ = ps->comm.get();
  // This rank's entries, in their in_flight_ nodes until they complete; null where this rank
  // has joined.
  std::vector<TensorEntry*>& entries = executing_;
  entries.assign(r.names.size(), nullptr);
  bool mine = false;
  for (size_t i = 0; i < r.names.size(); ++i) {
    auto* node = PendingNode(*ps, r, i);
    if (node == nullptr) continue;
    entries[i] = &node->value;
    mine = true;
  }
  if (r.type == OpType::kError && !r.sizes.empty() &&
      std::find(r.sizes.begin(), r.sizes.end(), comm_->rank) == r.sizes.end()) {
    // An error for the ranks that had announced the name (refused while a rank had joined, or
    // failed with its group before this rank announced it): this rank's entry of it, on its
    // way or still to come, gets an answer of its own. One still to come goes to the
    // coordinator in full (ProcessSetState::announce_in_full).
    // (Bounded: names that never come back, such as numbered unnamed operations refused while
    // a rank has joined, are forgotten past 4096.)
    if (ps->announce_in_full.size() >= 4096) ps->announce_in_full.clear();
    for (size_t i = 0; i < r.names.size(); ++i) {
      if (entries[i] == nullptr) ps->announce_in_full.insert(r.names[i]);
    }
    entries.assign(entries.size(), nullptr);
    mine = false;
  }
  if (!mine && !joined_ && r.type != OpType::kJoin && r.type != OpType::kError) {
    HVD_LOG(kError) << "response for '" << r.names[0] << "' that this rank never announced";
  }

  // (The size is a pass over every tensor of the response: only for a timeline that records.)
  timeline_->Begin(r.process_set, OpTypeName(r.type), r.names,
                   timeline_->enabled() ? ResponseBytes(r) : 0);
  Status s;
  abandon_ = false;
  in_collective_ = true;
  try {
    s = Run(r, entries);
  } catch (...) {
    s = Status::Internal("exception on the background thread: " +
                         ExceptionMessage(std::current_exception()));
    abandon_ = comm_->size > 1;
  }
  in_collective_ = false;
  timeline_->End(s.ok() ? "ok" : StatusCodeName(s.code()));
  bool comm_gone = r.type != OpType::kError &&
                   (s.code() == StatusCode::kPeerLost || s.code() == StatusCode::kTimeout);
  auto in_context = [&r](Status st) {
    if (st.ok() || r.type == OpType::kError) return st;
    // (Not twice: the root cause another rank relayed may already name this operation.)
    const std::string op = std::string(OpTypeName(r.type)) + " '" + r.names[0] + "'";
    if (st.message().find(op) != std::string::npos) return st;
    return st.WithContext(op + (r.names.size() > 1
                                    ? " (fused with " + std::to_string(r.names.size() - 1) + " more)"
                                    : ""));
  };
  if (comm_gone) {
    // A wait that timed out saw the silence first-hand (a rank that gives up closes its links:
    // its peers see them closed, not silent). Rank 0 hears it now, not after this rank's wait
    // for a root cause: the peers whose links this rank's failure closes wait for one as long.
    // Rank 0's own reads what its heartbeats say of the rank it names.
    // (It waits longer for the answer: rank 0 holds such a verdict up to kVerdictHold.)
    const bool told = s.code() == StatusCode::kTimeout && abort_.ok() && !coordinator();
    if (told) TellCoordinatorFirst(in_context(s));
    s = AwaitRootCause(s, told ? std::chrono::seconds(2) : std::chrono::seconds(1));
    if (coordinator()) ReleaseVerdict();  // one still held goes out now
    if (coordinator() && !abort_.ok()) s = abort_;
    if (coordinator() && abort_.ok() && s.code() == StatusCode::kTimeout) {
      s = BlameSeenByWorker(0, s);
    }
  }
  s = in_context(std::move(s));
  if (abandon_ && !comm_gone) {
    Abandon(s);
    if (!abort_.ok()) s = abort_;  // names this rank, as the others' errors do
  }
  if (r.type == OpType::kError) {
    // An entry this rank refused (Request::error) whose reason the response does not carry
    // (another rank's came first, or the tensor was abandoned): its own reason goes with it.
    for (TensorEntry*& e : entries) {
      if (e == nullptr || e->request.error.empty() ||
          s.message().find(e->request.error) != std::string::npos) {
        continue;
      }
      Status own(s.code(), s.message() + "; this rank refused it too: " + e->request.error);
      CompleteEntries(&e, 1, own, ps);
      e = nullptr;
    }
  }
  entries.erase(std::remove(entries.begin(), entries.end(), nullptr), entries.end());
  // A peer lost or silent fails these operations first: the note goes before they complete.
  if (comm_gone && !failing_on_own_) LeaveFailureNote(s);
  CompleteEntries(entries.data(), entries.size(), s, ps);
  entries.clear();
  ReturnShells();
  if (comm_gone && abort_.ok()) abort_ = s;
}

Status EngineImpl::Run(const Response& r, std::vector<TensorEntry*>& entries) {
  if (r.device != kCpuDevice && r.type != OpType::kError) return ExecuteOnDevice(r, entries);
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
      if (entries[0] == nullptr) KeepBarrierCount(r);
      s = hvd::Barrier(*comm_->t, CollectiveDeadline());
      break;
    case OpType::kProcessSet:
      s = ExecuteProcessSet(r, entries);
      break;
    case OpType::kJoin:
      joined_ = false;
      for (auto* e : entries) {
        if (e) e->handle->join_last_rank_ = r.last_joined;
      }
      break;
  }
  return s;
}

// A rank that has joined takes part in the others' barrier without calling it: its count of
// barriers moves past this one, so that its next barrier has the same name as theirs.
void EngineImpl::KeepBarrierCount(const Response& r) {
  const std::string& name = r.names[0];
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return;
  const uint64_t next = std::strtoull(name.c_str() + dot + 1, nullptr, 10) + 1;
  std::lock_guard<SpinLock> l(mu_);
  auto it = known_sets_.find(r.process_set);
  if (it != known_sets_.end()) it->second.barriers = std::max(it->second.barriers, next);
}

Status EngineImpl::ExecuteAllreduce(const Response& r, std::vector<TensorEntry*>& entries) {
  const size_t esize = DataTypeSize(r.dtype);
  std::vector<size_t>& counts = counts_;
  counts.clear();
  for (const auto& shape : r.shapes) counts.push_back(static_cast<size_t>(NumElements(shape)));
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  // Every rank fuses a response of several tensors; a single tensor goes through the fusion
  // buffer only on a rank that has joined (and stands in with zeros).
  bool fused = entries.size() > 1 || entries[0] == nullptr;
  MemoryNeeds need;
  need.fusion = total * esize;
  const Comm& c = *comm_;
  const bool adasum = r.op == ReduceOp::kAdasum;
  const PlanContext pc = WithKnobs(c.plan, r.knobs);  // rank 0's, the same on every member
  const AllreducePlan plan = PlanAllreduce(total, r.dtype, pc);
  if (timeline_->enabled()) {
    const bool mpi = options_.cpu_operations == Options::CpuOperations::kMpi;
    timeline_->Algorithm(adasum ? "adasum" : AllreducePlanText(plan, mpi));
  }
  need.scratch = adasum ? AdasumScratchBytes(total, r.dtype)
                        : PlanScratchBytes(plan, total, r.dtype, pc);
  // A set of one rank: each result is the tensor itself, scaled as the fused path scales it
  // (prescale, then the final factor), copied straight into its output: one pass over the bytes
  // where the fusion buffer costs two.
  if (c.size == 1 && !adasum) {
    const double post = FinalScale(r, 1);
    for (size_t i = 0; i < entries.size(); ++i) {
      TensorEntry* e = entries[i];
      if (e == nullptr || counts[i] == 0) continue;  // (no stand-in: its only rank is here)
      if (e->output.data != e->input.data) {
        CopyPolling(e->output.data, e->input.data, counts[i] * esize);
      }
      ScalePolling(e->output.data, counts[i], r.dtype, r.prescale);
      ScalePolling(e->output.data, counts[i], r.dtype, post);
    }
    return Status::OK();
  }
  // A backend that reads and writes the tensors where they lie (shared memory between every
  // rank) takes them without the fusion buffer. The plan depends on the backend and the
  // response alone, so every rank reserves alike.
  if (!adasum && plan.backend == AllreduceBackend::kOffloadPieces && total > 0) {
    MemoryNeeds direct = need;
    direct.fusion = 0;
    HVD_RETURN_IF_ERROR(Reserve(direct, 0, nullptr));
    std::vector<AllreducePiece>& pieces = pieces_;
    pieces.assign(entries.size(), AllreducePiece());
    for (size_t i = 0; i < entries.size(); ++i) {
      pieces[i].count = counts[i];
      if (entries[i]) {  // a joined rank's stand-in is zeros, and its result is dropped
        pieces[i].in = entries[i]->input.data;
        pieces[i].out = entries[i]->output.data;
      }
    }
    const ReduceOp sum_op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
    HVD_RETURN_IF_ERROR(
        AllreducePieces(*c.t, pieces, r.dtype, sum_op, r.prescale, CollectiveDeadline()));
    const double post = FinalScale(r, c.size);
    if (post != 1.0) {  // (a pass over every piece otherwise)
      for (const auto& q : pieces) {
        if (q.out) ScalePolling(q.out, q.count, r.dtype, post);
      }
    }
    return Status::OK();
  }
  void* fusion = nullptr;
  HVD_RETURN_IF_ERROR(Reserve(need, fused ? total * esize : 0, &fusion));
  uint8_t* buf;
  if (!fused) {
    TensorEntry* e = entries[0];
    buf = static_cast<uint8_t*>(e->output.data);
    if (e->output.data != e->input.data && total > 0) CopyPolling(buf, e->input.data, total * esize);
  } else {
    buf = static_cast<uint8_t*>(fusion);
    size_t off = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      size_t bytes = counts[i] * esize;
      if (entries[i]) {
        if (bytes) CopyPolling(buf + off, entries[i]->input.data, bytes);
      } else {
        FillZeroPolling(buf + off, bytes);
      }
      off += bytes;
    }
  }
  ScalePolling(buf, total, r.dtype, r.prescale);
  ReduceOp op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
  if (adasum) {  // flat, every tensor of the fused buffer with its own dot products
    HVD_RETURN_IF_ERROR(AdasumAllreduce(*c.t, buf, counts, r.dtype, scratch_, CollectiveDeadline()));
  } else if (plan.hierarchical) {
    HVD_RETURN_IF_ERROR(HierarchicalAllreduce(*c.local, *c.cross, buf, total, r.dtype, op,
                                              scratch_, CollectiveDeadline(), plan.algorithm));
  } else {
    HVD_RETURN_IF_ERROR(hvd::Allreduce(*c.t, buf, total, r.dtype, op, scratch_,
                                       CollectiveDeadline(), plan.algorithm));
  }
  const double post = FinalScale(r, c.size);
  ScalePolling(buf, total, r.dtype, post);
  if (fused) {
    size_t off = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      size_t bytes = counts[i] * esize;
      if (entries[i] && bytes) CopyPolling(entries[i]->output.data, buf + off, bytes);
      off += bytes;
    }
  }
  return Status::OK();
}

void* EngineImpl::AllocateOutput(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes) {
  e->handle->mutable_results().output_shape = shape;
  if (e->allocator) {
    void* p = keeper_.Call([&] { return e->allocator(shape); });
    e->handle->output_data_ = p;
    return p;
  }
  std::vector<uint8_t>& owned = e->handle->mutable_results().output_bytes;
  // Zero-filled as it grows, a slice at a time (CopyPolling): no reallocation after reserve.
  owned.clear();
  owned.reserve(bytes);
  InSlices(
      bytes, 1, [&](size_t at, size_t len) { owned.resize(at + len); },
      [this] { PollControlPlane(); });
  e->handle->output_data_ = owned.data();
  return e->handle->output_data_;
}

Status EngineImpl::ExecuteAllgather(const Response& r, TensorEntry* e) {
  const Comm& c = *comm_;
  const AllgatherLayout l = LayOutAllgather(r, c.size, e ? e->request.shape : r.shapes[0]);
  const std::vector<size_t>& bytes = l.bytes;
  const size_t total = l.total;
  const size_t offset = std::accumulate(bytes.begin(), bytes.begin() + c.rank, size_t{0});
  const bool hierarchical = PlanHierarchicalAllgather(total, c.plan);
  MemoryNeeds need;
  need.output = total;
  if (hierarchical) need.scratch = HierarchicalAllgatherScratchBytes(c.hosts, bytes);
  void* got = nullptr;
  Status local;
  Status alone;
  if (e) {
    local = TryAllocate(total, "the allgather output",
                        [&] { return AllocateOutput(e, l.shape, total); }, &got);
    StandInForOutput(need, total, &local, &alone, &got);
  }
  // A joined rank receives into the fusion buffer.
  HVD_RETURN_IF_ERROR(Reserve(need, e ? 0 : total, e ? nullptr : &got, local, total));
  auto* out = static_cast<uint8_t*>(got);
  Status s;
  if (hierarchical) {
    s = HierarchicalAllgatherv(*c.local, *c.cross, c.hosts, e ? e->input.data : out, out, bytes,
                               scratch_, CollectiveDeadline());
  } else {
    if (e && bytes[c.rank]) CopyPolling(out + offset, e->input.data, bytes[c.rank]);
    s = Allgatherv(*c.t, out + offset, out, bytes, CollectiveDeadline());
  }
  return s.ok() ? alone : s;
}

Status EngineImpl::ExecuteBroadcast(const Response& r, TensorEntry* e) {
  const size_t bytes = static_cast<size_t>(NumElements(r.shapes[0])) * DataTypeSize(r.dtype);
  // Only a joined rank allocates: it receives into the fusion buffer.
  MemoryNeeds need;
  need.fusion = bytes;
  void* buf = nullptr;
  HVD_RETURN_IF_ERROR(Reserve(need, e ? 0 : bytes, &buf));
  // The root sends from its input (it only reads it) and copies it to its output after: the
  // peers do not wait for a copy of gigabytes.
  const bool root_copies = e && comm_->rank == r.root && e->output.data != e->input.data && bytes;
  if (e) buf = root_copies ? e->input.data : e->output.data;
  Status s = hvd::Broadcast(*comm_->t, buf, bytes, r.root, CollectiveDeadline());
  if (s.ok() && root_copies) CopyPolling(e->output.data, e->input.data, bytes);
  return s;
}

Status EngineImpl::ExecuteAlltoall(const Response& r, TensorEntry* e) {
  const int n = comm_->size;
  const AlltoallLayout l = LayOutAlltoall(r, n, comm_->rank, e->request.shape);
  e->handle->mutable_results().received_splits = l.received_splits;
  const size_t total = l.total;
  MemoryNeeds need;  // the largest output of any rank
  for (int j = 0; j < n; ++j) {
    int64_t in_rows = 0;
    for (int i = 0; i < n; ++i) in_rows += r.sizes[i * n + j];
    need.output = std::max(need.output, static_cast<size_t>(in_rows) * l.row_bytes);
  }
  void* out = nullptr;
  Status local = TryAllocate(total, "the alltoall output",
                             [&] { return AllocateOutput(e, l.shape, total); }, &out);
  Status alone;
  StandInForOutput(need, total, &local, &alone, &out);
  HVD_RETURN_IF_ERROR(Reserve(need, 0, nullptr, local, total));
  Status s = Alltoallv(*comm_->t, e->input.data, l.send, out, l.recv, CollectiveDeadline());
  return s.ok() ? alone : s;
}

Status EngineImpl::ExecuteReducescatter(const Response& r, TensorEntry* e) {
  const int n = comm_->size;
  const ReducescatterLayout l = LayOutReducescatter(r, n, comm_->rank);
  const std::vector<size_t>& counts = l.counts;
  const size_t esize = DataTypeSize(r.dtype);
  const size_t total = l.total;
  const void* in = e->input.data;
  const size_t out_count = counts[comm_->rank];
  MemoryNeeds need;
  need.output = counts[0] * esize;  // rank 0's part is the largest
  need.scratch = ReduceScatterScratchBytes(counts, r.dtype);
  const size_t copy_bytes = r.prescale != 1.0 ? total * esize : 0;  // prescaled input copy
  need.fusion = copy_bytes;
  void* out = nullptr;
  Status local = TryAllocate(out_count * esize, "the reducescatter output",
                             [&] { return AllocateOutput(e, l.shape, out_count * esize); }, &out);
  Status alone;
  StandInForOutput(need, out_count * esize, &local, &alone, &out);
  void* copy = nullptr;
  HVD_RETURN_IF_ERROR(Reserve(need, copy_bytes, &copy, local, out_count * esize));
  if (copy_bytes > 0) {
    CopyPolling(copy, in, copy_bytes);
    ScalePolling(copy, total, r.dtype, r.prescale);
    in = copy;
  }
  ReduceOp op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
  HVD_RETURN_IF_ERROR(ReduceScatter(*comm_->t, in, out, counts, r.dtype, op, scratch_,
                                    CollectiveDeadline()));
  ScalePolling(out, out_count, r.dtype, FinalScale(r, n));
  return alone;
}

}  // namespace hvd
