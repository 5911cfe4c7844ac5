// The CUDA implementation of the device layer (device.h): one non-blocking stream per engine,
// device and pinned memory from the CUDA runtime, the kernels of cuda_kernels.cu, and events
// from a pool for ordering after the caller's stream.
//
// Every CUDA call is checked; a failure becomes a Status with CUDA's own text
// ("cudaMalloc of 96.0 MiB on cuda:0: out of memory (cudaErrorMemoryAllocation)"). Running out
// of memory is ResourceExhausted, anything else Internal.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "device/cuda_kernels.h"
#include "device/device.h"

namespace hvd {

namespace {

Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::OK();
  // Taken from the thread's last-error slot, where the runtime also keeps it: on a caller's
  // thread the framework's next launch check would report it as its own.
  cudaGetLastError();
  std::string msg = what + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
  if (e == cudaErrorMemoryAllocation) return Status::ResourceExhausted(msg);
  return Status::Internal("CUDA error in " + msg);
}

#define HVD_CUDA_RETURN(call, what)                      \
  do {                                                   \
    cudaError_t hvd_cuda_err_ = (call);                  \
    if (hvd_cuda_err_ != cudaSuccess) return CudaStatus(hvd_cuda_err_, what); \
  } while (0)

std::string Bytes(size_t b) {
  std::ostringstream os;
  if (b >= (1u << 20)) {
    os.precision(1);
    os << std::fixed << b / 1048576.0 << " MiB";
  } else {
    os << b << " bytes";
  }
  return os.str();
}

// The driver's cuCtxGetCurrent and cuCtxSetCurrent, through the runtime (no link to the
// driver library); null where the driver does not give them.
struct DriverContextCalls {
  int (*get)(void**) = nullptr;  // CUresult cuCtxGetCurrent(CUcontext*)
  int (*set)(void*) = nullptr;   // CUresult cuCtxSetCurrent(CUcontext)
};

const DriverContextCalls& DriverContext() {
  static const DriverContextCalls calls = [] {
    DriverContextCalls c;
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult q1 = cudaDriverEntryPointSymbolNotFound, q2 = q1;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault,
                                         &q1) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault,
                                         &q2) == cudaSuccess &&
        q1 == cudaDriverEntryPointSuccess && q2 == cudaDriverEntryPointSuccess) {
      c.get = reinterpret_cast<int (*)(void**)>(get);
      c.set = reinterpret_cast<int (*)(void*)>(set);
    } else {
      cudaGetLastError();
    }
    return c;
  }();
  return calls;
}

// Makes `ordinal` current on this thread for the scope, and restores what the thread had if it
// switched (a caller's thread: the framework's current device is left as it was). A thread
// that had no context gets none back: restoring its "previous" device, 0 by default, would make
// a context on GPU 0 (CUDA 12 and later create the primary context at cudaSetDevice), hundreds
// of MiB in every rank of a host. On the thread that opened the device it is current already
// (CudaRuntimeImpl::Open).
class DeviceScope {
 public:
  // `even_if_current`: also where the thread has no context yet, which CUDA reports as device 0
  // current (Device::MakeCurrent: such a thread gets none back).
  explicit DeviceScope(int ordinal, bool even_if_current = false) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != ordinal || even_if_current) {
      const DriverContextCalls& d = DriverContext();
      void* context = nullptr;
      no_context_ = d.get != nullptr && d.set != nullptr && d.get(&context) == 0 &&
                    context == nullptr;
      status_ = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice(" + std::to_string(ordinal) + ")");
      switched_ = status_.ok();
    }
  }
  ~DeviceScope() {
    if (!switched_) return;
    if (no_context_) {
      DriverContext().set(nullptr);
      return;
    }
    // A failed restore is cleared, not left for the next kernel launch to report as its own.
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  bool no_context_ = false;  // the thread had no current context before the switch
  Status status_;
};

class CudaDevice : public Device {
 public:
  CudaDevice(int ordinal, std::string name, std::string uuid)
      : ordinal_(ordinal), name_(std::move(name)), uuid_(std::move(uuid)) {}
  ~CudaDevice() override {
    DeviceScope scope(ordinal_);
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (table_) cudaFreeHost(table_);
  }

