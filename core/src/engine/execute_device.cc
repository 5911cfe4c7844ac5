// Executing a response on device tensors (Response::device is not the CPU).
//
// 1. The rank's device (its tensors') is opened at its first device response: one device per
//    rank; a rank that has joined takes part on the device it used before. The
//    engine's stream waits for each tensor's ready event, recorded on the caller's stream when
//    the operation was submitted: nothing blocks the caller or this thread for it.
// 2. At that first response the ranks agree on the path, once, with an allgather of
//    (device UUID, device opened, may use device collectives):
//      collectives  NCCL, when every rank has it and HVD_GPU_OPERATIONS is nccl everywhere, and
//                   no two ranks share a physical device (NCCL refuses duplicate GPUs);
//      staging      otherwise: through pinned host memory and the host path (shm, TCP, MPI,
//                   hierarchical: whatever the host tensors would take).
//    A reduction NCCL cannot do (16-bit integers) is staged on the collectives path too.
// 3. Collectives path. Allreduce of one tensor runs on it in place (or out of place); several
//    are packed into the device fusion buffer by one batched copy kernel at 16-byte aligned
//    offsets, scaled by kernels, reduced, scaled and unpacked by one more batched copy. With
//    HVD_HIERARCHICAL_ALLREDUCE on and hosts that allow it, the reduction is hierarchical: the
//    collectives among a host's members, the host path across hosts through pinned memory.
// 4. Staging path. Inputs go to pinned host memory (several tensors are packed on the device
//    first and cross in one copy), the host path runs the response on host stand-ins of the
//    entries, and the results come back the same way. An allreduce (but Adasum, whose dot
//    products span whole tensors) runs in pieces (PlanStagingPieces): while the host reduces
//    one, the device copies the next to the host and the one before back. Its scaling runs
//    on the device, as on the collectives path.
// 5. The response completes when the stream has drained (with HVD_ENABLE_ASYNC_COMPLETION, on
//    the collectives path, once its work is queued: each handle gets an event recorded after
//    it, for the caller's stream to wait on). The wait polls the control plane, so
//    heartbeats and an abort relayed by the coordinator are seen; a lost peer or a failed
//    communicator aborts NCCL, and the deadline (HVD_TIMEOUT_SECONDS) bounds it all.
#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "common/logging.h"
#include "engine/engine_impl.h"
#include "planner/fusion.h"

