// The public Engine API: argument checks and enqueueing. See engine_impl.h for the threads.
#include "engine/engine_impl.h"

#include "bootstrap/store.h"
#include "common/logging.h"
#include "transport/transport_factory.h"

namespace hvd {

namespace {

HandlePtr Failed(Status s) {
  auto h = std::make_shared<Handle>();
  h->refused_ = true;
  h->Complete(std::move(s));
  return h;
}

TensorEntry MakeEntry(OpType type, const std::string& name, const TensorView& in,
                      const TensorView& out) {
  TensorEntry e;
  e.request.type = type;
  e.request.name = name;
  e.request.dtype = in.dtype;
  e.request.device = in.device;
  e.request.shape = in.shape;
  e.input = in;
  e.output = out;
  e.handle = std::make_shared<Handle>();
  return e;
}

}  // namespace

// ---------------------------------------------------------------- EngineImpl: set-up

EngineImpl::EngineImpl(const Options& options) : options_(options) {}

StatusOr<std::unique_ptr<EngineImpl>> EngineImpl::Create(const Options& options) {
  HVD_RETURN_IF_ERROR(options.Validate());
  SetLogLevel(options.log_level);
  SetLogPrefix("rank " + std::to_string(options.rank));
  std::unique_ptr<EngineImpl> impl(new EngineImpl(options));
  HVD_RETURN_IF_ERROR(impl->Connect());
  impl->thread_ = std::thread([p = impl.get()] { p->Loop(); });
  return impl;
}

Status EngineImpl::Connect() {
  cache_ = std::make_unique<ResponseCache>(options_.cache_capacity, options_.rank == 0);
  timeline_ = std::make_unique<Timeline>(options_.timeline_path, options_.rank);
  worker_epochs_.assign(options_.size, 0);
  if (options_.rank == 0) {
    coordinator_ = std::make_unique<Coordinator>(options_.size, options_.fusion_threshold_bytes,
                                                 options_.stall_check_seconds,
                                                 options_.stall_shutdown_seconds);
    const size_t words = (static_cast<size_t>(std::max(0, options_.cache_capacity)) + 63) / 64;
    ready_bits_.assign(options_.size, std::vector<uint64_t>(words, 0));
    bit_since_.assign(static_cast<size_t>(std::max(0, options_.cache_capacity)), Clock::time_point());
  }
  spin_ = SpinWindow(options_);
  // A caller's Wait polls only while this host has a core per rank; oversubscribed, its
  // polling would take the core that the threads it waits for need.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  wait_spin_ = static_cast<unsigned>(std::max(1, options_.local_size)) <= cores
                   ? spin_
                   : std::chrono::microseconds(0);
  auto on_msg = [this](int peer, uint8_t type, std::vector<uint8_t>&& p) {
    OnControlMessage(peer, type, std::move(p));
  };
  auto on_err = [this](int peer, const std::string& what) { OnControlError(peer, what); };
  Deadline deadline = DeadlineAfterSeconds(options_.start_timeout_seconds);
  auto job = ConnectJob(io_, options_, deadline, on_msg, on_err);  // transport/transport_factory.h
  if (!job.ok()) return job.status().WithContext("rank " + std::to_string(options_.rank));
  backends_ = std::move(job->backends);
  transport_ = std::move(job->transport);
  control_ = std::move(job->control);
  poller_ = std::move(job->poller);
  control_over_tcp_ = job->control_over_tcp;
  plan_.size = options_.size;
  plan_.offload = transport_->offload() != nullptr;
  plan_.hierarchical_allreduce = options_.hierarchical_allreduce;
  plan_.hierarchical_allgather = options_.hierarchical_allgather;
  if (options_.size == 1) return Status::OK();
  HVD_RETURN_IF_ERROR(SetUpViews(job->topology, job->layout_note)
                          .WithContext("rank " + std::to_string(options_.rank)));
  StartHeartbeat();
  return Status::OK();
}

// The local and cross views, when the ranks' places describe hosts of equal size with more than
// one rank each (transport/group_view.h).
Status EngineImpl::SetUpViews(const Topology& topo, const std::string& why) {
  if (!topo.Homogeneous()) {
    const bool asked = options_.hierarchical_allreduce == Options::Toggle::kOn ||
                       options_.hierarchical_allgather == Options::Toggle::kOn;
    if (asked && options_.rank == 0) {
      HVD_LOG(kWarning) << "HVD_HIERARCHICAL_ALLREDUCE or _ALLGATHER is on, but this job's "
                           "layout does not allow it, so they run flat: "
                        << (why.empty() ? "it needs more than one host with the same number of "
                                          "ranks, more than one, on each"
                                        : why);
    }
    return Status::OK();
  }
  auto local = GroupView::Create(*transport_, topo.LocalMembers(options_.rank));
  if (!local.ok()) return local.status();
  auto cross = GroupView::Create(*transport_, topo.CrossMembers(options_.rank));
  if (!cross.ok()) return cross.status();
  local_view_ = std::move(*local);
  cross_view_ = std::move(*cross);
  plan_.hierarchical = true;
  plan_.local_size = local_view_->size();
  plan_.cross_size = cross_view_->size();
  hosts_.clear();
  for (int first : cross_view_->members()) hosts_.push_back(topo.LocalMembers(first));
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int r : v) s += (s.empty() ? "" : " ") + std::to_string(r);
    return "[" + s + "]";
  };
  HVD_LOG(kInfo) << "hierarchical collectives ready: this host's ranks "
                 << list(local_view_->members()) << ", across hosts "
                 << list(cross_view_->members());
  return Status::OK();
}

