// NCCL as the device collectives backend (transport/device_collectives.h).
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0): no NCCL call blocks the
// background thread, so set-up and every call settle in a loop that also polls the engine
// (heartbeats, an abort relayed by the coordinator) and honours the deadline; a peer that dies
// mid-call ends in ncclCommAbort, never in a hang.
//
// Ragged collectives are NCCL groups: allgatherv a broadcast from each rank (ncclAllGather when
// the parts are equal), alltoallv sends and receives, reduce-scatter with unequal parts a
// reduce to each rank (ncclReduceScatter when equal).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <thread>

#include "collectives/collectives.h"
#include "device/device.h"
#include "transport/device_collectives.h"
#include "transport/nccl/nccl_collectives.h"
#include "transport/transport.h"

namespace hvd {

namespace {

std::string NcclText(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last) s += ": " + std::string(last);
  }
  return s;
}

bool NcclType(DataType t, ncclDataType_t* out) {
  switch (t) {
    case DataType::kUInt8: *out = ncclUint8; return true;
    case DataType::kBool: *out = ncclUint8; return true;
    case DataType::kInt8: *out = ncclInt8; return true;
    case DataType::kInt32: *out = ncclInt32; return true;
    case DataType::kInt64: *out = ncclInt64; return true;
    case DataType::kFloat16: *out = ncclFloat16; return true;
    case DataType::kBFloat16: *out = ncclBfloat16; return true;
    case DataType::kFloat32: *out = ncclFloat32; return true;
    case DataType::kFloat64: *out = ncclFloat64; return true;
    case DataType::kInt16:
    case DataType::kUInt16:
      return false;  // NCCL has no 16-bit integers
  }
  return false;
}

ncclRedOp_t NcclOp(DataType t, ReduceOp op) {
  if (t == DataType::kBool) {  // 0/1 bytes: or is max, and is min
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? ncclMin : ncclMax;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return ncclSum;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
    case ReduceOp::kAdasum: break;  // never: Reduces() sends Adasum to the host path
  }
  return ncclSum;
}