  Status Init() {
    DeviceScope scope(ordinal_);
    HVD_RETURN_IF_ERROR(scope.status());
    HVD_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                    "cudaStreamCreate on " + Describe());
    return Status::OK();
  }

  int ordinal() const override { return ordinal_; }
  std::string Describe() const override {
    return "cuda:" + std::to_string(ordinal_) + " (" + name_ + ")";
  }
  std::string Uuid() const override { return uuid_; }
  void* stream() const override { return stream_; }

  Status MakeCurrent(std::shared_ptr<void>* scope) override {
    scope->reset();
    int now = -1;
    void* context = nullptr;
    const DriverContextCalls& d = DriverContext();
    const bool none = d.get != nullptr && d.get(&context) == 0 && context == nullptr;
    if (!none && cudaGetDevice(&now) == cudaSuccess && now == ordinal_) return Status::OK();
    auto s = std::make_shared<DeviceScope>(ordinal_, /*even_if_current=*/true);
    HVD_RETURN_IF_ERROR(s->status());
    *scope = std::move(s);
    return Status::OK();
  }

  Status Allocate(size_t bytes, void** out) override {
    DeviceScope scope(ordinal_);
    HVD_RETURN_IF_ERROR(scope.status());
    HVD_CUDA_RETURN(cudaMalloc(out, bytes), "cudaMalloc of " + Bytes(bytes) + " on " + Describe());
    return Status::OK();
  }
  void Free(void* p) override {
    DeviceScope scope(ordinal_);
    cudaFree(p);
  }
  Status AllocateHost(size_t bytes, void** out) override {
    DeviceScope scope(ordinal_);
    HVD_RETURN_IF_ERROR(scope.status());
    HVD_CUDA_RETURN(cudaHostAlloc(out, bytes, cudaHostAllocPortable),
                    "cudaHostAlloc of " + Bytes(bytes) + " (pinned host memory for " + Describe() + ")");
    return Status::OK();
  }
  void FreeHost(void* p) override { cudaFreeHost(p); }

  Status WaitEvent(void* event) override {
    HVD_CUDA_RETURN(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0),
                    "cudaStreamWaitEvent on " + Describe());
    return Status::OK();
  }

  Status BatchedCopy(const std::vector<CopySpan>& spans) override {
    using cuda::CopyChunk;
    size_t n = 0;
    for (const auto& s : spans) n += (s.bytes + cuda::kCopyChunkBytes - 1) / cuda::kCopyChunkBytes;
    if (n == 0) return Status::OK();
    DeviceScope scope(ordinal_);
    HVD_RETURN_IF_ERROR(scope.status());
    // The chunk table lies in mapped pinned memory, which the kernel reads directly. Tables are
    // appended until Synchronize (an earlier kernel may not have read its part yet). A full
    // table is not waited for here, where nothing would poll the control plane or keep a
    // deadline while a collective queued before it hangs on a lost peer: the caller
    // synchronizes (Device::Synchronize) and calls again.
    if (table_used_ + n > table_capacity_) {
      if (table_used_ > 0) {
        return Status::ResourceExhausted(kCopyTableFull);
      }
      if (n > table_capacity_) {
        if (table_) cudaFreeHost(table_);
        table_ = nullptr;
        table_capacity_ = 0;
        const size_t cap = std::max<size_t>(2 * n, 8192);
        HVD_CUDA_RETURN(cudaHostAlloc(reinterpret_cast<void**>(&table_), cap * sizeof(CopyChunk),
                                      cudaHostAllocMapped | cudaHostAllocPortable),
                        "cudaHostAlloc of the copy table");
        HVD_CUDA_RETURN(cudaHostGetDevicePointer(reinterpret_cast<void**>(&table_dev_), table_, 0),
                        "cudaHostGetDevicePointer of the copy table");
        table_capacity_ = cap;
      }
    }
    CopyChunk* host = table_ + table_used_;
    size_t k = 0;
    for (const auto& s : spans) {
      for (size_t off = 0; off < s.bytes; off += cuda::kCopyChunkBytes) {
        host[k++] = {static_cast<const char*>(s.src) + off, static_cast<char*>(s.dst) + off,
                     std::min(cuda::kCopyChunkBytes, s.bytes - off)};
      }
    }
    const CopyChunk* dev = table_dev_ + table_used_;
    table_used_ += n;
    HVD_CUDA_RETURN(cuda::LaunchBatchedCopy(dev, static_cast<uint32_t>(n), stream_),
                    "the batched copy kernel on " + Describe());
    return Status::OK();
  }

  Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return Status::OK();
    HVD_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_),
                    "cudaMemcpyAsync of " + Bytes(bytes) + " on " + Describe());
    return Status::OK();
  }

  Status Zero(void* dst, size_t bytes) override {
    if (bytes == 0) return Status::OK();
    HVD_CUDA_RETURN(cudaMemsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync on " + Describe());
    return Status::OK();
  }

  Status Scale(void* buf, size_t count, DataType dtype, double factor) override {
    if (factor == 1.0 || count == 0) return Status::OK();
    DeviceScope scope(ordinal_);
    HVD_RETURN_IF_ERROR(scope.status());
    HVD_CUDA_RETURN(cuda::LaunchScale(buf, count, static_cast<int>(dtype), factor, stream_),
                    "the scale kernel on " + Describe());
    return Status::OK();
  }

  Status Synchronize(Deadline deadline, const std::function<Status()>& poll) override {
    // The stream is looked at without sleeping (a sleep would add its own granularity to every
    // collective); `poll` and the deadline every 200 µs.
    auto next_poll = Clock::now();
    for (;;) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return CudaStatus(e, "work queued on " + Describe());
      const auto now = Clock::now();
      if (now >= next_poll) {
        next_poll = now + std::chrono::microseconds(200);
        if (poll) HVD_RETURN_IF_ERROR(poll());
        if (now > deadline) {
          return Status::Timeout("the work queued on " + Describe() +
                                 " did not finish in time (see HVD_TIMEOUT_SECONDS)");
        }
      }
      std::this_thread::yield();
    }
    table_used_ = 0;
    return Status::OK();
  }

 private:
  const int ordinal_;
  const std::string name_;
  const std::string uuid_;
  cudaStream_t stream_ = nullptr;
  cuda::CopyChunk* table_ = nullptr;      // mapped pinned memory: the batched copies' chunks
  cuda::CopyChunk* table_dev_ = nullptr;  // the same, as the device sees it
  size_t table_capacity_ = 0;
  size_t table_used_ = 0;                 // appended since the last Synchronize
};