EngineImpl::~EngineImpl() { Shutdown(); }

// The caller raises queued_ after queueing, then posts a wake-up only if the background thread
// is asleep (or about to be): it raises sleeping_ before its last look at queued_, so with both
// sequentially consistent either it sees the queue or this sees it sleeping. While it polls
// after work it looks at queued_ itself, without a syscall on either side.
void EngineImpl::Wake() {
  queued_.store(true);
  if (sleeping_.load() && !wake_posted_.exchange(true)) asio::post(io_, [] {});
}

Status EngineImpl::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    shutdown_requested_ = true;
  }
  Wake();
  std::lock_guard<std::mutex> l(join_mu_);  // several threads may call Shutdown at once
  if (thread_.joinable()) thread_.join();
  return Status::OK();
}

// ---------------------------------------------------------------- EngineImpl: enqueue

Status EngineImpl::ValidateLocked(const TensorEntry& e) const {
  const Request& r = e.request;
  const std::string what = std::string(OpTypeName(r.type)) + " '" + r.name + "' on rank " +
                           std::to_string(options_.rank);
  if (r.type != OpType::kBarrier && r.type != OpType::kJoin) {
    if (r.name.empty()) return Status::InvalidArgument(what + ": the name is empty");
    if (e.input.device != kCpuDevice) {
      if (e.input.device < 0) {
        return Status::InvalidArgument(what + ": device " + std::to_string(e.input.device) +
                                       " is neither the CPU (-1) nor a CUDA device ordinal");
      }
      if (GetDeviceRuntime() == nullptr) {
        return Status::FailedPrecondition(what + ": device " + std::to_string(e.input.device) +
                                          " tensors need a build with CUDA; this build has CPU only");
      }
    }
    if (e.output.data != nullptr && e.output.device != e.input.device) {
      return Status::InvalidArgument(what + ": the output is on device " +
                                     std::to_string(e.output.device) + ", the input on " +
                                     std::to_string(e.input.device) + "; they must be on the same");
    }
    if (e.input.data == nullptr && e.input.num_bytes() > 0) {
      return Status::InvalidArgument(what + ": input data is null");
    }
    for (int64_t d : e.input.shape) {
      if (d < 0) return Status::InvalidArgument(what + ": negative dimension in " + e.input.ShapeString());
    }
  }
  if (in_flight_.count(r.name)) {
    return Status::InvalidArgument(what + ": a tensor with this name is already in flight on this "
                                   "rank; wait for it before reusing the name");
  }
  return Status::OK();
}

HandlePtr EngineImpl::Enqueue(TensorEntry entry) {
  std::vector<TensorEntry> one;
  one.push_back(std::move(entry));
  return EnqueueGroup(std::move(one))[0];
}

std::vector<HandlePtr> EngineImpl::EnqueueGroup(std::vector<TensorEntry> entries) {
  std::vector<HandlePtr> handles;
  for (auto& e : entries) handles.push_back(e.handle);
  {
    std::lock_guard<std::mutex> l(mu_);
    Status s = dead_;
    if (s.ok() && shutdown_requested_) s = Status::Aborted("hvd has been shut down");
    std::unordered_set<std::string> names;
    for (auto& e : entries) {
      if (e.request.type == OpType::kBarrier) e.request.name = "barrier." + std::to_string(barrier_count_++);
      if (e.request.type == OpType::kJoin) e.request.name = "join";
      if (!s.ok()) break;
      s = ValidateLocked(e);
      if (s.ok() && e.input.device != kCpuDevice) s = RecordReady(e);
      if (s.ok() && !names.insert(e.request.name).second) {
        s = Status::InvalidArgument("group has the name '" + e.request.name + "' twice");
      }
    }
    if (!s.ok()) {
      for (auto& e : entries) {
        e.handle->refused_ = true;
        e.handle->Complete(s);
      }
      return handles;
    }
    if (entries.size() > 1) {
      for (auto& e : entries) {
        e.request.group = entries[0].request.name + "#group";
        e.request.group_size = static_cast<int32_t>(entries.size());
      }
    }
    for (auto& e : entries) {
      in_flight_.insert(e.request.name);
      e.handle->spin_ = wait_spin_;
      queue_.push_back(std::move(e));
    }
  }
  Wake();
  return handles;
}