namespace hvd {

namespace {

bool IsReduction(OpType t) { return t == OpType::kAllreduce || t == OpType::kReducescatter; }

// Whether the communicator's collectives run `r` (NCCL has no 16-bit integers: those are staged).
bool OnDeviceCollectives(const Comm& c, const Response& r) {
  return c.device_path == Comm::DevicePath::kCollectives &&
         (!IsReduction(r.type) || c.device_collectives->Reduces(r.dtype, r.op));
}

// What each rank tells the others at its first device response.
struct DeviceRecord {
  char uuid[40];
  uint8_t opened;       // its device is open
  uint8_t collectives;  // it may use device collectives (NCCL built, HVD_GPU_OPERATIONS=nccl)
  uint8_t joined_without_device;  // not opened: it joined before it used one, naming none
  uint8_t pad[5];
};

}  // namespace

Status EngineImpl::RecordReady(TensorEntry& e) {
  DeviceRuntime* rt = GetDeviceRuntime();
  void* ev = nullptr;
  HVD_RETURN_IF_ERROR(rt->RecordEvent(e.input.device, e.input.stream, &ev));
  e.ready_event = std::shared_ptr<void>(ev, [rt](void* p) { rt->ReleaseEvent(p); });
  return Status::OK();
}

// The communicators' asynchronous errors (a peer's failure the library saw).
Status EngineImpl::CheckDeviceCollectives() {
  for (auto* d : {comm_->device_collectives.get(), comm_->local_device_collectives.get()}) {
    if (d == nullptr) continue;
    Status s = d->Check();
    if (!s.ok()) return s;
  }
  return Status::OK();
}

void EngineImpl::AbortDeviceCollectives() {
  for (auto* d : {comm_->device_collectives.get(), comm_->local_device_collectives.get()}) {
    if (d) d->Abort();
  }
}

Status EngineImpl::PollDuringDeviceWait() {
  Status s = PollControlPlane();
  if (s.ok()) s = CheckDeviceCollectives();
  if (!s.ok()) AbortDeviceCollectives();
  return s;
}

// A batched copy: once more after a synchronize when the device's copy table is still in use
// (Device::BatchedCopy never waits itself: DeviceSynchronize polls and keeps the deadline).
Status EngineImpl::DeviceCopy(const std::vector<CopySpan>& spans) {
  Status s = device_->BatchedCopy(spans);
  if (s.code() != StatusCode::kResourceExhausted || s.message() != kCopyTableFull) return s;
  HVD_RETURN_IF_ERROR(DeviceSynchronize());
  return device_->BatchedCopy(spans);
}

// A device buffer that must grow frees its memory first, and a CUDA free waits for the whole
// device with no deadline: the stream is synchronized before, polling the control plane. The
// free still waits for the framework's own streams, and pinning a large host buffer takes
// seconds a GiB: both run through the control keeper.
Status EngineImpl::GetDeviceBuffer(DeviceBuffer& b, Device* d, size_t bytes, void** out) {
  if (b.MustFree(d, bytes)) HVD_RETURN_IF_ERROR(DeviceSynchronize());
  if (!b.MustAllocate(d, bytes)) return b.Get(d, bytes, out);
  return keeper_.Call([&] { return b.Get(d, bytes, out); });
}

Status EngineImpl::DeviceSynchronize() {
  Status s = device_->Synchronize(CollectiveDeadline(), [this] { return PollDuringDeviceWait(); });
  if (!s.ok()) AbortDeviceCollectives();
  return s;
}

// The end of a collective on the device path: wait for the stream, or (async completion) give
// each handle an event recorded after the work and let the caller's stream wait for it.
Status EngineImpl::DeviceDone(const std::vector<TensorEntry*>& entries) {
  if (!options_.async_completion) return DeviceSynchronize();
  DeviceRuntime* rt = GetDeviceRuntime();
  for (auto* e : entries) {
    if (!e) continue;
    void* ev = nullptr;
    HVD_RETURN_IF_ERROR(rt->RecordOnDevice(*device_, &ev));
    e->handle->mutable_results().cuda_event =
        std::shared_ptr<void>(ev, [rt](void* p) { rt->ReleaseEvent(p); });
  }
  return Status::OK();
}

Status EngineImpl::OpenDevice(const std::vector<TensorEntry*>& entries) {
  int ordinal = -1;
  for (auto* e : entries) {
    if (!e) continue;
    if (ordinal >= 0 && e->input.device != ordinal) {
      return Status::FailedPrecondition(
          "rank " + std::to_string(options_.rank) + " has tensors on cuda:" +
          std::to_string(ordinal) + " and cuda:" + std::to_string(e->input.device) +
          " in one operation; hvd runs one CUDA device per rank");
    }
    ordinal = e->input.device;
  }
  if (ordinal < 0) {  // this rank has joined: it takes part on the device it used
    if (device_) return Status::OK();
    if (join_device_ < 0) {
      return Status::FailedPrecondition(
          "rank " + std::to_string(options_.rank) +
          " joined before it used a CUDA device, so it cannot take part in device collectives "
          "(join(device) names the device, as in Horovod)");
    }
    ordinal = join_device_;  // Join(device): the device named there
  }
  if (device_) {
    if (device_->ordinal() == ordinal) return Status::OK();
    return Status::FailedPrecondition(
        "rank " + std::to_string(options_.rank) + " uses " + device_->Describe() +
        " and now cuda:" + std::to_string(ordinal) +
        "; hvd runs one CUDA device per rank (torch.cuda.set_device(hvd.local_rank()))");
  }
  DeviceRuntime* rt = GetDeviceRuntime();
  if (rt == nullptr) return Status::FailedPrecondition("this build has no CUDA");
  auto dev = rt->Open(ordinal);
  if (!dev.ok()) return dev.status();
  device_ = std::shared_ptr<Device>(std::move(*dev));
  return Status::OK();
}

Status EngineImpl::ChooseDevicePath(Comm& c, const Status& opened) {
  const int n = c.size;
  DeviceRecord mine{};
  if (device_) std::snprintf(mine.uuid, sizeof(mine.uuid), "%s", device_->Uuid().c_str());
  mine.opened = opened.ok() ? 1 : 0;
  mine.joined_without_device = !opened.ok() && !device_ && joined_ && join_device_ < 0;
  mine.collectives = DeviceCollectivesBuilt() &&
                     options_.gpu_operations == Options::GpuOperations::kNccl;
  std::vector<DeviceRecord> all(n);
  if (n > 1) {
    HVD_RETURN_IF_ERROR(Allgatherv(*c.t, &mine, all.data(),
                                   std::vector<size_t>(n, sizeof(DeviceRecord)),
                                   CollectiveDeadline()));
  } else {
    all[0] = mine;
  }
  auto world = [&c](int i) { return std::to_string(c.WorldRank(i)); };
  std::vector<int> failed;
  std::string joined;  // a rank that joined before it used a device, naming none
  for (int i = 0; i < n; ++i) {
    if (!all[i].opened) failed.push_back(c.WorldRank(i));
    if (!all[i].opened && all[i].joined_without_device && joined.empty()) joined = world(i);
  }
  if (!failed.empty()) {
    std::string why;
    if (!opened.ok()) {
      why = " (here: " + opened.message() + ")";
    } else if (!joined.empty()) {
      why = " (rank " + joined + " joined before it used a CUDA device: join(device) names the "
            "device for its zeros, as in Horovod)";
    }
    return Status::FailedPrecondition("ranks " + RankList(failed) +
                                      " could not open their CUDA device" + why);
  }
  std::string why;
  for (int i = 0; i < n && why.empty(); ++i) {
    if (!all[i].collectives) {
      why = "rank " + world(i) + " has no NCCL or set HVD_GPU_OPERATIONS=cpu";
    }
    for (int j = 0; j < i && why.empty(); ++j) {
      if (std::strncmp(all[i].uuid, all[j].uuid, sizeof(all[i].uuid)) == 0) {
        why = "ranks " + world(j) + " and " + world(i) + " share one GPU, which NCCL refuses";
      }
    }
  }
  if (why.empty()) {
    auto comm = CreateDeviceCollectives(*c.t, *device_, CollectiveDeadline(),
                                        [this] { return PollDuringDeviceWait(); });
    if (!comm.ok()) {
      abandon_ = n > 1;  // the others may be inside NCCL's set-up
      return comm.status().WithContext("setting up NCCL");
    }
    c.device_collectives = std::move(*comm);
    c.device_path = Comm::DevicePath::kCollectives;
    HVD_LOG(kInfo) << "device tensors on " << device_->Describe() << " go through "
                   << c.device_collectives->name();
  } else {
    c.device_path = Comm::DevicePath::kStaging;
    HVD_LOG(kInfo) << "device tensors on " << device_->Describe()
                   << " are staged through host memory: " << why;
  }
  return Status::OK();
}

bool EngineImpl::CallerMayExecute(const Response& r) {
  // Adding or removing a set makes or destroys its communicators (NCCL's teardown waits).
  if (r.type == OpType::kProcessSet) return false;
  if (r.device == kCpuDevice) return true;
  if (!device_) return false;  // opened at this rank's first device response
  const ProcessSetState* ps = FindSet(r.process_set);
  if (ps == nullptr || !ps->comm) return true;  // (Execute reports it)
  const Comm& c = *ps->comm;
  if (c.device_path == Comm::DevicePath::kUnknown) return false;  // agreed at the set's first
  const bool collectives = c.device_path == Comm::DevicePath::kCollectives;
  // Hierarchical allreduce and Adasum: a host part across hosts, and the host's communicator,
  // made at the first of them that needs it.
  const bool across_hosts =
      collectives && r.type == OpType::kAllreduce &&
      (r.op == ReduceOp::kAdasum || PlanHierarchicalDeviceAllreduce(WithKnobs(c.plan, r.knobs)));
  if (across_hosts && !c.local_device_collectives) return false;
  // Where the host reduces every byte (staged, 16-bit integers staged beside NCCL, the host
  // part across hosts), a caller runs only small responses, as with host tensors; the device
  // collectives alone are a launch at any size.
  const bool launch_only = !across_hosts && OnDeviceCollectives(c, r);
  return launch_only || ResponseBytes(r) <= kSmallWaitBytes;
}

Status EngineImpl::ExecuteOnDevice(const Response& r, std::vector<TensorEntry*>& entries) {
  Status opened = OpenDevice(entries);
  if (comm_->device_path == Comm::DevicePath::kUnknown) {
    HVD_RETURN_IF_ERROR(ChooseDevicePath(*comm_, opened));
  } else if (!opened.ok()) {
    abandon_ = comm_->size > 1;  // the others are already running it
    return opened;
  }
  // A caller's thread has the device current for the response, and its own back after it.
  std::shared_ptr<void> current;
  if (device_) {
    if (Status s = device_->MakeCurrent(&current); !s.ok()) {
      abandon_ = comm_->size > 1;
      return s;
    }
  }
  for (auto* e : entries) {
    if (e && e->ready_event) {
      Status s = device_->WaitEvent(e->ready_event.get());
      if (!s.ok()) {
        abandon_ = comm_->size > 1;
        return s;
      }
      e->ready_event.reset();
    }
  }
  // Work queued before (async completion) may have failed since.
  if (Status queued = CheckDeviceCollectives(); !queued.ok()) return queued;
  const bool collectives = OnDeviceCollectives(*comm_, r);
  bool host_failed = false;  // the host path's failures already say whether to abandon
  Status s;
  if (comm_->device_path == Comm::DevicePath::kCollectives && r.type == OpType::kAllreduce &&
      r.op == ReduceOp::kAdasum && comm_->device_collectives->Reduces(r.dtype, ReduceOp::kSum)) {
    s = DeviceAdasum(r, entries, &host_failed);
  } else if (collectives) {
    s = RunDeviceCollective(r, entries);
  } else if (r.type == OpType::kAllreduce && r.op != ReduceOp::kAdasum) {
    s = RunStagedAllreduce(r, entries, &host_failed);
  } else {
    s = RunStaged(r, entries, &host_failed);
  }
  // A device call that failed here alone (an allocation, a copy, a launch) leaves the others
  // inside the collective.
  if (!s.ok() && !host_failed && s.code() != StatusCode::kPeerLost &&
      s.code() != StatusCode::kTimeout) {
    abandon_ = abandon_ || comm_->size > 1;
  }
  return s;
}

Status EngineImpl::RunDeviceCollective(const Response& r, std::vector<TensorEntry*>& entries) {
  switch (r.type) {
    case OpType::kAllreduce: return DeviceAllreduce(r, entries);
    case OpType::kAllgather: return DeviceAllgather(r, entries[0]);
    case OpType::kBroadcast: return DeviceBroadcast(r, entries[0]);
    case OpType::kAlltoall:
      return entries[0] ? DeviceAlltoall(r, entries[0])
                        : Status::Internal("alltoall '" + r.names[0] + "' without a local tensor");
    case OpType::kReducescatter:
      return entries[0] ? DeviceReducescatter(r, entries[0])
                        : Status::Internal("reducescatter '" + r.names[0] + "' without a local tensor");
    default:
      return Status::Internal(std::string("no device path for ") + OpTypeName(r.type));
  }
}

Status EngineImpl::AllocateDeviceOutput(TensorEntry* e, const std::vector<int64_t>& shape,
                                        size_t bytes, void** out) {
  e->handle->mutable_results().output_shape = shape;
  if (e->allocator) {
    void* p = nullptr;
    try {
      p = keeper_.Call([&] { return e->allocator(shape); });
    } catch (...) {
      return Status::ResourceExhausted("the output allocator failed: " +
                                       ExceptionMessage(std::current_exception()));
    }
    if (p == nullptr && bytes > 0) return Status::ResourceExhausted("the output allocator returned null");
    e->handle->output_data_ = p;
    *out = p;
    return Status::OK();
  }
  void* p = nullptr;
  HVD_RETURN_IF_ERROR(keeper_.Call([&] { return device_->Allocate(bytes == 0 ? 1 : bytes, &p); }));
  std::shared_ptr<Device> dev = device_;
  e->handle->mutable_results().output_owner =
      std::shared_ptr<void>(p, [dev](void* q) { dev->Free(q); });
  e->handle->output_data_ = p;
  *out = p;
  return Status::OK();
}

// Packs the entries' inputs into the device buffer `buf` at `offsets` (one batched copy; a
// joined rank's missing entry stands in with zeros) and gives the spans that copy the results
// back out.
Status EngineImpl::PackOnDevice(const std::vector<TensorEntry*>& entries,
                                const std::vector<size_t>& bytes,
                                const std::vector<size_t>& offsets, uint8_t* buf,
                                std::vector<CopySpan>* out) {
  std::vector<CopySpan> in;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (bytes[i] == 0) continue;
    if (entries[i]) {
      in.push_back({entries[i]->input.data, buf + offsets[i], bytes[i]});
      out->push_back({buf + offsets[i], entries[i]->output.data, bytes[i]});
    } else {
      HVD_RETURN_IF_ERROR(device_->Zero(buf + offsets[i], bytes[i]));
    }
  }
  return DeviceCopy(in);
}