class CudaRuntimeImpl : public DeviceRuntime {
 public:
  StatusOr<std::unique_ptr<Device>> Open(int ordinal) override {
    const int count = DeviceCount();
    if (ordinal < 0 || ordinal >= count) {
      return Status::FailedPrecondition("CUDA device " + std::to_string(ordinal) +
                                        " does not exist: this process sees " +
                                        std::to_string(count) + " CUDA device(s)");
    }
    cudaDeviceProp prop;
    HVD_CUDA_RETURN(cudaGetDeviceProperties(&prop, ordinal),
                    "cudaGetDeviceProperties(" + std::to_string(ordinal) + ")");
    std::ostringstream uuid;
    uuid << std::hex;
    for (int i = 0; i < 16; ++i) {
      uuid << ((static_cast<unsigned>(static_cast<unsigned char>(prop.uuid.bytes[i])) >> 4) & 15)
           << (static_cast<unsigned char>(prop.uuid.bytes[i]) & 15);
    }
    // The device stays current on the thread that opens it (the engine's background thread,
    // which runs all of its work): its DeviceScopes then switch nothing and restore nothing.
    // Restoring the thread's previous device, 0 on a thread that never chose one, made every
    // rank of a host create a context on GPU 0 (CUDA 12 and later create the primary context
    // at cudaSetDevice), hundreds of MiB each.
    HVD_CUDA_RETURN(cudaSetDevice(ordinal), "cudaSetDevice(" + std::to_string(ordinal) + ")");
    auto dev = std::make_unique<CudaDevice>(ordinal, prop.name, uuid.str());
    HVD_RETURN_IF_ERROR(dev->Init());
    return std::unique_ptr<Device>(std::move(dev));
  }

  Status RecordEvent(int ordinal, void* stream, void** event) override {
    DeviceScope scope(ordinal);
    HVD_RETURN_IF_ERROR(scope.status());
    cudaEvent_t ev = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto& pool = free_[ordinal];
      if (!pool.empty()) {
        ev = pool.back();
        pool.pop_back();
      }
    }
    if (ev == nullptr) {
      HVD_CUDA_RETURN(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming),
                      "cudaEventCreate on cuda:" + std::to_string(ordinal));
      std::lock_guard<std::mutex> l(mu_);
      ordinal_of_[ev] = ordinal;
    }
    cudaError_t e = cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) {
      ReleaseEvent(ev);
      return CudaStatus(e, "cudaEventRecord on the caller's stream of cuda:" + std::to_string(ordinal));
    }
    *event = ev;
    return Status::OK();
  }

  Status RecordOnDevice(Device& device, void** event) override {
    HVD_RETURN_IF_ERROR(RecordEvent(device.ordinal(), device.stream(), event));
    return Status::OK();
  }

  Status StreamWaitEvent(void* stream, void* event) override {
    // On the event's device: a null stream is that device's default stream, not the calling
    // thread's current device's.
    int ordinal = -1;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = ordinal_of_.find(static_cast<cudaEvent_t>(event));
      if (it != ordinal_of_.end()) ordinal = it->second;
    }
    std::optional<DeviceScope> scope;
    if (ordinal >= 0) {
      scope.emplace(ordinal);
      HVD_RETURN_IF_ERROR(scope->status());
    }
    HVD_CUDA_RETURN(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                        static_cast<cudaEvent_t>(event), 0),
                    "cudaStreamWaitEvent on the caller's stream");
    return Status::OK();
  }

  void ReleaseEvent(void* event) override {
    if (event == nullptr) return;
    auto ev = static_cast<cudaEvent_t>(event);
    std::lock_guard<std::mutex> l(mu_);
    free_[ordinal_of_[ev]].push_back(ev);
  }

  int DeviceCount() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear it: no driver or no device is an answer, not an error
      return 0;
    }
    return n;
  }

 private:
  std::mutex mu_;
  std::unordered_map<int, std::vector<cudaEvent_t>> free_;  // guarded by mu_
  std::unordered_map<cudaEvent_t, int> ordinal_of_;         // guarded by mu_
};

}  // namespace

DeviceRuntime* CudaRuntime() {
  static CudaRuntimeImpl* runtime = new CudaRuntimeImpl();  // lives as long as the process
  return runtime;
}

}  // namespace hvd
