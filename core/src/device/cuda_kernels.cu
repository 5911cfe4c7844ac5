// CUDA kernels: the batched copy that packs and unpacks device fusion buffers, and scaling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "device/cuda_kernels.h"
#include "hvd/types.h"
#include "reduce/scale_rules.h"

namespace hvd {
namespace cuda {

namespace {

constexpr int kCopyThreads = 256;
constexpr uint32_t kMaxCopyBlocks = 16384;
constexpr int kUnroll = static_cast<int>(kCopyChunkBytes / (kCopyThreads * 16));  // 8

// One block per chunk (grid-stride over the chunks): an aligned chunk is one round of up to
// kUnroll 16-byte loads per thread, all in flight before the stores.
__global__ void BatchedCopyKernel(const CopyChunk* __restrict__ chunks, uint32_t n) {
  for (uint32_t c = blockIdx.x; c < n; c += gridDim.x) {
    const CopyChunk k = chunks[c];
    const auto* s = static_cast<const unsigned char*>(k.src);
    auto* d = static_cast<unsigned char*>(k.dst);
    const size_t bytes = k.bytes;
    size_t done = 0;
    if (((reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d)) & 15) == 0) {
      // A chunk is at most one round: every thread's loads are in flight before its stores,
      // for partial chunks (a tensor's last) as for full ones.
      const auto* s4 = reinterpret_cast<const uint4*>(s);
      auto* d4 = reinterpret_cast<uint4*>(d);
      const uint32_t words = static_cast<uint32_t>(bytes / 16);
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t i = threadIdx.x + u * kCopyThreads;
        if (i < words) v[u] = s4[i];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t i = threadIdx.x + u * kCopyThreads;
        if (i < words) d4[i] = v[u];
      }
      done = static_cast<size_t>(words) * 16;
    }
    for (size_t i = done + threadIdx.x; i < bytes; i += kCopyThreads) d[i] = s[i];
  }
}

template <typename T>
__global__ void ScaleIntegerKernel(T* p, size_t n, double factor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = ScaleIntegerValue(p[i], factor);
  }
}

__global__ void ScaleFloatKernel(float* p, size_t n, float factor) {  // as the CPU's
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] *= factor;
  }
}

__global__ void ScaleDoubleKernel(double* p, size_t n, double factor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] *= factor;
  }
}

// As Horovod's on the GPU: the factor rounded to float (as Horovod passes it) and then to
// float16, times the value, rounded once (the product of two float16 values is exact in float32,
// so this is __hmul). The CPU's rule, float32 arithmetic with a float32 factor, differs in the
// last place for some values.
__global__ void ScaleHalfKernel(__half* p, size_t n, float factor) {
  const float f = __half2float(__float2half_rn(factor));
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = __float2half_rn(__half2float(p[i]) * f);
  }
}

__global__ void ScaleBFloat16Kernel(__nv_bfloat16* p, size_t n, float factor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16_rn(__bfloat162float(p[i]) * factor);
  }
}

unsigned int ScaleBlocks(size_t n) {
  const size_t blocks = (n + 255) / 256;
  return static_cast<unsigned int>(blocks < 4096 ? blocks : 4096);
}

template <typename T>
void ScaleInteger(void* buf, size_t n, double factor, cudaStream_t s) {
  ScaleIntegerKernel<T><<<ScaleBlocks(n), 256, 0, s>>>(static_cast<T*>(buf), n, factor);
}

}  // namespace

cudaError_t LaunchBatchedCopy(const CopyChunk* chunks, uint32_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const uint32_t blocks = n < kMaxCopyBlocks ? n : kMaxCopyBlocks;
  BatchedCopyKernel<<<blocks, kCopyThreads, 0, stream>>>(chunks, n);
  return cudaGetLastError();
}

cudaError_t LaunchScale(void* buf, size_t n, int dtype, double factor, cudaStream_t s) {
  if (factor == 1.0 || n == 0) return cudaSuccess;
  switch (static_cast<DataType>(dtype)) {
    case DataType::kUInt8: ScaleInteger<uint8_t>(buf, n, factor, s); break;
    case DataType::kInt8: ScaleInteger<int8_t>(buf, n, factor, s); break;
    case DataType::kInt16: ScaleInteger<int16_t>(buf, n, factor, s); break;
    case DataType::kUInt16: ScaleInteger<uint16_t>(buf, n, factor, s); break;
    case DataType::kInt32: ScaleInteger<int32_t>(buf, n, factor, s); break;
    case DataType::kInt64: ScaleInteger<int64_t>(buf, n, factor, s); break;
    case DataType::kFloat32:
      ScaleFloatKernel<<<ScaleBlocks(n), 256, 0, s>>>(static_cast<float*>(buf), n, static_cast<float>(factor));
      break;
    case DataType::kFloat64:
      ScaleDoubleKernel<<<ScaleBlocks(n), 256, 0, s>>>(static_cast<double*>(buf), n, factor);
      break;
    case DataType::kFloat16:
      ScaleHalfKernel<<<ScaleBlocks(n), 256, 0, s>>>(static_cast<__half*>(buf), n,
                                                     static_cast<float>(factor));
      break;
    case DataType::kBFloat16:
      ScaleBFloat16Kernel<<<ScaleBlocks(n), 256, 0, s>>>(static_cast<__nv_bfloat16*>(buf), n,
                                                         static_cast<float>(factor));
      break;
    case DataType::kBool:
      return cudaSuccess;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace hvd