Status EngineImpl::DeviceAllreduce(const Response& r, std::vector<TensorEntry*>& entries) {
  Device& d = *device_;
  DeviceCollectives& c = *comm_->device_collectives;
  const size_t esize = DataTypeSize(r.dtype);
  const ReduceOp op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
  const double post = FinalScale(r, comm_->size);
  const PlanContext pc = WithKnobs(comm_->plan, r.knobs);  // rank 0's, the same on every member
  const bool hierarchical = PlanHierarchicalDeviceAllreduce(pc);
  auto reduce = [&](const void* in, void* out, size_t count) -> Status {
    if (!hierarchical) return c.Allreduce(in, out, count, r.dtype, op);
    if (in != out) HVD_RETURN_IF_ERROR(d.Copy(out, in, count * esize));
    return DeviceHierarchicalAllreduce(out, count, r.dtype, op, pc);
  };
  if (entries.size() == 1 && entries[0] != nullptr) {
    TensorEntry* e = entries[0];
    const size_t count = static_cast<size_t>(NumElements(r.shapes[0]));
    const void* in = e->input.data;
    void* out = e->output.data;
    if (r.prescale != 1.0) {
      if (in != out) HVD_RETURN_IF_ERROR(d.Copy(out, in, count * esize));
      HVD_RETURN_IF_ERROR(d.Scale(out, count, r.dtype, r.prescale));
      in = out;
    }
    HVD_RETURN_IF_ERROR(reduce(in, out, count));
    HVD_RETURN_IF_ERROR(d.Scale(out, count, r.dtype, post));
    return DeviceDone(entries);
  }
  std::vector<size_t> bytes, offsets;
  for (const auto& shape : r.shapes) bytes.push_back(static_cast<size_t>(NumElements(shape)) * esize);
  const size_t total = AlignedOffsets(bytes, &offsets);
  void* fusion = nullptr;
  HVD_RETURN_IF_ERROR(GetDeviceBuffer(device_fusion_, &d, total, &fusion));
  auto* buf = static_cast<uint8_t*>(fusion);
  std::vector<CopySpan> out;
  HVD_RETURN_IF_ERROR(PackOnDevice(entries, bytes, offsets, buf, &out));
  const size_t count = total / esize;
  HVD_RETURN_IF_ERROR(d.Scale(buf, count, r.dtype, r.prescale));
  HVD_RETURN_IF_ERROR(reduce(buf, buf, count));
  HVD_RETURN_IF_ERROR(d.Scale(buf, count, r.dtype, post));
  HVD_RETURN_IF_ERROR(DeviceCopy(out));
  return DeviceDone(entries);
}

