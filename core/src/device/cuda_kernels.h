// The CUDA kernels of the device layer (cuda_kernels.cu), launched by device/cuda_device.cc.
//
// Thread-safety: launches are queued on the stream given; the caller orders them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace hvd {
namespace cuda {

// One piece of a batched copy, at most kCopyChunkBytes long.
struct CopyChunk {
  const void* src;
  void* dst;
  uint64_t bytes;
};
constexpr size_t kCopyChunkBytes = 32 * 1024;

// Copies every chunk with one kernel launch: a block per chunk (grid-stride), 16-byte words
// where the chunk's ends allow them. `chunks` is read by the device where it lies: mapped
// pinned host memory serves, so the table needs no upload of its own before the launch.
cudaError_t LaunchBatchedCopy(const CopyChunk* chunks, uint32_t n, cudaStream_t stream);

// buf[i] *= factor with the CPU's rules (reduce/reduce.h): float32 in float64, float16 and
// bfloat16 in float32 rounded to nearest even, integers in float64 rounded to nearest and
// saturated, bool unchanged. `dtype` is a hvd::DataType value.
cudaError_t LaunchScale(void* buf, size_t count, int dtype, double factor, cudaStream_t stream);

}  // namespace cuda
}  // namespace hvd
