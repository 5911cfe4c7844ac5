// The public Engine API: argument checks and enqueueing. See engine_impl.h for the threads.
#include "engine/engine_impl.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <thread>

#include "bootstrap/elastic.h"
#include "bootstrap/store.h"
#include "common/descriptors.h"
#include "common/logging.h"
#include "common/spin_lock.h"
#include "planner/fusion.h"
#include "transport/transport_factory.h"

namespace hvd {

namespace {

// The memory of handles (each with its shared_ptr's control block), kept for the next ones: a
// step of many tensors makes and drops as many handles, on the caller's thread and the
// background thread, and the allocator's free lists then cost more than the handle. One size
// is kept (the first asked for); at most kMaxBlocks blocks. Never destroyed, so that a handle
// a caller keeps past the engine, or past exit, can still go. Under AddressSanitizer every
// block goes back to the allocator, which then still sees a handle used after it went.
#if defined(__SANITIZE_ADDRESS__)
#define HVD_POOL_HANDLES 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HVD_POOL_HANDLES 0
#endif
#endif
#ifndef HVD_POOL_HANDLES
#define HVD_POOL_HANDLES 1
#endif
class HandleBlocks {
 public:
  static HandleBlocks& Get() {
    static HandleBlocks* blocks = new HandleBlocks();
    return *blocks;
  }
  // In a child forked from the process (common/inheritance.h) the pool is not used: its lock
  // may have been held by a thread that the fork left behind. Its blocks came from operator
  // new, so they may go back there.
  void* Take(size_t bytes) {
    if (!HVD_POOL_HANDLES || ForkGeneration() != generation_) return ::operator new(bytes);
    {
      std::lock_guard<SpinLock> l(lock_);
      if (bytes == size_ && !free_.empty()) {
        void* p = free_.back();
        free_.pop_back();
        return p;
      }
      if (size_ == 0) size_ = bytes;
    }
    return ::operator new(bytes);
  }
  void Give(void* p, size_t bytes) {
    if (!HVD_POOL_HANDLES || ForkGeneration() != generation_) return ::operator delete(p);
    {
      std::lock_guard<SpinLock> l(lock_);
      if (bytes == size_ && free_.size() < kMaxBlocks) {
        free_.push_back(p);
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  static constexpr size_t kMaxBlocks = 1 << 16;
  // Held for a pointer's push or pop, and taken twice per tensor (its handle made, then
  // dropped).
  SpinLock lock_;
  const uint64_t generation_ = (WatchForks(), ForkGeneration());
  size_t size_ = 0;
  std::vector<void*> free_;
};

template <typename T>
struct HandleAllocator {
  using value_type = T;
  HandleAllocator() = default;
  template <typename U>
  HandleAllocator(const HandleAllocator<U>&) {}  // NOLINT: rebinding, as allocators do
  T* allocate(size_t n) { return static_cast<T*>(HandleBlocks::Get().Take(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { HandleBlocks::Get().Give(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HandleAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const HandleAllocator<U>&) const { return false; }
};

}  // namespace

HandlePtr NewHandle() {
  HandlePtr h = std::allocate_shared<Handle>(HandleAllocator<Handle>());
  h->fork_generation_ = ForkGeneration();
  return h;
}

namespace {

HandlePtr Failed(Status s) {
  auto h = NewHandle();
  h->refused_ = true;
  h->Complete(std::move(s));
  return h;
}

TensorEntry MakeEntry(EngineImpl& impl, OpType type, const std::string& name,
                      const TensorView& in, const TensorView& out, int32_t process_set) {
  TensorEntry e;
  impl.TakeShell(&e.request);  // storage for the name and shape, reused
  e.request.type = type;
  e.request.name.assign(name);
  e.request.process_set = process_set;
  e.request.dtype = in.dtype;
  e.request.device = in.device;
  // The input's shape is kept once, in the request; of the output only where it lies:
  // wherever an op takes one, its element count is the input's (checked before). Copying the
  // shapes again would allocate for every tensor.
  e.request.shape.assign(in.shape.begin(), in.shape.end());
  e.input.data = in.data;
  e.input.dtype = in.dtype;
  e.input.device = in.device;
  e.input.stream = in.stream;  // a device tensor's ready event is recorded on it
  e.output.data = out.data;
  e.output.dtype = out.dtype;
  e.output.device = out.device;
  e.handle = NewHandle();
  return e;
}

}  // namespace

std::string PendingKey(int32_t process_set, const std::string& name) {
  if (process_set == kGlobalProcessSet) return name;
  return std::to_string(process_set) + "\x1f" + name;
}

// ---------------------------------------------------------------- EngineImpl: set-up

EngineImpl::EngineImpl(const Options& options)
    : options_(options), fork_generation_((WatchForks(), ForkGeneration())), pid_(::getpid()) {}

StatusOr<std::unique_ptr<EngineImpl>> EngineImpl::Create(const Options& given) {
  HVD_RETURN_IF_ERROR(given.Validate());
  Options options = given;
  HVD_RETURN_IF_ERROR(TakeIdentityFromMpi(&options));  // hvd.init(comm=...)
  HVD_RETURN_IF_ERROR(options.Validate());
  SetLogLevel(options.log_level);
  SetLogPrefix("rank " + std::to_string(options.rank));
  std::unique_ptr<EngineImpl> impl(new EngineImpl(options));
  HVD_RETURN_IF_ERROR(impl->Connect());
  impl->thread_ = std::thread([p = impl.get()] { p->Loop(); });
  // As in Horovod, a set given at start whose ranks (in any order) equal the world's or an
  // earlier set's names that set: it adds nothing and takes no id.
  // (Every rank gave the same ones: the job's connection compared them, ConnectJob.)
  for (const auto& ranks : InitialProcessSets(options)) {
    auto id = impl->AddProcessSet(ranks, /*at_init=*/true);
    if (!id.ok()) return id.status().WithContext("rank " + std::to_string(options.rank) +
                                                 ": adding the process sets given at start");
  }
  return impl;
}

Status EngineImpl::Connect() {
  timeline_ = std::make_unique<Timeline>(
      IsDynamicTimeline(options_.timeline_path) ? std::string() : options_.timeline_path,
      options_.rank, options_.timeline_mark_cycles);
  std::vector<int> everyone(options_.size);
  for (int r = 0; r < options_.size; ++r) everyone[r] = r;
  known_sets_[kGlobalProcessSet].ranks = everyone;
  spin_ = SpinWindow(options_);
  // A caller's Wait polls for the spin window while this host has a core per rank.
  // Oversubscribed, it polls only for small operations (kSmallWaitBytes), which finish within
  // the window: there a sleep and its wake-up cost more than the whole operation, while the
  // polling of a long one would take the core that the threads it waits for need.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int local = std::max(1, options_.local_size);
  oversubscribed_ = static_cast<unsigned>(local) > cores;
  // Pinning aside only where this process may run on every CPU of the host: a rank bound to
  // CPUs of its own (mpirun --bind-to, Slurm --cpu-bind, taskset) has its spare ones to itself.
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    const int usable = CPU_COUNT(&allowed);
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    helper_->pin_aside.store(usable > 1 && usable == online && local >= usable,
                             std::memory_order_relaxed);
    helper_->pause_idle.store(usable >= local, std::memory_order_relaxed);
    // A core beside the caller's for the background thread: more CPUs than the host's ranks,
    // or CPUs of this rank's own (bound ranks whose sets fit the host side by side).
    spare_core_ = usable > local || (usable >= 2 && static_cast<long>(usable) * local <= online);
  }
  auto on_msg = [this](int peer, uint8_t type, std::vector<uint8_t>&& p) {
    OnControlMessage(peer, type, std::move(p));
  };
  auto on_err = [this](int peer, const std::string& what) { OnControlError(peer, what); };
  Deadline deadline = DeadlineAfterSeconds(options_.start_timeout_seconds);
  auto job = ConnectJob(io_, options_, deadline, on_msg, on_err);  // transport/transport_factory.h
  if (!job.ok()) return job.status().WithContext("rank " + std::to_string(options_.rank));
  backends_ = std::move(job->backends);
  // Taken now: the job's shutdown, which another rank may start, finalizes MPI.
  mpi_thread_multiple_ = MpiThreadMultiple();
  transport_ = std::move(job->transport);
  control_ = std::move(job->control);
  peers_ = std::move(job->peers);
  poller_ = std::move(job->poller);
  control_over_tcp_ = job->control_over_tcp;
  topology_ = job->topology;
  layout_note_ = job->layout_note;
  job_store_ = std::move(job->store);
  // A backend's collectives that wait without the io_context keep the control plane going.
  if (CollectiveOffload* off = transport_->offload()) {
    off->SetWaitPoll([this] { return PollControlPlane(); });
  }
  auto world = NewSet(kGlobalProcessSet, everyone);
  world->comm->plan.offload = transport_->offload() != nullptr;
  world->comm->plan.offload_pieces = OffersAllreducePieces(*transport_);
  if (options_.autotune && options_.rank == 0 && options_.size == 1) {
    HVD_LOG(kInfo) << "HVD_AUTOTUNE: a job of one rank has nothing to tune (no collective "
                      "crosses a link)";
  }
  if (options_.autotune && options_.rank == 0 && options_.size > 1) {
    // The fusion threshold and the cycle time unless the job set them; then what matters in
    // this job: the hierarchical choice where the layout allows it and the job left it to the
    // planner; the flat algorithms' threshold where hvd's algorithms move the bytes.
    const PlanContext& plan = world->comm->plan;
    Autotuner::Scope scope;
    scope.cycle = !(options_.cycle_time_set && options_.autotune_hold_set);
    scope.fusion = !(options_.fusion_threshold_set && options_.autotune_hold_set);
    scope.hierarchical = plan.hierarchical && !plan.offload &&
                         options_.hierarchical_allreduce == Options::Toggle::kAuto;
    scope.algorithm = !plan.offload;
    Autotuner::Setting start;
    start.fusion_bytes = options_.fusion_threshold_bytes;
    start.cycle_ms = options_.cycle_time_ms;
    start.knobs = DefaultKnobs(options_);
    autotune_ = std::make_unique<Autotuner>(start, options_.autotune_warmup_samples,
                                            options_.autotune_steps_per_sample,
                                            options_.autotune_log, scope);
    if (!autotune_->tunes_anything()) {
      HVD_LOG(kWarning) << "HVD_AUTOTUNE: nothing left to tune: the job set the cycle time and "
                           "the fusion threshold (HVD_CYCLE_TIME, HVD_FUSION_THRESHOLD), which "
                           "autotune holds constant (HVD_AUTOTUNE_HOLD_SET=0: only its start), "
                           "and no other knob applies here";
      autotune_.reset();
    }
  }
  sets_[kGlobalProcessSet] = std::move(world);
  auto symmetric = SymmetricNegotiation(job->all_linked, job->links_in_memory, cores, deadline);
  if (!symmetric.ok()) {
    return symmetric.status().WithContext("rank " + std::to_string(options_.rank));
  }
  if (options_.rank == 0 && options_.size > 1) {
    const char* how = !*symmetric ? "rank 0 answers"
                      : job->links_in_memory
                          ? "rounds between every pair of ranks, in shared memory"
                          : "rounds between every pair of ranks, over TCP where they do not "
                            "share memory";
    HVD_LOG(kInfo) << "negotiation of cached tensors: " << how << " (HVD_SYMMETRIC_NEGOTIATION)";
  }
  if (*symmetric) {  // engine/rounds.cc
    rounds_ = std::make_unique<Rounds>();  // (its bit vectors grow with the cache: FitBits)
    rounds_->parts.resize(options_.size);
    rounds_->early.resize(options_.size);
    rounds_->arrived.resize(options_.size);
    rounds_->early_arrived.resize(options_.size);
  }
  if (options_.rank == 0 && StallShutdownSeconds(options_.stall_check_seconds,
                                                 options_.stall_shutdown_seconds) == 0 &&
      options_.stall_shutdown_seconds > 0) {
    HVD_LOG(kWarning) << "HVD_STALL_SHUTDOWN_TIME_SECONDS (" << options_.stall_shutdown_seconds
                      << ") is less than HVD_STALL_CHECK_TIME_SECONDS ("
                      << options_.stall_check_seconds << "): a stall will not shut hvd down, "
                      << "as in Horovod";
  }
  if (options_.size == 1) return Status::OK();
  StartHeartbeat();
  return Status::OK();
}

// Whether the global set agrees on cached tensors in rounds (engine/rounds.cc): where every rank
// links to every other and HVD_SYMMETRIC_NEGOTIATION allows it. `auto`: where every link is in
// one host's memory and the host has a core per rank. `on`: also across hosts, over TCP (links
// between workers: transport/tcp/mesh_hello.h); there `auto` keeps rank 0 answering, which
// measured faster on the fake hosts of tests/netns (README). Whether all are linked every rank
// finds alike; the rest the linked ranks agree on by one allreduce (the lowest wins), so a
// launcher's layout or an environment that differs between ranks cannot split them.
StatusOr<bool> EngineImpl::SymmetricNegotiation(bool all_linked, bool links_in_memory,
                                                unsigned cores, Deadline deadline) {
  if (!all_linked) return false;
  const Options::Toggle knob = options_.symmetric_negotiation;
  int32_t yes = knob == Options::Toggle::kOn ||
                (knob == Options::Toggle::kAuto && (links_in_memory || options_.size == 1) &&
                 static_cast<unsigned>(options_.size) <= cores);
  if (options_.size == 1) return yes == 1;
  Status s = Allreduce(*transport_, &yes, 1, DataType::kInt32, ReduceOp::kMin, scratch_, deadline);
  if (!s.ok()) return s.WithContext("agreeing on how the ranks negotiate");
  return yes == 1;
}

// The local and cross views of a communicator, when its members' places describe hosts of
// equal size with more than one member each (transport/group_view.h). `topo` counts in it.
Status EngineImpl::SetUpViews(Comm& comm, const Topology& topo, const std::string& why) {
  const bool world = comm.t == transport_.get();
  if (!topo.Homogeneous()) {
    const bool asked = options_.hierarchical_allreduce == Options::Toggle::kOn ||
                       options_.hierarchical_allgather == Options::Toggle::kOn;
    if (asked && world && options_.rank == 0) {
      HVD_LOG(kWarning) << "HVD_HIERARCHICAL_ALLREDUCE or _ALLGATHER is on, but this job's "
                           "layout does not allow it, so they run flat: "
                        << (why.empty() ? "it needs more than one host with the same number of "
                                          "ranks, more than one, on each"
                                        : why);
    }
    return Status::OK();
  }
  auto local = GroupView::Create(*comm.t, topo.LocalMembers(comm.rank));
  if (!local.ok()) return local.status();
  auto cross = GroupView::Create(*comm.t, topo.CrossMembers(comm.rank));
  if (!cross.ok()) return cross.status();
  comm.local = std::move(*local);
  comm.cross = std::move(*cross);
  comm.plan.hierarchical = true;
  comm.plan.local_size = comm.local->size();
  comm.plan.cross_size = comm.cross->size();
  comm.hosts.clear();
  for (int first : comm.cross->members()) comm.hosts.push_back(topo.LocalMembers(first));
  // World ranks of the views' members, for the log.
  auto world_ranks = [&comm](const GroupView& v) {
    std::vector<int> out;
    for (int m : v.members()) out.push_back(comm.WorldRank(m));
    return "[" + RankList(out) + "]";
  };
  HVD_LOG(kInfo) << (world ? std::string() : "process set: ")
                 << "hierarchical collectives ready: this host's ranks "
                 << world_ranks(*comm.local) << ", across hosts " << world_ranks(*comm.cross);
  return Status::OK();
}

EngineImpl::~EngineImpl() {
  Shutdown();
  helper_->Retire();  // the next engine of this process takes it (ProgressHelper)
}

// The caller raises queued_ after queueing, then posts a wake-up only if the background thread
// is asleep (or about to be): it raises sleeping_ before its last look at queued_, so with both
// sequentially consistent either it sees the queue or this sees it sleeping. While it polls
// after work it looks at queued_ itself, without a syscall on either side.
// Found raised already, it is left as it is: the caller that raised it posted any wake-up
// needed, and the drain that lowers it does so before it takes mu_. So either that drain takes
// mu_ after this caller let go of it, and takes what this caller queued, or it lowered queued_
// before this caller's push, and this load reads that or a later raise (mu_ orders them).
void EngineImpl::Wake() {
  enqueued_.fetch_add(1, std::memory_order_relaxed);
  if (queued_.load(std::memory_order_relaxed)) return;
  queued_.store(true);
  if (sleeping_.load() && !wake_posted_.exchange(true)) asio::post(io_, [] {});
}

Status EngineImpl::Shutdown() {
  if (InForkedChild()) return Status::OK();  // the rank's engine, not this process's to stop
  {
    std::lock_guard<SpinLock> l(mu_);
    shutdown_requested_ = true;
  }
  Wake();
  std::lock_guard<std::mutex> l(join_mu_);  // several threads may call Shutdown at once
  if (thread_.joinable()) thread_.join();
  return Status::OK();
}

// ---------------------------------------------------------------- EngineImpl: enqueue

std::string EngineImpl::Describe(const Request& r) const {
  return std::string(OpTypeName(r.type)) + " '" + r.name + "' on rank " +
         std::to_string(options_.rank);
}

namespace {

// A list of splits for an error message: a caller's may be long; its head says enough.
std::string SplitsToString(const std::vector<int64_t>& splits) {
  constexpr size_t kShown = 8;
  if (splits.size() <= kShown) return ShapeToString(splits);
  std::string head = ShapeToString(std::vector<int64_t>(splits.begin(), splits.begin() + kShown));
  head.pop_back();  // its "]"
  return head + ", ... (" + std::to_string(splits.size()) + " in all)]";
}

// The largest tensor an operation takes: 64 TiB, so that a job's sum of such sizes over its
// ranks (an allgather's output) still fits in 64 bits.
constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 46;

// Whether a shape (no negative dimension) of elements of `element_bytes` holds at most
// kMaxTensorBytes, computed without overflow: a product that wraps would have the engine copy
// and reduce a size unrelated to the tensor's.
bool SizeWithinLimit(const std::vector<int64_t>& shape, size_t element_bytes) {
  for (int64_t d : shape) {
    if (d == 0) return true;
  }
  uint64_t elements = 1;
  const uint64_t most = kMaxTensorBytes / std::max<size_t>(element_bytes, 1);
  for (int64_t d : shape) {
    if (static_cast<uint64_t>(d) > most / elements) return false;
    elements *= static_cast<uint64_t>(d);
  }
  return true;
}

}  // namespace

Status EngineImpl::RefusalLocked(const Request& r, bool own_name) const {
  const int32_t id = r.process_set;
  if (r.type != OpType::kBarrier && r.type != OpType::kJoin && r.type != OpType::kProcessSet) {
    if (r.name.empty()) return Status::InvalidArgument(Describe(r) + ": the name is empty");
    if (!own_name && r.name[0] == kOwnNamePrefix[0] && r.name.rfind(kOwnNamePrefix, 0) == 0) {
      return Status::InvalidArgument(Describe(r) + ": names that start with '" + kOwnNamePrefix +
                                     "' are hvd's own (join, barrier and the like); choose "
                                     "another");
    }
  }
  if (id == kGlobalProcessSet) return Status::OK();  // always there, with every rank
  if (r.type == OpType::kJoin) {
    return Status::InvalidArgument(Describe(r) + ": join is of the global process set only");
  }
  auto it = known_sets_.find(id);
  if (it == known_sets_.end()) {
    return Status::InvalidArgument(Describe(r) + ": process set " + std::to_string(id) +
                                   " does not exist (it was removed, or never added)");
  }
  const std::vector<int>& ranks = it->second.ranks;
  if (!std::binary_search(ranks.begin(), ranks.end(), options_.rank)) {
    return Status::InvalidArgument(Describe(r) + ": this rank is not a member of process set " +
                                   std::to_string(id) + " (ranks [" + RankList(ranks) + "])");
  }
  return Status::OK();
}

Status EngineImpl::ValidateLocked(TensorEntry& e) const {
  Request& r = e.request;
  HVD_RETURN_IF_ERROR(CheckProcessSetLocked(r));
  // Built only for an error: this runs for every tensor a caller hands in.
  auto what = [&] { return Describe(r); };
  if (r.type != OpType::kBarrier && r.type != OpType::kJoin && r.type != OpType::kProcessSet) {
    if (static_cast<int>(e.input.dtype) >= kNumDataTypes) {
      return Status::InvalidArgument(what() + ": data type " +
                                     std::to_string(static_cast<int>(e.input.dtype)) +
                                     " is none of hvd's (hvd::DataType, hvd/types.h)");
    }
    if ((r.type == OpType::kAllreduce || r.type == OpType::kReducescatter) &&
        static_cast<int>(r.op) >= kNumReduceOps) {
      return Status::InvalidArgument(what() + ": reduce op " +
                                     std::to_string(static_cast<int>(r.op)) +
                                     " is none of hvd's (hvd::ReduceOp, hvd/types.h)");
    }
    if (e.input.device != kCpuDevice) {
      if (e.input.device < 0) {
        return Status::InvalidArgument(what() + ": device " + std::to_string(e.input.device) +
                                       " is neither the CPU (-1) nor a CUDA device ordinal");
      }
      if (GetDeviceRuntime() == nullptr) {
        return Status::FailedPrecondition(what() + ": device " + std::to_string(e.input.device) +
                                          " tensors need a build with CUDA; this build has CPU only");
      }
    }
    for (int64_t d : r.shape) {
      if (d < 0) return Status::InvalidArgument(what() + ": negative dimension in " + ShapeToString(r.shape));
    }
    if (!std::isfinite(r.prescale) || !std::isfinite(r.postscale)) {
      std::ostringstream os;
      os << what() << ": the scale factors must be finite numbers; got prescale " << r.prescale
         << " and postscale " << r.postscale;
      return Status::InvalidArgument(os.str());
    }
    if (!SizeWithinLimit(r.shape, DataTypeSize(e.input.dtype))) {
      return Status::InvalidArgument(what() + ": shape " + ShapeToString(r.shape) + " of " +
                                     DataTypeName(e.input.dtype) + " is over " +
                                     std::to_string(kMaxTensorBytes >> 40) +
                                     " TiB; hvd takes tensors of up to that size");
    }
    return ValidatePlacesLocked(e);
  }
  return Status::OK();
}

Status EngineImpl::ValidatePlacesLocked(const TensorEntry& e) const {
  const Request& r = e.request;
  if (e.output.data != nullptr && e.output.device != e.input.device) {
    return Status::InvalidArgument(Describe(r) + ": the output is on device " +
                                   std::to_string(e.output.device) + ", the input on " +
                                   std::to_string(e.input.device) + "; they must be on the same");
  }
  if (e.input.data == nullptr && NumElements(r.shape) * DataTypeSize(e.input.dtype) > 0) {
    return Status::InvalidArgument(Describe(r) + ": input data is null");
  }
  return Status::OK();
}

// The root and splits fit the operation's process set (which RefusalLocked found here, with
// this rank), and the root is turned into the set's rank.
Status EngineImpl::CheckProcessSetLocked(Request& r) const {
  auto what = [&] { return Describe(r); };
  const int32_t id = r.process_set;
  // The common case, for every gradient: of the checks below only Adasum's applies to an
  // allreduce.
  if (id == kGlobalProcessSet && r.type == OpType::kAllreduce && r.op != ReduceOp::kAdasum) {
    return Status::OK();
  }
  auto it = known_sets_.find(id);
  if (it == known_sets_.end()) return RefusalLocked(r);
  const std::vector<int>& ranks = it->second.ranks;
  const int n = static_cast<int>(ranks.size());
  auto place = [&ranks](int world) {
    auto p = std::lower_bound(ranks.begin(), ranks.end(), world);
    return p != ranks.end() && *p == world ? static_cast<int>(p - ranks.begin()) : -1;
  };
  // Built only for an error, as `what`: this runs for every tensor a caller hands in.
  auto in_set = [id] {
    return id == kGlobalProcessSet ? std::string("the world size")
                                   : "the size of process set " + std::to_string(id);
  };
  if (r.type == OpType::kBroadcast) {
    if (r.root < 0 || r.root >= options_.size) {
      return Status::InvalidArgument(what() + ": root rank " + std::to_string(r.root) +
                                     " is outside [0, " + std::to_string(options_.size) + ")");
    }
    if (place(r.root) < 0) {
      return Status::InvalidArgument(what() + ": root rank " + std::to_string(r.root) +
                                     " is not a member of process set " + std::to_string(id) +
                                     " (ranks [" + RankList(ranks) + "])");
    }
    r.root = place(r.root);
  }
  // Device tensors on NCCL combine hosts, not ranks, by Adasum (execute_device.cc): their
  // execution checks the count it needs, alike on every rank.
  if (r.op == ReduceOp::kAdasum && r.type == OpType::kAllreduce && r.device == kCpuDevice &&
      (n & (n - 1)) != 0) {
    return Status::InvalidArgument(what() + ": Adasum needs a number of ranks that is a power of "
                                   "two; " + in_set() + " is " + std::to_string(n));
  }
  if (r.type == OpType::kAlltoall) {
    const int64_t rows = r.shape[0];
    if (r.splits.empty()) {
      if (rows % n != 0) {
        return Status::InvalidArgument(what() + ": first dimension " + std::to_string(rows) +
                                       " is not divisible by " + in_set() + " " +
                                       std::to_string(n) + "; pass splits");
      }
    } else if (static_cast<int>(r.splits.size()) != n) {
      return Status::InvalidArgument(what() + ": splits must be " + std::to_string(n) +
                                     " row counts (" + in_set() + "); got " +
                                     SplitsToString(r.splits));
    }
  }
  return Status::OK();
}

void EngineImpl::TakeShell(Request* r) {
  if (InForkedChild()) return;  // the lock may have been held by a thread the fork left behind
  std::lock_guard<ShortMutex> l(shells_mu_);
  if (shells_.empty()) return;
  r->name.swap(shells_.back().name);
  r->shape.swap(shells_.back().shape);
  shells_.pop_back();
}

HandlePtr EngineImpl::Enqueue(TensorEntry&& entry) {
  HandlePtr handle = entry.handle;
  Submit(&entry, 1);
  return handle;
}

std::vector<HandlePtr> EngineImpl::EnqueueGroup(std::vector<TensorEntry> entries) {
  std::vector<HandlePtr> handles;
  handles.reserve(entries.size());
  for (auto& e : entries) handles.push_back(e.handle);
  Submit(entries.data(), entries.size());
  return handles;
}

namespace {

// The rank refuses an operation's arguments: it goes to the coordinator all the same, saying
// why, and fails on every rank together (Request::error).
void RefuseArguments(Request& r, const Status& why) {
  r.error = why.message();
  r.error_code = why.code();
  r.splits.clear();  // the coordinator reads none of a refusal's fields: it need not carry them
  // A data type or reduce op out of range (a cast of a wrong number) could not travel: the
  // other ranks' decoders would take the list for garbage, and the sender for a lost peer.
  if (static_cast<int>(r.dtype) >= kNumDataTypes) r.dtype = DataType::kUInt8;
  if (static_cast<int>(r.op) >= kNumReduceOps) r.op = ReduceOp::kSum;
}

}  // namespace

namespace {

// A group's key: its first name, its size and a digest of every member's name (name_at(i) for
// member i), so that ranks whose groups differ in any member disagree on it (the coordinator
// then fails them as a whole) instead of each waiting for members the others never send.
template <typename NameAt>
std::string GroupKey(size_t n, NameAt name_at) {
  uint64_t digest = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (size_t i = 0; i < n; ++i) {
    for (unsigned char c : name_at(i)) digest = (digest ^ c) * 1099511628211ull;
    digest = (digest ^ 0xff) * 1099511628211ull;  // between names: 0xff is in no UTF-8 text
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(digest));
  return name_at(0) + "#group/" + std::to_string(n) + "/" + hex;
}

}  // namespace

// Refuses n entries (a group when n > 1) on this rank, or queues them; an entry whose arguments
// are wrong is queued with its refusal, which every rank hears of (RefuseArguments).
void EngineImpl::Submit(TensorEntry* entries, size_t n) {
  TensorEntry* const end = entries + n;
  if (InForkedChild()) {
    const Status s = ForkedRefusal();
    for (TensorEntry* p = entries; p != end; ++p) {
      p->handle->refused_ = true;
      p->handle->Complete(s);
    }
    return;
  }
  {
    std::unique_lock<SpinLock> l(mu_);
    Status s = SubmitRefusalLocked();
    std::unordered_set<std::string_view> names;  // of a group (one tensor needs no check)
    if (n > 1) names.reserve(n);
    for (TensorEntry* p = entries; p != end; ++p) {
      TensorEntry& e = *p;
      if (!s.ok()) break;
      if (e.request.type == OpType::kBarrier) {
        auto it = known_sets_.find(e.request.process_set);
        uint64_t count = it == known_sets_.end() ? 0 : it->second.barriers++;
        e.request.name = kOwnNamePrefix + ("barrier." + std::to_string(count));
      }
      if (e.request.type == OpType::kJoin) e.request.name = kJoinName;
      if (e.request.type == OpType::kProcessSet) {
        // One at a time on a rank (engine_impl.h, sets_): a removed set's id may go to the next
        // addition only once every rank has executed the removal.
        if (process_set_call_ && !process_set_call_->Finished()) {
          s = Status::FailedPrecondition(
              "another process set addition or removal is in flight on rank " +
              std::to_string(options_.rank) + "; they run one at a time, in the same order on "
              "every rank (call them from one thread)");
          break;
        }
        process_set_call_ = e.handle;
        e.request.name = kOwnNamePrefix + ("process_set." + std::to_string(process_set_ops_++));
      }
      s = RefusalLocked(e.request, e.own_name);
      if (s.ok() && e.request.error.empty()) {
        const Status bad = ValidateLocked(e);
        if (!bad.ok()) RefuseArguments(e.request, bad);
      }
      if (s.ok() && e.input.device != kCpuDevice && e.request.type == OpType::kJoin) {
        if (GetDeviceRuntime() == nullptr) {
          s = Status::FailedPrecondition(Describe(e.request) + ": device " +
                                         std::to_string(e.input.device) +
                                         " needs a build with CUDA; this build has CPU only");
        }
      } else if (s.ok() && e.input.device != kCpuDevice && e.request.error.empty()) {
        // A device this rank cannot use (a CUDA error, a build without CUDA) fails the
        // operation on every rank, with this rank's reason, not here alone while the others
        // wait for it.
        const Status ready = RecordReady(e);
        if (!ready.ok()) {
          RefuseArguments(e.request,
                          Status(ready.code(), Describe(e.request) + ": " + ready.message()));
        }
      }
      if (s.ok() && n > 1 && !names.insert(e.request.name).second) {
        s = Status::InvalidArgument("group has the name '" + e.request.name + "' twice");
      }
      if (s.ok()) {  // in flight from here until it completes (CompleteEntries)
        const bool global = e.request.process_set == kGlobalProcessSet;
        const std::string key =
            global ? std::string() : PendingKey(e.request.process_set, e.request.name);
        const std::string_view k =
            global ? std::string_view(e.request.name) : std::string_view(key);
        e.in_flight = in_flight_.Acquire(k);  // filled in below, once all pass
        if (e.in_flight == nullptr) {
          s = e.request.type == OpType::kJoin
                  ? Status::InvalidArgument(Describe(e.request) + ": a join is already in "
                                            "flight on this rank; wait for it before the next")
                  : InFlightAlready(Describe(e.request));
        }
      }
    }
    if (!s.ok()) {
      for (TensorEntry* p = entries; p != end; ++p) {
        // A group's members taken before one failed; no sweep: only the background thread
        // erases nodes (engine_impl.h), at its next drain.
        in_flight_.Release(static_cast<InFlightNode*>(p->in_flight), /*sweep=*/false);
        sweep_wanted_ = true;
        p->in_flight = nullptr;
        p->handle->refused_ = true;
        p->handle->Complete(s);
      }
      l.unlock();
      PayOwedFailureNote();  // before the caller sees the refusal (engine_impl.h)
      return;
    }
    if (n > 1) {
      const std::string key =
          GroupKey(n, [entries](size_t i) -> const std::string& { return entries[i].request.name; });
      for (TensorEntry* p = entries; p != end; ++p) {
        p->request.group = key;
        p->request.group_size = static_cast<int32_t>(n);
      }
    }
    for (TensorEntry* p = entries; p != end; ++p) {
      TensorEntry& e = *p;
      SetWaitPolicy(e);
      auto* node = static_cast<InFlightNode*>(e.in_flight);
      node->value = std::move(e);
      queue_.push_back(node);
    }
  }
  Wake();
}

Status EngineImpl::SubmitRefusalLocked() const {
  if (!dead_.ok()) return dead_;
  if (shutdown_requested_) return Status::Aborted("hvd has been shut down");
  return Status::OK();
}

Status EngineImpl::ForkedRefusal() const {
  return Status::FailedPrecondition(
      "this process (pid " + std::to_string(::getpid()) + ") was forked from rank " +
      std::to_string(options_.rank) + " (pid " + std::to_string(pid_) +
      ") after hvd was initialized there, and has none of its threads: run hvd's operations in "
      "the rank's own process (not in a DataLoader worker or a forked pool)");
}

Status EngineImpl::InFlightAlready(const std::string& described) {
  return Status::InvalidArgument(described + ": a tensor with this name is already in flight "
                                 "on this rank; wait for it before reusing the name");
}

void EngineImpl::SetWaitPolicy(TensorEntry& e) const {
  SetWaitPolicy(e, static_cast<int64_t>(RequestBytes(e.request)));
}

void EngineImpl::SetWaitPolicy(TensorEntry& e, int64_t bytes) const {
  const bool small = bytes <= static_cast<int64_t>(kSmallWaitBytes);
  e.handle->spin_ = !oversubscribed_ || small ? spin_ : std::chrono::microseconds(0);
  e.handle->helper_ = helper_;
  // A device tensor's host work is mostly a launch whatever its size (its collective runs on
  // the GPU): the caller that waits launches it, sparing two hand-offs between threads
  // (CallerMayExecute leaves responses with large host work to the background thread). Where
  // ranks outnumber cores a caller helps only while it polls (operations of up to
  // kSmallWaitBytes): each hand-off between a rank's two threads there waits for a time slice.
  e.handle->helps_ = bytes <= static_cast<int64_t>(kCallerRunsBytes) ||
                     e.input.device != kCpuDevice;
}

// An allreduce written into its name's node of in_flight_ (as its last release left it,
// NameTableReset); whether its request is the one the node held (then where the response
// cache had it stays known, TensorEntry::hint_contents).
bool EngineImpl::FillAllreduceLocked(InFlightNode* node, const std::string& name,
                                     const TensorView& in, const TensorView& out, ReduceOp op,
                                     double prescale, double postscale, int32_t process_set,
                                     const std::string& group, int32_t group_size,
                                     const HandlePtr& h) {
  TensorEntry& e = node->value;
  Request& r = e.request;
  // The name is the node's: the same wherever the rest is.
  const bool same = e.hint_contents != 0 && r.error.empty() && r.type == OpType::kAllreduce &&
                    r.dtype == in.dtype && r.op == op && r.root == -1 && r.device == in.device &&
                    r.prescale == prescale && r.postscale == postscale && r.splits.empty() &&
                    r.group_size == group_size && r.group == group &&
                    r.process_set == process_set &&
                    std::equal(r.shape.begin(), r.shape.end(), in.shape.begin(), in.shape.end());
  if (!same) {
    e.hint_contents = 0;
    r.type = OpType::kAllreduce;
    r.name.assign(name);
    r.dtype = in.dtype;
    r.op = op;
    r.root = -1;
    r.device = in.device;
    r.prescale = prescale;
    r.postscale = postscale;
    r.shape.assign(in.shape.begin(), in.shape.end());
    r.splits.clear();
    r.group.assign(group);
    r.group_size = group_size;
    r.process_set = process_set;
    r.error.clear();
  }
  // (Where it is the same, every field already holds what it would be set to, the name
  // included: it is the node's key, or the set's key's.)
  assert(r.name == name);
  e.input = TensorPlace{in.data, in.dtype, in.device, in.stream};
  e.output = TensorPlace{out.data, out.dtype, out.device, out.stream};
  e.handle = h;
  e.in_flight = node;
  e.keeps_storage = true;
  return same;
}

// Submit for one host allreduce, built in its name's node of in_flight_ instead of moved
// there: a training step's gradients are allreduces, and the node keeps the storage of the
// name and shape it held the last time the name was used (keeps_storage), so that a step of
// the same tensors copies no entry and hands no storage around.
HandlePtr EngineImpl::SubmitAllreduce(const std::string& name, const TensorView& in,
                                      const TensorView& out, ReduceOp op, double prescale,
                                      double postscale, int32_t process_set) {
  HandlePtr h = NewHandle();
  if (InForkedChild()) {
    h->refused_ = true;
    h->Complete(ForkedRefusal());
    return h;
  }
  const bool global = process_set == kGlobalProcessSet;
  const std::string key = global ? std::string() : PendingKey(process_set, name);
  const std::string_view k = global ? std::string_view(name) : std::string_view(key);
  Status bad;  // what is wrong with the arguments: every rank hears of it (Request::error)
  {
    std::unique_lock<SpinLock> l(mu_);
    Status s = SubmitRefusalLocked();
    InFlightNode* node = s.ok() ? in_flight_.Acquire(k) : nullptr;
    if (s.ok() && node == nullptr) {
      s = InFlightAlready(std::string(OpTypeName(OpType::kAllreduce)) + " '" + name +
                          "' on rank " + std::to_string(options_.rank));  // as Describe()
    }
    if (s.ok()) {
      const bool same = FillAllreduceLocked(node, name, in, out, op, prescale, postscale,
                                            process_set, std::string(), 0, h);
      // The same request of the global set passed every check of the request itself when it
      // was last submitted (a cached request was validated): only the places are new.
      if (!same || process_set != kGlobalProcessSet) s = RefusalLocked(node->value.request);
      if (s.ok()) {
        bad = same && process_set == kGlobalProcessSet && op != ReduceOp::kAdasum
                  ? ValidatePlacesLocked(node->value)
                  : ValidateLocked(node->value);
      }
      if (!s.ok() || !bad.ok()) {
        // Taken before the checks (which read the entry): freed again, and swept by the
        // background thread at its next drain, so that refusals under ever new names do not
        // pile up nodes.
        in_flight_.Release(node, /*sweep=*/false);
        sweep_wanted_ = true;
      }
    }
    if (!s.ok()) {
      h->refused_ = true;
      h->Complete(s);
      l.unlock();
      PayOwedFailureNote();  // before the caller sees the refusal (engine_impl.h)
      return h;
    }
    if (bad.ok()) {
      SetWaitPolicy(node->value, in.num_elements() * DataTypeSize(in.dtype));
      queue_.push_back(node);
    }
  }
  if (!bad.ok()) {  // negotiated as any other operation, carrying the refusal
    TensorEntry e = MakeEntry(*this, OpType::kAllreduce, name, in, out, process_set);
    e.request.op = op;
    e.request.prescale = prescale;
    e.request.postscale = postscale;
    e.handle = h;
    RefuseArguments(e.request, bad);
    Submit(&e, 1);
    return h;
  }
  Wake();
  return h;
}

// A grouped allreduce of host tensors whose arguments this rank has checked (n > 1), each
// built in its name's node as SubmitAllreduce builds one: a step's group of the same tensors
// copies no entry and hands no storage around, and where the response cache had each member
// stays known. False, with nothing taken and nothing queued, where the group needs Submit's
// general path: the engine refuses new operations, a name is in flight (or twice in the
// group), or a member fails a check there (which says why).
bool EngineImpl::SubmitGroupedAllreduce(const std::vector<std::string>& names,
                                        const std::vector<TensorView>& inputs,
                                        const std::vector<TensorView>& outputs, ReduceOp op,
                                        double prescale, double postscale, int32_t process_set,
                                        std::vector<HandlePtr>* handles) {
  const size_t n = names.size();
  if (n < 2 || InForkedChild()) return false;
  const std::string group =
      GroupKey(n, [&names](size_t i) -> const std::string& { return names[i]; });
  handles->clear();
  handles->reserve(n);
  for (size_t i = 0; i < n; ++i) handles->push_back(NewHandle());
  std::vector<InFlightNode*> nodes;
  nodes.reserve(n);
  const bool global = process_set == kGlobalProcessSet;
  std::vector<std::string> keys;  // of another set's names, made before the lock is taken
  if (!global) {
    keys.reserve(n);
    for (const std::string& name : names) keys.push_back(PendingKey(process_set, name));
  }
  {
    std::lock_guard<SpinLock> l(mu_);
    bool ok = SubmitRefusalLocked().ok();
    for (size_t i = 0; ok && i < n; ++i) {
      InFlightNode* node =
          in_flight_.Acquire(global ? std::string_view(names[i]) : std::string_view(keys[i]));
      if (node == nullptr) break;
      nodes.push_back(node);
      const bool same = FillAllreduceLocked(node, names[i], inputs[i], outputs[i], op, prescale,
                                            postscale, process_set, group,
                                            static_cast<int32_t>(n), (*handles)[i]);
      // (As SubmitAllreduce: a request of the global set that is the same as before passed
      // every check of the request itself.)
      if (!same || !global) ok = RefusalLocked(node->value.request).ok();
      if (ok) {
        ok = (same && global && op != ReduceOp::kAdasum ? ValidatePlacesLocked(node->value)
                                                        : ValidateLocked(node->value))
                 .ok();
      }
    }
    if (!ok || nodes.size() < n) {
      for (InFlightNode* node : nodes) in_flight_.Release(node, /*sweep=*/false);
      if (!nodes.empty()) sweep_wanted_ = true;
      return false;
    }
    for (size_t i = 0; i < n; ++i) {
      SetWaitPolicy(nodes[i]->value, inputs[i].num_elements() * DataTypeSize(inputs[i].dtype));
      queue_.push_back(nodes[i]);
    }
  }
  Wake();
  return true;
}

// ---------------------------------------------------------------- EngineImpl: process sets

HandlePtr EngineImpl::EnqueueProcessSetOp(std::vector<int> ranks, int32_t remove,
                                          const std::string& problem) {
  TensorEntry e = MakeEntry(*this, OpType::kProcessSet, "", TensorView(), TensorView(),
                            kGlobalProcessSet);
  e.request.shape.clear();
  e.request.root = remove;
  e.request.splits.assign(ranks.begin(), ranks.end());
  if (!problem.empty()) {  // negotiated all the same: every rank's call fails with it
    RefuseArguments(e.request, Status::InvalidArgument(problem + " (on rank " +
                                                       std::to_string(options_.rank) + ")"));
  }
  return Enqueue(std::move(e));
}

StatusOr<int32_t> EngineImpl::AddProcessSet(std::vector<int> ranks, bool at_init) {
  if (!at_init && !options_.dynamic_process_sets) {
    return Status::FailedPrecondition(
        "adding a process set after the engine started needs HVD_DYNAMIC_PROCESS_SETS=1 "
        "(HOROVOD_DYNAMIC_PROCESS_SETS); or pass the sets to init");
  }
  std::sort(ranks.begin(), ranks.end());
  // A list that one rank alone gets wrong fails the call on every rank (RefuseArguments).
  std::string problem;
  if (ranks.empty()) problem = "a process set needs at least one rank";
  for (size_t i = 0; i < ranks.size() && problem.empty(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= options_.size) {
      problem = "process set rank " + std::to_string(ranks[i]) + " is outside [0, " +
                std::to_string(options_.size) + ")";
    } else if (i > 0 && ranks[i] == ranks[i - 1]) {
      problem = "process set has rank " + std::to_string(ranks[i]) + " twice";
    }
  }
  HandlePtr h = EnqueueProcessSetOp(std::move(ranks), 0, problem);
  HVD_RETURN_IF_ERROR(h->Wait());
  return h->process_set_id();
}

Status EngineImpl::RemoveProcessSet(int32_t id) {
  if (!options_.dynamic_process_sets) {
    return Status::FailedPrecondition(
        "removing a process set needs HVD_DYNAMIC_PROCESS_SETS=1 (HOROVOD_DYNAMIC_PROCESS_SETS)");
  }
  return EnqueueProcessSetOp(
             {}, id, id == kGlobalProcessSet ? "the global process set cannot be removed" : "")
      ->Wait();
}

std::vector<int> EngineImpl::ProcessSetRanks(int32_t id) const {
  // In a forked child (one thread) the sets are read as the fork left them: the lock may have
  // been held by a thread that stayed in the parent.
  std::unique_lock<SpinLock> l(mu_, std::defer_lock);
  if (!InForkedChild()) l.lock();
  auto it = known_sets_.find(id);
  return it == known_sets_.end() ? std::vector<int>() : it->second.ranks;
}

Status EngineImpl::StartTimeline(const std::string& path, bool mark_cycles) {
  // Without a timeline at start, SwitchTimeline's error comes first.
  if (!options_.timeline_path.empty() && (path.empty() || IsDynamicTimeline(path))) {
    return Status::InvalidArgument("start_timeline needs the path of the file to write, got '" +
                                   path + "'");
  }
  return SwitchTimeline(path, mark_cycles, "starting a timeline while the job runs");
}

Status EngineImpl::StopTimeline() { return SwitchTimeline("", false, "stopping a timeline"); }

Status EngineImpl::SwitchTimeline(std::string path, bool mark_cycles, const char* what) {
  if (InForkedChild()) return ForkedRefusal();
  if (options_.timeline_path.empty()) {
    return Status::FailedPrecondition(std::string(what) +
                                      " needs HOROVOD_TIMELINE=DYNAMIC (or HVD_) or a timeline "
                                      "file when the engine starts");
  }
  const bool stopping = path.empty();
  uint64_t ticket;
  {
    std::lock_guard<SpinLock> l(mu_);
    ticket = ++timeline_switches_;
    timeline_switch_ =
        std::make_unique<TimelineSwitch>(TimelineSwitch{std::move(path), mark_cycles, ticket});
  }
  Wake();
  // Returns once the switch is applied: the stopped file is whole on disk
  // (a caller reads it next), and what is submitted from now on goes to the new one.
  const Deadline deadline = DeadlineAfterSeconds(options_.timeout_seconds);
  while (timeline_switched_.load() < ticket) {
    {
      std::unique_lock<SpinLock> l(mu_);
      // An engine that has ended (another rank shut the job down) closes its file as it stops:
      // a stop has nothing left to do.
      if (!dead_.ok()) {
        Status s = stopping ? Status::OK() : dead_.WithContext(what);
        l.unlock();
        if (!s.ok()) PayOwedFailureNote();  // before the caller sees the failure
        return s;
      }
      if (shutdown_requested_) {
        return stopping ? Status::OK()
                        : Status::Aborted(std::string(what) + ": hvd is shutting down");
      }
    }
    if (Clock::now() >= deadline) {
      return Status::Timeout(std::string(what) + ": the engine did not take it within " +
                             std::to_string(options_.timeout_seconds) + " s");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    Wake();
  }
  return Status::OK();
}

std::vector<int32_t> EngineImpl::ProcessSetIds() const {
  std::unique_lock<SpinLock> l(mu_, std::defer_lock);  // as ProcessSetRanks
  if (!InForkedChild()) l.lock();
  std::vector<int32_t> ids;
  for (const auto& kv : known_sets_) ids.push_back(kv.first);
  return ids;
}

// ---------------------------------------------------------------- Engine (public API)

Engine::Engine(std::unique_ptr<EngineImpl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() {
  // In a forked child the engine's state is the rank's (its threads, sockets and shared memory
  // segments live on there): torn down here it would be stopped twice. It is left as it is.
  if (impl_ && impl_->InForkedChild()) (void)impl_.release();
}

StatusOr<int64_t> EngineImpl::LatestGeneration() {
  std::lock_guard<std::mutex> l(elastic_mu_);
  if (!elastic_store_) return options_.elastic_generation;
  auto g = hvd::LatestGeneration(*elastic_store_, DeadlineAfterSeconds(options_.timeout_seconds));
  if (!g.ok()) return g.status().WithContext("reading hvdrun's newest world");
  return std::max(*g, options_.elastic_generation);
}

Status EngineImpl::MarkHoldsState() {
  std::lock_guard<std::mutex> l(elastic_mu_);
  if (!elastic_store_ || holds_marked_) return Status::OK();
  Status s = elastic_store_->Set(ElasticHoldsKey(options_.elastic_id),
                                 std::to_string(options_.elastic_generation),
                                 DeadlineAfterSeconds(options_.timeout_seconds));
  if (!s.ok()) return s.WithContext("telling hvdrun this worker holds the state");
  holds_marked_ = true;
  return Status::OK();
}

void EngineImpl::ReportLeftWorld(const Status& why) {
  std::lock_guard<std::mutex> l(elastic_mu_);
  if (!elastic_store_) return;
  Status s = ReportLeft(*elastic_store_, options_.elastic_generation, options_.elastic_id,
                        why.message());
  if (!s.ok()) {
    HVD_LOG(kWarning) << "could not tell hvdrun this worker left its world: " << s.ToString();
  }
}

namespace {

// Engine::Create in an elastic job (bootstrap/elastic.h): join the newest world and form it;
// a world that cannot form because a worker died meanwhile gives way to the next one.
StatusOr<std::unique_ptr<EngineImpl>> CreateElastic(const Options& options) {
  HVD_RETURN_IF_ERROR(options.Validate());
  SetLogLevel(options.log_level);
  const Deadline deadline = DeadlineAfterSeconds(options.elastic_timeout_seconds);
  auto store = StoreClient::Connect(options.rendezvous_addr, options.rendezvous_port, deadline,
                                    options.secret);
  if (!store.ok()) {
    return store.status().WithContext("elastic worker " + options.elastic_id +
                                      ": hvdrun's rendezvous store");
  }
  int64_t after = options.elastic_after_generation;
  if (after > 0) {
    // This process ran world `after` and asks for the next one (hvd.elastic.run's reset after
    // an error, whatever it was): it has left that world. Where the world broke under it the
    // engine said so with the reason already; else (a clean shutdown: the error was raised on
    // no peer's account, or every rank shut down) hvdrun learns it here, and forms the next
    // world once every member has.
    std::string said;
    auto found = (*store)->TryGet(ElasticLeftKey(after, options.elastic_id), &said, deadline);
    if (found.ok() && !*found) {
      Status told = ReportLeft(**store, after, options.elastic_id,
                               "worker " + options.elastic_id + " shut down world " +
                                   std::to_string(after) + " and asks for the next");
      if (!told.ok()) {
        HVD_LOG(kWarning) << "could not tell hvdrun this worker left its world: "
                          << told.ToString();
      }
    }
  }
  const bool trained = after > 0;  // (a new worker's world that never formed does not count)
  while (true) {
    Options o = options;
    o.elastic_after_generation = after;
    HVD_RETURN_IF_ERROR(JoinWorld(**store, &o, deadline, trained));
    auto impl = EngineImpl::Create(o);
    if (impl.ok()) {
      (*impl)->set_elastic_store(std::move(*store));
      return impl;
    }
    const StatusCode code = impl.status().code();
    if (code != StatusCode::kPeerLost && code != StatusCode::kTimeout) return impl.status();
    HVD_LOG(kWarning) << "world " << o.elastic_generation << " did not form ("
                      << impl.status().ToString() << "); waiting for hvdrun's next world";
    // As a worker whose world broke: hvdrun then stops a member that never came (a host cut
    // off while the world formed), or publishes the next world once every member has left.
    Status told = ReportLeft(**store, o.elastic_generation, o.elastic_id,
                             "world " + std::to_string(o.elastic_generation) +
                                 " did not form: " + impl.status().message());
    if (!told.ok()) {
      HVD_LOG(kWarning) << "could not tell hvdrun this worker left its world: "
                        << told.ToString();
    }
    after = o.elastic_generation;
  }
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Create(const Options& options) {
  RaiseDescriptorLimit();  // one or more per peer (common/descriptors.h)
  auto impl = options.elastic ? CreateElastic(options) : EngineImpl::Create(options);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<Engine>(new Engine(std::move(*impl)));
}

StatusOr<std::unique_ptr<Engine>> Engine::Reset(std::unique_ptr<Engine> engine) {
  Options o = engine->options();
  o.elastic_after_generation = o.elastic_generation;
  engine->Shutdown();
  engine.reset();
  return Create(o);
}

StatusOr<bool> Engine::HostsUpdated() {
  const Options& o = impl_->options();
  if (!o.elastic) return false;
  int64_t latest = o.elastic_generation;
  if (o.rank == 0) {
    auto g = impl_->LatestGeneration();
    if (!g.ok()) return g.status();
    latest = *g;
  }
  // Every rank takes rank 0's answer, so that every rank resets, or none.
  TensorView t(&latest, DataType::kInt64, {1});
  TensorEntry e = MakeEntry(*impl_, OpType::kBroadcast,
                            std::string(kOwnNamePrefix) + "elastic.hosts_updated", t, t,
                            kGlobalProcessSet);
  e.request.root = 0;
  e.own_name = true;
  Status s = impl_->Enqueue(std::move(e))->Wait();
  if (!s.ok()) return s;
  // A commit: this worker went on from the state it was given (StateSynced).
  HVD_RETURN_IF_ERROR(impl_->MarkHoldsState());
  return latest > o.elastic_generation;
}

Status Engine::StateSynced() { return impl_->MarkHoldsState(); }

int64_t Engine::elastic_generation() const { return impl_->options().elastic_generation; }

StatusOr<std::unique_ptr<Engine>> Engine::CreateFromEnvironment() {
  auto o = Options::FromEnvironment();
  if (!o.ok()) return o.status();
  return Create(*o);
}

Status Engine::Shutdown() { return impl_->Shutdown(); }
int Engine::rank() const { return impl_->options().rank; }
int Engine::size() const { return impl_->options().size; }
int Engine::local_rank() const { return impl_->options().local_rank; }
int Engine::local_size() const { return impl_->options().local_size; }
int Engine::cross_rank() const { return impl_->options().cross_rank; }
int Engine::cross_size() const { return impl_->options().cross_size; }
bool Engine::mpi_threads_supported() const { return impl_->mpi_thread_multiple(); }
const Options& Engine::options() const { return impl_->options(); }
StatusOr<int32_t> Engine::AddProcessSet(std::vector<int> ranks) {
  return impl_->AddProcessSet(std::move(ranks));
}
Status Engine::RemoveProcessSet(int32_t id) { return impl_->RemoveProcessSet(id); }
std::vector<int> Engine::ProcessSetRanks(int32_t id) const { return impl_->ProcessSetRanks(id); }
std::vector<int32_t> Engine::ProcessSetIds() const { return impl_->ProcessSetIds(); }

Status Engine::StartTimeline(const std::string& path, bool mark_cycles) {
  return impl_->StartTimeline(path, mark_cycles);
}

Status Engine::StopTimeline() { return impl_->StopTimeline(); }

namespace {

// An entry whose arguments this rank refuses for `problem` (none where it is empty): queued all
// the same, saying why, so that every rank fails it together (EngineImpl::Submit).
void RefuseArguments(const EngineImpl& impl, TensorEntry& e, const std::string& problem) {
  if (!problem.empty()) {
    RefuseArguments(e.request, Status::InvalidArgument(impl.Describe(e.request) + ": " + problem));
  }
}

// What is wrong with an allreduce's arguments ("": nothing), for RefuseArguments.
std::string AllreduceArgsProblem(const TensorView& in, const TensorView& out, ReduceOp op) {
  if (in.dtype != out.dtype || in.num_elements() != out.num_elements()) {
    return std::string("output ") + DataTypeName(out.dtype) + out.ShapeString() +
           " does not match input " + DataTypeName(in.dtype) + in.ShapeString();
  }
  if (out.data == nullptr && out.num_elements() > 0) return "output data is null";
  if (in.dtype == DataType::kBool && op == ReduceOp::kAverage) {
    return "average is not defined for bool";
  }
  if (op == ReduceOp::kAdasum && in.dtype != DataType::kFloat16 &&
      in.dtype != DataType::kFloat32 && in.dtype != DataType::kFloat64) {
    return std::string("Adasum reduces float16, float32 and float64 tensors, not ") +
           DataTypeName(in.dtype);
  }
  return "";
}

}  // namespace

HandlePtr Engine::Allreduce(const std::string& name, const TensorView& input,
                            const TensorView& output, ReduceOp op, double prescale,
                            double postscale, int32_t process_set) {
  std::string problem = AllreduceArgsProblem(input, output, op);
  if (input.device == kCpuDevice && problem.empty()) {
    return impl_->SubmitAllreduce(name, input, output, op, prescale, postscale, process_set);
  }
  TensorEntry e = MakeEntry(*impl_, OpType::kAllreduce, name, input, output, process_set);
  e.request.op = op;
  e.request.prescale = prescale;
  e.request.postscale = postscale;
  RefuseArguments(*impl_, e, problem);
  return impl_->Enqueue(std::move(e));
}

std::vector<HandlePtr> Engine::GroupedAllreduce(const std::vector<std::string>& names,
                                                const std::vector<TensorView>& inputs,
                                                const std::vector<TensorView>& outputs,
                                                ReduceOp op, double prescale, double postscale,
                                                int32_t process_set) {
  if (names.size() != inputs.size() || names.size() != outputs.size() || names.empty()) {
    std::vector<HandlePtr> hs(std::max<size_t>(names.size(), 1));
    for (auto& h : hs) h = Failed(Status::InvalidArgument("grouped allreduce: names, inputs and outputs differ in length or are empty"));
    return hs;
  }
  bool host = names.size() > 1;  // and every member's arguments sound
  for (size_t i = 0; host && i < names.size(); ++i) {
    host = inputs[i].device == kCpuDevice && AllreduceArgsProblem(inputs[i], outputs[i], op).empty();
  }
  std::vector<HandlePtr> handles;
  if (host && impl_->SubmitGroupedAllreduce(names, inputs, outputs, op, prescale, postscale,
                                            process_set, &handles)) {
    return handles;
  }
  std::vector<TensorEntry> entries;
  entries.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    TensorEntry e =
        MakeEntry(*impl_, OpType::kAllreduce, names[i], inputs[i], outputs[i], process_set);
    e.request.op = op;
    e.request.prescale = prescale;
    e.request.postscale = postscale;
    RefuseArguments(*impl_, e, AllreduceArgsProblem(inputs[i], outputs[i], op));
    entries.push_back(std::move(e));
  }
  return impl_->EnqueueGroup(std::move(entries));
}

HandlePtr Engine::Allgather(const std::string& name, const TensorView& input,
                            OutputAllocator allocator, int32_t process_set) {
  TensorEntry e = MakeEntry(*impl_, OpType::kAllgather, name, input, TensorView(), process_set);
  if (e.request.shape.empty()) e.request.shape = {1};
  e.allocator = std::move(allocator);
  return impl_->Enqueue(std::move(e));
}

std::vector<HandlePtr> Engine::GroupedAllgather(const std::vector<std::string>& names,
                                                const std::vector<TensorView>& inputs,
                                                int32_t process_set) {
  std::vector<TensorEntry> entries;
  entries.reserve(names.size());
  for (size_t i = 0; i < names.size() && i < inputs.size(); ++i) {
    TensorEntry e =
        MakeEntry(*impl_, OpType::kAllgather, names[i], inputs[i], TensorView(), process_set);
    if (e.request.shape.empty()) e.request.shape = {1};
    entries.push_back(std::move(e));
  }
  if (entries.empty() || names.size() != inputs.size()) {
    return {Failed(Status::InvalidArgument("grouped allgather: names and inputs differ in length or are empty"))};
  }
  return impl_->EnqueueGroup(std::move(entries));
}

HandlePtr Engine::Broadcast(const std::string& name, const TensorView& input,
                            const TensorView& output, int root, int32_t process_set) {
  TensorEntry e = MakeEntry(*impl_, OpType::kBroadcast, name, input, output, process_set);
  e.request.root = root;
  if (input.dtype != output.dtype || input.num_elements() != output.num_elements()) {
    RefuseArguments(*impl_, e, std::string("output ") + DataTypeName(output.dtype) +
                                   output.ShapeString() + " does not match input " +
                                   DataTypeName(input.dtype) + input.ShapeString());
  } else if (output.data == nullptr && output.num_elements() > 0) {
    RefuseArguments(*impl_, e, "output data is null");
  }
  return impl_->Enqueue(std::move(e));
}

HandlePtr Engine::Alltoall(const std::string& name, const TensorView& input,
                           const std::vector<int64_t>& splits, OutputAllocator allocator,
                           int32_t process_set) {
  TensorEntry e = MakeEntry(*impl_, OpType::kAlltoall, name, input, TensorView(), process_set);
  e.allocator = std::move(allocator);
  if (e.request.shape.empty()) {
    RefuseArguments(*impl_, e, "input must have at least one dimension");
    return impl_->Enqueue(std::move(e));
  }
  int64_t rows = e.request.shape[0];
  if (!splits.empty()) {  // their number is checked against the set's size at enqueue
    int64_t sum = 0;
    bool bad = false;
    for (int64_t s : splits) {
      bad |= s < 0 || s > rows - sum;  // (sum <= rows throughout: it cannot wrap)
      if (bad) break;
      sum += s;
    }
    // As in Horovod, rows past the splits' sum are not sent.
    if (bad || sum > rows) {
      RefuseArguments(*impl_, e, "splits must be non-negative row counts whose sum is at most "
                                 "the first dimension " + std::to_string(rows) + "; got " +
                                 SplitsToString(splits));
    } else {
      e.request.splits = splits;
    }
  }
  return impl_->Enqueue(std::move(e));
}

namespace {

// What is wrong with a reducescatter's arguments ("": nothing), for RefuseArguments.
std::string ReducescatterArgsProblem(const TensorView& input, ReduceOp op) {
  if (input.shape.empty()) return "input must have at least one dimension";
  if (input.dtype == DataType::kBool && op == ReduceOp::kAverage) {
    return "average is not defined for bool";
  }
  if (op == ReduceOp::kAdasum) return "Adasum is for allreduce only";
  return "";
}

}  // namespace

HandlePtr Engine::Reducescatter(const std::string& name, const TensorView& input, ReduceOp op,
                                double prescale, double postscale, OutputAllocator allocator,
                                int32_t process_set) {
  TensorEntry e = MakeEntry(*impl_, OpType::kReducescatter, name, input, TensorView(), process_set);
  e.request.op = op;
  e.request.prescale = prescale;
  e.request.postscale = postscale;
  e.allocator = std::move(allocator);
  RefuseArguments(*impl_, e, ReducescatterArgsProblem(input, op));
  return impl_->Enqueue(std::move(e));
}

std::vector<HandlePtr> Engine::GroupedReducescatter(const std::vector<std::string>& names,
                                                    const std::vector<TensorView>& inputs,
                                                    ReduceOp op, double prescale,
                                                    double postscale, int32_t process_set) {
  if (names.size() != inputs.size() || names.empty()) {
    std::vector<HandlePtr> hs(std::max<size_t>(names.size(), 1));
    for (auto& h : hs) h = Failed(Status::InvalidArgument("grouped reducescatter: names and inputs differ in length or are empty"));
    return hs;
  }
  std::vector<TensorEntry> entries;
  entries.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    TensorEntry e = MakeEntry(*impl_, OpType::kReducescatter, names[i], inputs[i], TensorView(),
                              process_set);
    e.request.op = op;
    e.request.prescale = prescale;
    e.request.postscale = postscale;
    RefuseArguments(*impl_, e, ReducescatterArgsProblem(inputs[i], op));
    entries.push_back(std::move(e));
  }
  return impl_->EnqueueGroup(std::move(entries));
}

std::vector<HandlePtr> Engine::Refuse(const std::string& op,
                                      const std::vector<std::string>& names,
                                      const std::string& why, int32_t process_set) {
  if (names.empty()) return {};
  // The kind decides how the coordinator treats it while ranks have joined, as the others'.
  OpType type = OpType::kAllreduce;
  for (OpType t : {OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                   OpType::kReducescatter}) {
    if (op == OpTypeName(t)) type = t;
  }
  std::vector<TensorEntry> entries;
  entries.reserve(names.size());
  for (const std::string& name : names) {
    TensorEntry e = MakeEntry(*impl_, type, name, TensorView(), TensorView(), process_set);
    e.request.shape.clear();
    RefuseArguments(e.request, Status::InvalidArgument(op + " '" + name + "' on rank " +
                                                       std::to_string(rank()) + ": " + why));
    entries.push_back(std::move(e));
  }
  return impl_->EnqueueGroup(std::move(entries));
}

HandlePtr Engine::Barrier(int32_t process_set) {
  TensorEntry e = MakeEntry(*impl_, OpType::kBarrier, "", TensorView(), TensorView(), process_set);
  e.request.shape.clear();
  return impl_->Enqueue(std::move(e));
}

HandlePtr Engine::Join(int device) {
  TensorEntry e =
      MakeEntry(*impl_, OpType::kJoin, "", TensorView(), TensorView(), kGlobalProcessSet);
  e.request.shape.clear();
  if (device < kCpuDevice) {
    return Failed(Status::InvalidArgument("join: device " + std::to_string(device) +
                                          " is neither -1 nor a CUDA device ordinal"));
  }
  // Where the zeros go (the entry's input; the request, which every rank compares, stays
  // device-free: each rank names its own device).
  e.input.device = device;
  return impl_->Enqueue(std::move(e));
}

}  // namespace hvd