// The communicator of this host's members (over comm_->local), set up at the first
// operation that needs it: every member runs the same responses, so each host's members meet.
Status EngineImpl::SetUpLocalDeviceCollectives(const char* what) {
  Comm& c = *comm_;
  if (c.local_device_collectives) return Status::OK();
  auto local = CreateDeviceCollectives(*c.local, *device_, CollectiveDeadline(),
                                       [this] { return PollDuringDeviceWait(); });
  if (!local.ok()) {
    abandon_ = c.size > 1;  // the other hosts go on to the part across hosts
    return local.status().WithContext("setting up device collectives inside the host");
  }
  c.local_device_collectives = std::move(*local);
  HVD_LOG(kInfo) << what << ": " << c.local_device_collectives->name() << " among this host's "
                 << c.local->size() << " ranks, the host path across " << c.cross->size()
                 << " hosts";
  return Status::OK();
}

// Adasum of device tensors on the collectives path, as Horovod computes it where NCCL runs it:
// the tensors summed among each host's members on the device, the hosts' sums combined by
// Adasum across hosts (each tensor with its own dot products; the host path, over `cross`,
// through pinned memory), and the result divided by the members per host. So on one host it
// is the members' average. Where every host has one member, or the hosts' sizes differ (a
// process set's members, or a launcher's layout that is not homogeneous), it is the flat
// Adasum over every member (staged), as on the staging path. Hosts of equal size whose number
// is not a power of two are refused, as Horovod refuses them.
Status EngineImpl::DeviceAdasum(const Response& r, std::vector<TensorEntry*>& entries,
                                bool* host_failed) {
  Comm& c = *comm_;
  std::map<int, int> members;  // host -> members of this communicator on it
  for (int i = 0; i < c.size; ++i) {
    const int w = c.WorldRank(i);
    ++members[topology_.size() == options_.size ? topology_.host_of[w] : w];
  }
  const int hosts = static_cast<int>(members.size());
  int per_host = members.begin()->second;
  for (const auto& m : members) {
    if (m.second != per_host) per_host = 0;
  }
  if (per_host <= 1 || (hosts > 1 && !(c.local && c.cross))) {
    return RunStaged(r, entries, host_failed);
  }
  if (hosts == 1) {
    Response average = r;
    average.op = ReduceOp::kSum;
    average.postscale = r.postscale / c.size;
    return DeviceAllreduce(average, entries);
  }
  if ((hosts & (hosts - 1)) != 0) {
    *host_failed = true;  // every member finds the same, before anything moves
    return Status::InvalidArgument(
        "allreduce '" + r.names[0] + "': Adasum of device tensors sums each host's members "
        "and combines the hosts by Adasum, which needs a number of hosts that is a power of "
        "two; this job has " + std::to_string(hosts) + " hosts of " + std::to_string(per_host) +
        " ranks (HVD_GPU_OPERATIONS=cpu stages them for a flat Adasum over the ranks instead)");
  }
  Device& d = *device_;
  const size_t es = DataTypeSize(r.dtype);
  std::vector<size_t> counts, bytes, offsets;
  size_t total = 0;
  for (const auto& shape : r.shapes) {
    counts.push_back(static_cast<size_t>(NumElements(shape)));
    bytes.push_back(counts.back() * es);
    total += counts.back();
  }
  const size_t packed = AlignedOffsets(bytes, &offsets);
  MemoryNeeds need;
  need.scratch = AdasumScratchBytes(total, r.dtype);
  if (Status agreed = Reserve(need, 0, nullptr); !agreed.ok()) {
    *host_failed = true;  // the members agreed on it
    return agreed;
  }
  HVD_RETURN_IF_ERROR(SetUpLocalDeviceCollectives("device Adasum"));
  void* fusion = nullptr;
  void* staged = nullptr;
  HVD_RETURN_IF_ERROR(GetDeviceBuffer(device_fusion_, &d, std::max<size_t>(packed, 1), &fusion));
  HVD_RETURN_IF_ERROR(GetDeviceBuffer(host_staging_, &d, std::max<size_t>(total * es, 1), &staged));
  auto* buf = static_cast<uint8_t*>(fusion);
  auto* host = static_cast<uint8_t*>(staged);
  std::vector<CopySpan> out;
  HVD_RETURN_IF_ERROR(PackOnDevice(entries, bytes, offsets, buf, &out));
  const size_t count = packed / es;
  HVD_RETURN_IF_ERROR(d.Scale(buf, count, r.dtype, r.prescale));
  if (count > 0) {
    HVD_RETURN_IF_ERROR(c.local_device_collectives->Allreduce(buf, buf, count, r.dtype,
                                                              ReduceOp::kSum));
  }
  // The hosts' sums cross to the host packed end to end, as the host path's Adasum takes them.
  size_t at = 0;
  for (size_t i = 0; i < bytes.size(); at += bytes[i], ++i) {
    if (bytes[i]) HVD_RETURN_IF_ERROR(d.Copy(host + at, buf + offsets[i], bytes[i]));
  }
  HVD_RETURN_IF_ERROR(DeviceSynchronize());
  Status across = AdasumAllreduce(*c.cross, host, counts, r.dtype, scratch_, CollectiveDeadline());
  if (!across.ok()) {
    *host_failed = true;
    return across;
  }
  at = 0;
  for (size_t i = 0; i < bytes.size(); at += bytes[i], ++i) {
    if (bytes[i]) HVD_RETURN_IF_ERROR(d.Copy(buf + offsets[i], host + at, bytes[i]));
  }
  HVD_RETURN_IF_ERROR(d.Scale(buf, count, r.dtype, r.postscale / per_host));
  HVD_RETURN_IF_ERROR(DeviceCopy(out));
  return DeviceDone(entries);
}