// ---------------------------------------------------------------- Engine (public API)

Engine::Engine(std::unique_ptr<EngineImpl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Create(const Options& options) {
  auto impl = EngineImpl::Create(options);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<Engine>(new Engine(std::move(*impl)));
}

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
const Options& Engine::options() const { return impl_->options(); }

namespace {

Status CheckAllreduceArgs(const std::string& name, const TensorView& in, const TensorView& out,
                          ReduceOp op) {
  if (in.dtype != out.dtype || in.num_elements() != out.num_elements()) {
    return Status::InvalidArgument("allreduce '" + name + "': output " + DataTypeName(out.dtype) +
                                   out.ShapeString() + " does not match input " +
                                   DataTypeName(in.dtype) + in.ShapeString());
  }
  if (in.dtype == DataType::kBool && op == ReduceOp::kAverage) {
    return Status::InvalidArgument("allreduce '" + name + "': average is not defined for bool");
  }
  return Status::OK();
}

}  // namespace

HandlePtr Engine::Allreduce(const std::string& name, const TensorView& input,
                            const TensorView& output, ReduceOp op, double prescale,
                            double postscale) {
  return GroupedAllreduce({name}, {input}, {output}, op, prescale, postscale)[0];
}

std::vector<HandlePtr> Engine::GroupedAllreduce(const std::vector<std::string>& names,
                                                const std::vector<TensorView>& inputs,
                                                const std::vector<TensorView>& outputs,
                                                ReduceOp op, double prescale, double postscale) {
  if (names.size() != inputs.size() || names.size() != outputs.size() || names.empty()) {
    std::vector<HandlePtr> hs(std::max<size_t>(names.size(), 1));
    for (auto& h : hs) h = Failed(Status::InvalidArgument("grouped allreduce: names, inputs and outputs differ in length or are empty"));
    return hs;
  }
  std::vector<TensorEntry> entries;
  for (size_t i = 0; i < names.size(); ++i) {
    Status s = CheckAllreduceArgs(names[i], inputs[i], outputs[i], op);
    if (!s.ok()) {
      std::vector<HandlePtr> hs(names.size());
      for (auto& h : hs) h = Failed(s);
      return hs;
    }
    TensorEntry e = MakeEntry(OpType::kAllreduce, names[i], inputs[i], outputs[i]);
    e.request.op = op;
    e.request.prescale = prescale;
    e.request.postscale = postscale;
    entries.push_back(std::move(e));
  }
  return impl_->EnqueueGroup(std::move(entries));
}

HandlePtr Engine::Allgather(const std::string& name, const TensorView& input,
                            OutputAllocator allocator) {
  TensorEntry e = MakeEntry(OpType::kAllgather, name, input, TensorView());
  if (e.request.shape.empty()) e.request.shape = {1};
  e.allocator = std::move(allocator);
  return impl_->Enqueue(std::move(e));
}

std::vector<HandlePtr> Engine::GroupedAllgather(const std::vector<std::string>& names,
                                                const std::vector<TensorView>& inputs) {
  std::vector<TensorEntry> entries;
  for (size_t i = 0; i < names.size() && i < inputs.size(); ++i) {
    TensorEntry e = MakeEntry(OpType::kAllgather, names[i], inputs[i], TensorView());
    if (e.request.shape.empty()) e.request.shape = {1};
    entries.push_back(std::move(e));
  }
  if (entries.empty() || names.size() != inputs.size()) {
    return {Failed(Status::InvalidArgument("grouped allgather: names and inputs differ in length or are empty"))};
  }
  return impl_->EnqueueGroup(std::move(entries));
}

HandlePtr Engine::Broadcast(const std::string& name, const TensorView& input,
                            const TensorView& output, int root) {
  if (root < 0 || root >= size()) {
    return Failed(Status::InvalidArgument("broadcast '" + name + "': root rank " +
                                          std::to_string(root) + " is outside [0, " +
                                          std::to_string(size()) + ")"));
  }
  if (input.dtype != output.dtype || input.num_elements() != output.num_elements()) {
    return Failed(Status::InvalidArgument("broadcast '" + name + "': output " +
                                          output.ShapeString() + " does not match input " +
                                          input.ShapeString()));
  }
  TensorEntry e = MakeEntry(OpType::kBroadcast, name, input, output);
  e.request.root = root;
  return impl_->Enqueue(std::move(e));
}

HandlePtr Engine::Alltoall(const std::string& name, const TensorView& input,
                           const std::vector<int64_t>& splits, OutputAllocator allocator) {
  TensorEntry e = MakeEntry(OpType::kAlltoall, name, input, TensorView());
  if (e.request.shape.empty()) {
    return Failed(Status::InvalidArgument("alltoall '" + name + "': input must have at least one dimension"));
  }
  int64_t rows = e.request.shape[0];
  if (splits.empty()) {
    if (rows % size() != 0) {
      return Failed(Status::InvalidArgument(
          "alltoall '" + name + "': first dimension " + std::to_string(rows) +
          " is not divisible by the world size " + std::to_string(size()) + "; pass splits"));
    }
  } else {
    int64_t sum = 0;
    bool neg = false;
    for (int64_t s : splits) {
      sum += s;
      neg |= s < 0;
    }
    if (static_cast<int>(splits.size()) != size() || neg || sum != rows) {
      return Failed(Status::InvalidArgument(
          "alltoall '" + name + "': splits must be " + std::to_string(size()) +
          " non-negative row counts summing to the first dimension " + std::to_string(rows) +
          "; got " + ShapeToString(splits)));
    }
    e.request.splits = splits;
  }
  e.allocator = std::move(allocator);
  return impl_->Enqueue(std::move(e));
}

namespace {

Status CheckReducescatterArgs(const std::string& name, const TensorView& input, ReduceOp op) {
  if (input.shape.empty()) {
    return Status::InvalidArgument("reducescatter '" + name + "': input must have at least one dimension");
  }
  if (input.dtype == DataType::kBool && op == ReduceOp::kAverage) {
    return Status::InvalidArgument("reducescatter '" + name + "': average is not defined for bool");
  }
  return Status::OK();
}

}  // namespace

HandlePtr Engine::Reducescatter(const std::string& name, const TensorView& input, ReduceOp op,
                                double prescale, double postscale, OutputAllocator allocator) {
  Status s = CheckReducescatterArgs(name, input, op);
  if (!s.ok()) return Failed(s);
  TensorEntry e = MakeEntry(OpType::kReducescatter, name, input, TensorView());
  e.request.op = op;
  e.request.prescale = prescale;
  e.request.postscale = postscale;
  e.allocator = std::move(allocator);
  return impl_->Enqueue(std::move(e));
}

std::vector<HandlePtr> Engine::GroupedReducescatter(const std::vector<std::string>& names,
                                                    const std::vector<TensorView>& inputs,
                                                    ReduceOp op, double prescale,
                                                    double postscale) {
  if (names.size() != inputs.size() || names.empty()) {
    std::vector<HandlePtr> hs(std::max<size_t>(names.size(), 1));
    for (auto& h : hs) h = Failed(Status::InvalidArgument("grouped reducescatter: names and inputs differ in length or are empty"));
    return hs;
  }
  std::vector<TensorEntry> entries;
  for (size_t i = 0; i < names.size(); ++i) {
    Status s = CheckReducescatterArgs(names[i], inputs[i], op);
    if (!s.ok()) {
      std::vector<HandlePtr> hs(names.size());
      for (auto& h : hs) h = Failed(s);
      return hs;
    }
    TensorEntry e = MakeEntry(OpType::kReducescatter, names[i], inputs[i], TensorView());
    e.request.op = op;
    e.request.prescale = prescale;
    e.request.postscale = postscale;
    entries.push_back(std::move(e));
  }
  return impl_->EnqueueGroup(std::move(entries));
}

HandlePtr Engine::Barrier() {
  TensorEntry e = MakeEntry(OpType::kBarrier, "", TensorView(), TensorView());
  e.request.shape.clear();
  return impl_->Enqueue(std::move(e));
}

HandlePtr Engine::Join() {
  TensorEntry e = MakeEntry(OpType::kJoin, "", TensorView(), TensorView());
  e.request.shape.clear();
  return impl_->Enqueue(std::move(e));
}

}  // namespace hvd
