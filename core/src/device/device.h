// Device memory behind one interface (DESIGN.md, "Device memory"). The engine packs, scales and
// unpacks fusion buffers, stages device tensors through host memory and orders its work after
// the framework's through a Device, never through CUDA directly. CUDA implements it
// (device/cuda_device.cc); the tests implement it over host memory (a fake device), so the
// engine's device paths run in CI without a GPU.
//
// Work on a Device is queued, in order, on the device's own stream; Synchronize waits for it.
//
// Thread-safety: a Device is used by one thread at a time: the engine's background thread, or a
// caller that runs the engine's work in its place (under the engine's run lock), inside
// MakeCurrent's scope. A DeviceRuntime's RecordEvent and ReleaseEvent may be called from any
// thread (callers submit from theirs).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/time.h"
#include "hvd/status.h"
#include "hvd/types.h"

namespace hvd {

// One piece of a batched copy.
struct CopySpan {
  const void* src;
  void* dst;
  size_t bytes;
};

// Offsets of the tensors in a device fusion buffer: each starts at a multiple of this, so that
// the batched copy moves 16-byte words (the gaps are reduced along with the data and ignored).
constexpr size_t kDeviceFusionAlign = 16;

// Device::BatchedCopy's ResourceExhausted message when its copy table still holds chunks that
// queued work may read: synchronize (Device::Synchronize, which polls) and call again.
constexpr const char* kCopyTableFull = "the batched copy's table is full until the stream is synchronized";

class Device {
 public:
  virtual ~Device() = default;
  virtual int ordinal() const = 0;
  // "cuda:0 (NVIDIA H200)": for messages.
  virtual std::string Describe() const = 0;
  // The physical device's identity (a UUID): two ranks with the same one share the device.
  virtual std::string Uuid() const = 0;
  // The stream the work below is queued on (a cudaStream_t), for the device collectives.
  virtual void* stream() const = 0;
  // Makes this device current on the calling thread until `scope` is released, then gives the
  // thread back what it had (no context included). The thread that opened the device has it
  // current already (`scope` stays null: nothing to undo). A caller that runs device work holds
  // one around it (EngineImpl::ExecuteOnDevice): the calls below, the communicator's and the
  // runtime's own then act on this device, and none leaves the caller's thread switched or with
  // a context it did not have. Fails where the device cannot be made current.
  virtual Status MakeCurrent(std::shared_ptr<void>* scope) = 0;

  // Device memory and pinned host memory, owned by the caller.
  virtual Status Allocate(size_t bytes, void** out) = 0;
  virtual void Free(void* p) = 0;
  virtual Status AllocateHost(size_t bytes, void** out) = 0;
  virtual void FreeHost(void* p) = 0;

  // Queued on the stream, in order.
  // Work queued after this waits for `event` (from DeviceRuntime::RecordEvent).
  virtual Status WaitEvent(void* event) = 0;
  // Every span at once (one kernel), between any memory the device can address. It never waits
  // for the stream: ResourceExhausted (kCopyTableFull) asks the caller to Synchronize first.
  virtual Status BatchedCopy(const std::vector<CopySpan>& spans) = 0;
  virtual Status Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual Status Zero(void* dst, size_t bytes) = 0;
  // buf[i] *= factor, as the CPU's Scale (reduce/reduce.h) does it; no-op for 1.0.
  virtual Status Scale(void* buf, size_t count, DataType dtype, double factor) = 0;
  // Waits until everything queued has finished. Between looks it calls `poll`, whose error
  // ends the wait (a lost peer, an aborted communicator); at `deadline` it fails with Timeout.
  virtual Status Synchronize(Deadline deadline, const std::function<Status()>& poll) = 0;
};

// Where Devices come from: CUDA in a build with it; the tests install a fake one.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual StatusOr<std::unique_ptr<Device>> Open(int ordinal) = 0;
  // On the caller's thread, at submission: an event that completes when the work queued on
  // `stream` (a cudaStream_t; nullptr = the legacy default stream) of device `ordinal` so far
  // has. The engine's stream waits for it before reading the tensor.
  virtual Status RecordEvent(int ordinal, void* stream, void** event) = 0;
  virtual void ReleaseEvent(void* event) = 0;
  // Records an event on a Device's stream (after the work queued on it so far).
  virtual Status RecordOnDevice(Device& device, void** event) = 0;
  // Makes `stream` (nullptr = the legacy default stream) wait for `event`; any thread.
  virtual Status StreamWaitEvent(void* stream, void* event) = 0;
  // How many devices this process sees (0 without a driver or device).
  virtual int DeviceCount() = 0;
};

// The runtime in use: the one a test installed, else CUDA's when built with it, else null.
DeviceRuntime* GetDeviceRuntime();
// Installs `runtime` (not owned; null restores the default) for tests.
void SetDeviceRuntimeForTesting(DeviceRuntime* runtime);
// The CUDA runtime (device/cuda_device.cc); null in a build without CUDA.
DeviceRuntime* CudaRuntime();

// Memory on a Device that grows on demand, as ScratchBuffer does on the host.
// Thread-safety: as the Device's.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(bool host = false) : host_(host) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }
  // At least `bytes` bytes on `device` (pinned host memory if `host`); contents undefined.
  Status Get(Device* device, size_t bytes, void** out);
  // Whether Get would free memory first (CUDA's frees wait for the whole device, with no
  // deadline: the engine synchronizes before, polling).
  bool MustFree(const Device* device, size_t bytes) const {
    return data_ != nullptr && (device != device_ || bytes > capacity_);
  }
  // Whether Get would allocate (and so call into CUDA, which may wait).
  bool MustAllocate(const Device* device, size_t bytes) const {
    return data_ == nullptr || device != device_ || bytes > capacity_;
  }
  void Reset();  // frees; call before the device goes away

 private:
  bool host_;
  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// Offsets of `bytes` packed at kDeviceFusionAlign; returns the end of the last tensor (its
// padding not counted), so that a buffer of one tensor is as long as the tensor: a rank that
// has joined packs its one zero stand-in while the others reduce their tensor as it lies, and
// the element counts must match.
size_t AlignedOffsets(const std::vector<size_t>& bytes, std::vector<size_t>* offsets);

}  // namespace hvd