// Hierarchical allreduce of the `count` elements in `buf` (device memory, in place): a
// reduce-scatter among this host's members on the device, this member's share reduced across
// hosts by the host path (pinned host memory, over `cross`: shm or TCP), an allgather among
// this host's members. The communicator inside the host is set up at the first one; every
// member runs the same responses with the same plan, so each host's members meet there.
Status EngineImpl::DeviceHierarchicalAllreduce(void* buf, size_t count, DataType dtype,
                                               ReduceOp op, const PlanContext& pc) {
  Comm& c = *comm_;
  Device& d = *device_;
  if (count == 0) return Status::OK();
  HVD_RETURN_IF_ERROR(SetUpLocalDeviceCollectives("hierarchical device allreduce"));
  DeviceCollectives& inside = *c.local_device_collectives;
  const int n = c.local->size(), me = c.local->rank();
  const size_t es = DataTypeSize(dtype);
  const std::vector<size_t> counts = HierarchicalParts(count, n);
  std::vector<size_t> bytes;
  for (size_t q : counts) bytes.push_back(q * es);
  const size_t share = counts[me];
  // The members with this one's local index share equal counts; the scratch is reserved for
  // the largest share, so that every member reserves alike.
  PlanContext across = pc;
  across.size = c.cross->size();
  across.offload = across.offload_pieces = across.hierarchical = false;
  const AllreducePlan plan = PlanAllreduce(counts[0], dtype, across);
  MemoryNeeds need;
  need.scratch = PlanScratchBytes(plan, counts[0], dtype, across);
  HVD_RETURN_IF_ERROR(Reserve(need, 0, nullptr));
  void* dshare = nullptr;
  void* host = nullptr;
  HVD_RETURN_IF_ERROR(GetDeviceBuffer(device_share_, &d, std::max<size_t>(share * es, 1), &dshare));
  HVD_RETURN_IF_ERROR(GetDeviceBuffer(host_staging_, &d, std::max<size_t>(share * es, 1), &host));
  HVD_RETURN_IF_ERROR(inside.ReduceScatter(buf, dshare, counts, dtype, op));
  if (share > 0) HVD_RETURN_IF_ERROR(d.Copy(host, dshare, share * es));
  HVD_RETURN_IF_ERROR(DeviceSynchronize());
  HVD_RETURN_IF_ERROR(hvd::Allreduce(*c.cross, host, share, dtype, op, scratch_,
                                     CollectiveDeadline(), plan.algorithm));
  if (share > 0) HVD_RETURN_IF_ERROR(d.Copy(dshare, host, share * es));
  return inside.Allgatherv(dshare, buf, bytes);
}

