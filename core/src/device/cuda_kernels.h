// The CUDA kernels of the device layer (cuda_kernels.cu), launched by device/cuda_device.cc.
//
// Thread-safety: launches are queued on the stream given; the caller orders them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace hvd {
namespace cuda {

// One copy of a batch.
struct CopySpanDev {
  const void* src;
  void* dst;
  uint64_t bytes;
};

// A batch travels as the kernel's parameter (no table to upload first): up to
// kMaxSpansPerLaunch spans, with the index of each span's first 16 KiB chunk (first_chunk[n] is
// the total). Kernel parameters may take 32 KiB since CUDA 12.1 on Volta and later.
constexpr int kMaxSpansPerLaunch = 1024;
constexpr size_t kCopyChunkBytes = 16 * 1024;
struct CopyBatch {
  CopySpanDev spans[kMaxSpansPerLaunch];
  uint32_t first_chunk[kMaxSpansPerLaunch + 1];
  int n;
};

// Copies every span of the batch with one kernel launch: a block per 16 KiB chunk (grid-stride),
// 16-byte words where the chunk's ends allow them.
cudaError_t LaunchBatchedCopy(const CopyBatch& batch, cudaStream_t stream);

// buf[i] *= factor with the CPU's rules (reduce/reduce.h): float32 in float64, float16 and
// bfloat16 in float32 rounded to nearest even, integers in float64 rounded to nearest and
// saturated, bool unchanged. `dtype` is a hvd::DataType value.
cudaError_t LaunchScale(void* buf, size_t count, int dtype, double factor, cudaStream_t stream);

}  // namespace cuda
}  // namespace hvd
