#include "device/device.h"

#include <atomic>

#include "hvd/config.h"

namespace hvd {

namespace {
std::atomic<DeviceRuntime*> g_test_runtime{nullptr};
}  // namespace

DeviceRuntime* GetDeviceRuntime() {
  if (DeviceRuntime* r = g_test_runtime.load()) return r;
  return CudaRuntime();
}

void SetDeviceRuntimeForTesting(DeviceRuntime* runtime) { g_test_runtime.store(runtime); }

#if !HVD_HAVE_CUDA
DeviceRuntime* CudaRuntime() { return nullptr; }
#endif

Status DeviceBuffer::Get(Device* device, size_t bytes, void** out) {
  if (device != device_) Reset();
  if (bytes > capacity_ || data_ == nullptr) {
    Reset();
    const size_t want = bytes == 0 ? kDeviceFusionAlign : bytes;
    void* p = nullptr;
    Status s = host_ ? device->AllocateHost(want, &p) : device->Allocate(want, &p);
    if (!s.ok()) return s;
    device_ = device;
    data_ = p;
    capacity_ = want;
  }
  *out = data_;
  return Status::OK();
}

void DeviceBuffer::Reset() {
  if (data_ != nullptr) {
    if (host_) {
      device_->FreeHost(data_);
    } else {
      device_->Free(data_);
    }
  }
  device_ = nullptr;
  data_ = nullptr;
  capacity_ = 0;
}

size_t AlignedOffsets(const std::vector<size_t>& bytes, std::vector<size_t>* offsets) {
  offsets->resize(bytes.size());
  size_t off = 0, end = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    (*offsets)[i] = off;
    end = off + bytes[i];
    off += (bytes[i] + kDeviceFusionAlign - 1) / kDeviceFusionAlign * kDeviceFusionAlign;
  }
  return end;
}

}  // namespace hvd