Status EngineImpl::DeviceAllgather(const Response& r, TensorEntry* e) {
  const AllgatherLayout l = LayOutAllgather(r, comm_->size, e ? e->request.shape : r.shapes[0]);
  void* out = nullptr;
  if (e) {
    HVD_RETURN_IF_ERROR(AllocateDeviceOutput(e, l.shape, l.total, &out));
  } else {
    HVD_RETURN_IF_ERROR(GetDeviceBuffer(device_fusion_, device_.get(), l.total, &out));
  }
  HVD_RETURN_IF_ERROR(comm_->device_collectives->Allgatherv(e ? e->input.data : nullptr, out, l.bytes));
  return DeviceDone({e});
}

Status EngineImpl::DeviceBroadcast(const Response& r, TensorEntry* e) {
  const size_t bytes = static_cast<size_t>(NumElements(r.shapes[0])) * DataTypeSize(r.dtype);
  void* buf = nullptr;
  if (e) {
    buf = e->output.data;
    if (comm_->rank == r.root && e->output.data != e->input.data) {
      HVD_RETURN_IF_ERROR(device_->Copy(buf, e->input.data, bytes));
    }
  } else {
    HVD_RETURN_IF_ERROR(GetDeviceBuffer(device_fusion_, device_.get(), bytes, &buf));
  }
  HVD_RETURN_IF_ERROR(comm_->device_collectives->Broadcast(buf, bytes, r.root));
  return DeviceDone({e});
}

Status EngineImpl::DeviceAlltoall(const Response& r, TensorEntry* e) {
  const AlltoallLayout l = LayOutAlltoall(r, comm_->size, comm_->rank, e->request.shape);
  e->handle->mutable_results().received_splits = l.received_splits;
  void* out = nullptr;
  HVD_RETURN_IF_ERROR(AllocateDeviceOutput(e, l.shape, l.total, &out));
  HVD_RETURN_IF_ERROR(comm_->device_collectives->Alltoallv(e->input.data, l.send, out, l.recv));
  return DeviceDone({e});
}

Status EngineImpl::DeviceReducescatter(const Response& r, TensorEntry* e) {
  Device& d = *device_;
  const int n = comm_->size;
  const ReducescatterLayout l = LayOutReducescatter(r, n, comm_->rank);
  const size_t esize = DataTypeSize(r.dtype);
  const size_t total = l.total, out_count = l.counts[comm_->rank];
  void* out = nullptr;
  HVD_RETURN_IF_ERROR(AllocateDeviceOutput(e, l.shape, out_count * esize, &out));
  const void* in = e->input.data;
  HVD_RETURN_IF_ERROR(PrescaledOnDevice(&in, total, r.dtype, r.prescale));
  const ReduceOp op = r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op;
  HVD_RETURN_IF_ERROR(comm_->device_collectives->ReduceScatter(in, out, l.counts, r.dtype, op));
  HVD_RETURN_IF_ERROR(d.Scale(out, out_count, r.dtype, FinalScale(r, n)));
  return DeviceDone({e});
}

Status EngineImpl::PrescaledOnDevice(const void** in, size_t count, DataType dtype,
                                     double factor) {
  if (factor == 1.0) return Status::OK();
  Device& d = *device_;
  const size_t bytes = count * DataTypeSize(dtype);
  void* copy = nullptr;
  HVD_RETURN_IF_ERROR(GetDeviceBuffer(device_fusion_, &d, bytes, &copy));
  HVD_RETURN_IF_ERROR(d.Copy(copy, *in, bytes));
  HVD_RETURN_IF_ERROR(d.Scale(copy, count, dtype, factor));
  *in = copy;
  return Status::OK();
}