class NcclCollectives : public DeviceCollectives {
 public:
  NcclCollectives(Device& device, int rank, int size, PollFn poll)
      : device_(device), rank_(rank), size_(size), poll_(std::move(poll)) {}
  ~NcclCollectives() override {
    if (comm_ != nullptr) {
      if (aborted_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommFinalize(comm_);
        ncclResult_t st = ncclInProgress;
        auto limit = Clock::now() + std::chrono::seconds(5);
        while (st == ncclInProgress && Clock::now() < limit) {
          if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) break;
        }
        if (st == ncclSuccess) {
          ncclCommDestroy(comm_);
        } else {
          ncclCommAbort(comm_);
        }
      }
    }
  }

  Status Init(const ncclUniqueId& id, Deadline deadline) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device_.ordinal());
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (previous >= 0) cudaSetDevice(previous);
    if (r != ncclSuccess && r != ncclInProgress) {
      comm_ = nullptr;
      return Status::Internal("ncclCommInitRank on " + device_.Describe() + ": " +
                              NcclText(r, nullptr));
    }
    return Settle("ncclCommInitRank", deadline);
  }

  const char* name() const override { return "nccl"; }

  bool Reduces(DataType dtype, ReduceOp op) const override {
    ncclDataType_t t;
    return op != ReduceOp::kAdasum && NcclType(dtype, &t);  // Adasum is staged to the host's
  }

  Status Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override {
    ncclDataType_t t;
    if (!NcclType(dtype, &t)) return Unsupported(dtype);
    return Call("ncclAllReduce", ncclAllReduce(in, out, count, t, NcclOp(dtype, op), comm_, Stream()));
  }

  Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    bool equal = true;
    for (size_t b : bytes) equal = equal && b == bytes[0];
    auto* o = static_cast<char*>(out);
    if (equal) {
      if (bytes[0] == 0) return Status::OK();
      return Call("ncclAllGather", ncclAllGather(in, o, bytes[0], ncclUint8, comm_, Stream()));
    }
    HVD_RETURN_IF_ERROR(GroupStart());
    size_t off = 0;
    for (int r = 0; r < size_; ++r) {
      if (bytes[r] > 0) {
        ncclResult_t res = ncclBroadcast(r == rank_ ? in : o + off, o + off, bytes[r], ncclUint8,
                                         r, comm_, Stream());
        if (res != ncclSuccess && res != ncclInProgress) {
          ncclGroupEnd();
          return Call("ncclBroadcast", res);
        }
      }
      off += bytes[r];
    }
    return Call("ncclGroupEnd", ncclGroupEnd());
  }

  Status Broadcast(void* buf, size_t bytes, int root) override {
    if (bytes == 0) return Status::OK();
    return Call("ncclBroadcast", ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, Stream()));
  }

  Status Alltoallv(const void* in, const std::vector<size_t>& send, void* out,
                   const std::vector<size_t>& recv) override {
    HVD_RETURN_IF_ERROR(GroupStart());
    size_t soff = 0, roff = 0;
    for (int r = 0; r < size_; ++r) {
      ncclResult_t res = ncclSuccess;
      if (send[r] > 0) {
        res = ncclSend(static_cast<const char*>(in) + soff, send[r], ncclUint8, r, comm_, Stream());
      }
      if ((res == ncclSuccess || res == ncclInProgress) && recv[r] > 0) {
        res = ncclRecv(static_cast<char*>(out) + roff, recv[r], ncclUint8, r, comm_, Stream());
      }
      if (res != ncclSuccess && res != ncclInProgress) {
        ncclGroupEnd();
        return Call("ncclSend/ncclRecv", res);
      }
      soff += send[r];
      roff += recv[r];
    }
    return Call("ncclGroupEnd", ncclGroupEnd());
  }

  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                       DataType dtype, ReduceOp op) override {
    ncclDataType_t t;
    if (!NcclType(dtype, &t)) return Unsupported(dtype);
    const ncclRedOp_t o = NcclOp(dtype, op);
    bool equal = true;
    for (size_t c : counts) equal = equal && c == counts[0];
    if (equal) {
      if (counts[0] == 0) return Status::OK();
      return Call("ncclReduceScatter", ncclReduceScatter(in, out, counts[0], t, o, comm_, Stream()));
    }
    const size_t esize = DataTypeSize(dtype);
    HVD_RETURN_IF_ERROR(GroupStart());
    size_t off = 0;
    for (int r = 0; r < size_; ++r) {
      if (counts[r] > 0) {
        ncclResult_t res = ncclReduce(static_cast<const char*>(in) + off * esize,
                                      r == rank_ ? out : nullptr, counts[r], t, o, r, comm_, Stream());
        if (res != ncclSuccess && res != ncclInProgress) {
          ncclGroupEnd();
          return Call("ncclReduce", res);
        }
      }
      off += counts[r];
    }
    return Call("ncclGroupEnd", ncclGroupEnd());
  }

  Status Check() override {
    if (aborted_) return Status::Aborted("the NCCL communicator was aborted");
    ncclResult_t st;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &st);
    if (r != ncclSuccess) return Status::Internal("ncclCommGetAsyncError: " + NcclText(r, comm_));
    if (st != ncclSuccess && st != ncclInProgress) {
      return Status::PeerLost("the NCCL communicator failed: " + NcclText(st, comm_));
    }
    return Status::OK();
  }

  void Abort() override {
    if (comm_ != nullptr && !aborted_) {
      aborted_ = true;
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

 private:
  cudaStream_t Stream() const { return static_cast<cudaStream_t>(device_.stream()); }

  Status Unsupported(DataType dtype) const {
    return Status::InvalidArgument(std::string("NCCL cannot reduce ") + DataTypeName(dtype));
  }

  // A non-blocking call returns ncclInProgress until NCCL has taken it; wait for that.
  // A group is opened only on a live communicator: Call refuses an aborted one without looking
  // at the result, which would leave this thread's NCCL group open for every later call.
  Status GroupStart() {
    if (aborted_) return Status::Aborted("the NCCL communicator was aborted");
    return Call("ncclGroupStart", ncclGroupStart());
  }

  Status Call(const char* what, ncclResult_t r) {
    if (aborted_) return Status::Aborted("the NCCL communicator was aborted");
    if (r != ncclSuccess && r != ncclInProgress) {
      return Status::Internal(std::string(what) + " on " + device_.Describe() + ": " + NcclText(r, comm_));
    }
    if (r == ncclSuccess) return Status::OK();
    return Settle(what, DeadlineAfterSeconds(settle_seconds_));
  }

  // Looks without sleeping for the first 200 µs (a call NCCL takes at once must not pay a
  // sleep's granularity), then every 20 µs; `poll_` and the deadline every 200 µs, as
  // Device::Synchronize does.
  Status Settle(const char* what, Deadline deadline) {
    const auto start = Clock::now();
    auto next_poll = start;
    for (;;) {
      ncclResult_t st;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &st);
      if (r != ncclSuccess) st = r;
      if (st == ncclSuccess) return Status::OK();
      if (st != ncclInProgress) {
        Status s = Status::Internal(std::string(what) + " on " + device_.Describe() + ": " +
                                    NcclText(st, comm_));
        Abort();
        return s;
      }
      const auto now = Clock::now();
      if (now >= next_poll) {
        next_poll = now + std::chrono::microseconds(200);
        if (poll_) {
          Status p = poll_();
          if (!p.ok()) {
            Abort();
            return p;
          }
        }
        if (now > deadline) {
          Abort();
          return Status::Timeout(std::string(what) + " on " + device_.Describe() +
                                 " did not finish in time (see HVD_TIMEOUT_SECONDS)");
        }
      }
      if (now - start < std::chrono::microseconds(200)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  Device& device_;
  const int rank_;
  const int size_;
  PollFn poll_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  double settle_seconds_ = 30.0;

 public:
  void set_settle_seconds(double s) { settle_seconds_ = s; }
};

}  // namespace

StatusOr<std::unique_ptr<DeviceCollectives>> CreateNcclCollectives(Transport& world,
                                                                   Device& device,
                                                                   Deadline deadline,
                                                                   PollFn poll) {
  ncclUniqueId id{};
  if (world.rank() == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return Status::Internal("ncclGetUniqueId: " + NcclText(r, nullptr));
  }
  if (world.size() > 1) {
    HVD_RETURN_IF_ERROR(hvd::Broadcast(world, &id, sizeof(id), 0, deadline));
  }
  auto comm = std::make_unique<NcclCollectives>(device, world.rank(), world.size(), std::move(poll));
  const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
  comm->set_settle_seconds(left > 1 ? left : 1);
  HVD_RETURN_IF_ERROR(comm->Init(id, deadline));
  return std::unique_ptr<DeviceCollectives>(std::move(comm));
}

}  // namespace hvd