// After a failure inside a staged allreduce: the copies still queued (the next piece to the
// host, the last one back into the caller's tensors) finish before the handles fail and the
// caller may free those tensors. Copies depend on no peer, so the wait does not poll (a poll
// would return the failure at once); its deadline only guards against a broken device.
void EngineImpl::DrainCopies() {
  Status s = device_->Synchronize(CollectiveDeadline(), nullptr);
  if (!s.ok()) {
    HVD_LOG(kWarning) << "copies of a failed staged allreduce: " << s.message();
  }
}

// The staged allreduce, in pieces. The tensors lie packed at aligned offsets (the response's
// shapes, the same on every rank; a rank that has joined contributes zeros), so each piece is a
// host allreduce of one run of elements, the same on every rank. The device's one stream runs
// the copies in order, and a Synchronize after each piece's host allreduce orders the host
// against them:
//
//   stream:  [pack] D2H 0 | D2H 1 ........ H2D 0, D2H 2 ........ H2D 1, D2H 3 ...  [unpack]
//   host:                 | allreduce 0 | sync | allreduce 1     | sync | ...
//
// Piece k's host memory is written by D2H k before the sync that precedes its allreduce, and
// read by H2D k, queued after that allreduce; the pieces do not overlap.
Status EngineImpl::RunStagedAllreduce(const Response& r, std::vector<TensorEntry*>& entries,
                                      bool* host_failed) {
  Device& d = *device_;
  // Every wait for the stream: on a failure the copies still queued finish first.
  auto sync = [this]() -> Status {
    Status s = DeviceSynchronize();
    if (!s.ok()) DrainCopies();
    return s;
  };
  const size_t m = entries.size();
  const size_t esize = DataTypeSize(r.dtype);
  std::vector<size_t> bytes(m), offsets;
  for (size_t i = 0; i < m; ++i) bytes[i] = static_cast<size_t>(NumElements(r.shapes[i])) * esize;
  // One tensor of this rank's crosses as it lies; several (or a joined rank's zeros) are packed.
  const bool packed = m > 1 || entries[0] == nullptr;
  const size_t total = packed ? AlignedOffsets(bytes, &offsets) : bytes[0];
  if (total == 0) return sync();
  void* host_p = nullptr;
  HVD_RETURN_IF_ERROR(GetDeviceBuffer(host_staging_, &d, total, &host_p));
  auto* host = static_cast<uint8_t*>(host_p);
  const uint8_t* dev_in = nullptr;
  uint8_t* dev_out = nullptr;
  if (packed) {
    void* f = nullptr;
    HVD_RETURN_IF_ERROR(GetDeviceBuffer(device_fusion_, &d, total, &f));
    dev_out = static_cast<uint8_t*>(f);
    dev_in = dev_out;
    // The gaps between tensors and a joined rank's stand-ins are reduced as zeros.
    HVD_RETURN_IF_ERROR(d.Zero(f, total));
    std::vector<CopySpan> spans;
    for (size_t i = 0; i < m; ++i) {
      if (entries[i] && bytes[i]) spans.push_back({entries[i]->input.data, dev_out + offsets[i], bytes[i]});
    }
    if (!spans.empty()) HVD_RETURN_IF_ERROR(DeviceCopy(spans));
  } else {
    dev_in = static_cast<const uint8_t*>(entries[0]->input.data);
    dev_out = static_cast<uint8_t*>(entries[0]->output.data);
  }
  // Scaling runs on the device, by its rules, as Horovod scales CUDA tensors (a float16 tensor
  // by the factor rounded to float16); the host sums (or takes the min, max, product) plainly.
  const size_t count = total / esize;
  if (r.prescale != 1.0) {
    if (dev_in != dev_out) {
      HVD_RETURN_IF_ERROR(d.Copy(dev_out, dev_in, total));
      dev_in = dev_out;
    }
    HVD_RETURN_IF_ERROR(d.Scale(dev_out, count, r.dtype, r.prescale));
  }
  const double post = FinalScale(r, comm_->size);
  const std::vector<StagingPiece> pieces =
      PlanStagingPieces(total, WithKnobs(comm_->plan, r.knobs));
  HVD_RETURN_IF_ERROR(d.Copy(host + pieces[0].offset, dev_in + pieces[0].offset, pieces[0].bytes));
  HVD_RETURN_IF_ERROR(sync());

  // The host stand-in: one tensor, the piece, reduced in place (the host allreduce reads only
  // an entry's input and output places).
  Response hr = r;
  hr.device = kCpuDevice;
  hr.prescale = hr.postscale = 1.0;
  if (hr.op == ReduceOp::kAverage) hr.op = ReduceOp::kSum;
  hr.names.resize(1);
  hr.shapes.assign(1, std::vector<int64_t>(1, 0));
  TensorEntry shadow;
  std::vector<TensorEntry*> shadows{&shadow};
  for (size_t k = 0; k < pieces.size(); ++k) {
    const StagingPiece& p = pieces[k];
    if (k + 1 < pieces.size()) {
      const StagingPiece& next = pieces[k + 1];
      HVD_RETURN_IF_ERROR(d.Copy(host + next.offset, dev_in + next.offset, next.bytes));
    }
    shadow.input = TensorPlace{host + p.offset, r.dtype};
    shadow.output = shadow.input;
    hr.shapes[0][0] = static_cast<int64_t>(p.bytes / esize);
    Status ran = Run(hr, shadows);
    if (!ran.ok()) {
      *host_failed = true;
      DrainCopies();
      return ran;
    }
    // The next piece is on the host, and the one before has gone back.
    HVD_RETURN_IF_ERROR(sync());
    HVD_RETURN_IF_ERROR(d.Copy(dev_out + p.offset, host + p.offset, p.bytes));
  }
  HVD_RETURN_IF_ERROR(d.Scale(dev_out, count, r.dtype, post));
  if (packed) {
    std::vector<CopySpan> spans;
    for (size_t i = 0; i < m; ++i) {
      if (entries[i] && bytes[i]) spans.push_back({dev_out + offsets[i], entries[i]->output.data, bytes[i]});
    }
    if (!spans.empty()) HVD_RETURN_IF_ERROR(DeviceCopy(spans));
  }
  return sync();
}

Status EngineImpl::RunStaged(const Response& r, std::vector<TensorEntry*>& entries,
                             bool* host_failed) {
  Device& d = *device_;
  const size_t m = entries.size();
  std::vector<size_t> bytes(m, 0), offsets;
  for (size_t i = 0; i < m; ++i) {
    if (entries[i]) {
      bytes[i] = static_cast<size_t>(NumElements(entries[i]->request.shape)) * DataTypeSize(r.dtype);
    }
  }
  const size_t total = AlignedOffsets(bytes, &offsets);
  void* host_p = nullptr;
  HVD_RETURN_IF_ERROR(GetDeviceBuffer(host_staging_, &d, total, &host_p));
  auto* host = static_cast<uint8_t*>(host_p);
  // Several tensors are packed on the device and cross in one copy.
  uint8_t* packed = nullptr;
  if (m > 1) {
    void* f = nullptr;
    HVD_RETURN_IF_ERROR(GetDeviceBuffer(device_fusion_, &d, total, &f));
    packed = static_cast<uint8_t*>(f);
    std::vector<CopySpan> spans;
    for (size_t i = 0; i < m; ++i) {
      if (bytes[i]) spans.push_back({entries[i]->input.data, packed + offsets[i], bytes[i]});
    }
    HVD_RETURN_IF_ERROR(DeviceCopy(spans));
    HVD_RETURN_IF_ERROR(d.Copy(host, packed, total));
  } else if (bytes[0]) {
    const void* in = entries[0]->input.data;
    // A reducescatter scales on the device, by its rules, as Horovod scales CUDA tensors (a
    // float16 tensor by the factor rounded to float16) and as NCCL's path does; the host
    // reduces plainly (below).
    if (r.type == OpType::kReducescatter) {
      HVD_RETURN_IF_ERROR(
          PrescaledOnDevice(&in, bytes[0] / DataTypeSize(r.dtype), r.dtype, r.prescale));
    }
    HVD_RETURN_IF_ERROR(d.Copy(host, in, bytes[0]));
  }
  HVD_RETURN_IF_ERROR(DeviceSynchronize());

  // Host stand-ins of the entries; allreduce and broadcast work in place in the staging buffer.
  const bool in_place = r.type == OpType::kAllreduce || r.type == OpType::kBroadcast;
  std::vector<TensorEntry> shadow(m);
  std::vector<TensorEntry*> shadows(m, nullptr);
  for (size_t i = 0; i < m; ++i) {
    if (!entries[i]) continue;
    TensorEntry& s = shadow[i];
    s.request = entries[i]->request;
    s.input = TensorPlace{host + offsets[i], r.dtype};
    if (in_place) s.output = s.input;
    s.handle = NewHandle();
    shadows[i] = &s;
  }
  Response hr = r;
  hr.device = kCpuDevice;
  const bool scales_here = r.type == OpType::kReducescatter;
  if (scales_here) {
    hr.prescale = hr.postscale = 1.0;
    if (hr.op == ReduceOp::kAverage) hr.op = ReduceOp::kSum;
  }
  Status ran = Run(hr, shadows);
  if (!ran.ok()) {
    *host_failed = true;
    return ran;
  }

  if (in_place) {
    if (m > 1) {
      HVD_RETURN_IF_ERROR(d.Copy(packed, host, total));
      std::vector<CopySpan> spans;
      for (size_t i = 0; i < m; ++i) {
        if (bytes[i]) spans.push_back({packed + offsets[i], entries[i]->output.data, bytes[i]});
      }
      HVD_RETURN_IF_ERROR(DeviceCopy(spans));
    } else if (bytes[0]) {
      HVD_RETURN_IF_ERROR(d.Copy(entries[0]->output.data, host, bytes[0]));
    }
  } else if (entries[0]) {
    TensorEntry* e = entries[0];
    Handle& h = *shadow[0].handle;
    const size_t out_bytes = h.output_bytes().size();
    void* out = nullptr;
    HVD_RETURN_IF_ERROR(AllocateDeviceOutput(e, h.output_shape(), out_bytes, &out));
    e->handle->mutable_results().received_splits = h.received_splits();
    void* stage = nullptr;
    HVD_RETURN_IF_ERROR(GetDeviceBuffer(host_staging_, &d, out_bytes, &stage));
    if (out_bytes) std::memcpy(stage, h.output_bytes().data(), out_bytes);
    HVD_RETURN_IF_ERROR(d.Copy(out, stage, out_bytes));
    if (scales_here) {
      HVD_RETURN_IF_ERROR(
          d.Scale(out, out_bytes / DataTypeSize(r.dtype), r.dtype, FinalScale(r, comm_->size)));
    }
  }
  return DeviceSynchronize();
}

}  // namespace hvd
