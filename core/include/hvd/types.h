// Element types, reduction operations and the non-owning tensor view handed to hvd.
//
// Thread-safety: plain values; the memory a TensorView points at belongs to the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hvd/export.h"

namespace hvd {

enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
  kInt16,
  kUInt16,
};
constexpr int kNumDataTypes = 11;

// Sum, Average (sum divided by the world size), Min, Max, Product. For bool, Sum and Max are
// logical or, Min and Product logical and; Average is refused.
// kAdasum: Horovod's adaptive summation (allreduce of float32/float64 only, on a power-of-two
// number of ranks; collectives/adasum.cc).
enum class ReduceOp : uint8_t { kSum = 0, kAverage, kMin, kMax, kProduct, kAdasum };
constexpr int kNumReduceOps = 6;

HVD_EXPORT size_t DataTypeSize(DataType t);
HVD_EXPORT const char* DataTypeName(DataType t);   // "float32", "bfloat16", ...
HVD_EXPORT const char* ReduceOpName(ReduceOp op);  // "sum", "average", ...
HVD_EXPORT bool ParseDataType(const std::string& s, DataType* out);
HVD_EXPORT bool ParseReduceOp(const std::string& s, ReduceOp* out);

constexpr int kCpuDevice = -1;

// A view of caller-owned, contiguous, row-major memory. hvd never frees `data`; the caller
// keeps it alive and unchanged until the operation's handle reports completion.
struct HVD_EXPORT TensorView {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;  // empty = scalar (one element)
  int device = kCpuDevice;     // kCpuDevice or a CUDA device ordinal
  // Device tensors: the CUDA stream (a cudaStream_t) whose work produces the data. hvd's work
  // on the tensor waits for what was queued on it when the operation was submitted, without
  // blocking the caller. nullptr: the legacy default stream.
  void* stream = nullptr;

  TensorView() = default;
  TensorView(void* d, DataType t, std::vector<int64_t> s, int dev = kCpuDevice)
      : data(d), dtype(t), shape(std::move(s)), device(dev) {}

  int64_t num_elements() const;
  size_t num_bytes() const { return static_cast<size_t>(num_elements()) * DataTypeSize(dtype); }
  std::string ShapeString() const;  // "[2, 3]"
};

HVD_EXPORT std::string ShapeToString(const std::vector<int64_t>& shape);
// Product of the dimensions (1 for a scalar's empty shape). Inline: the engine asks it of every
// tensor several times a step. Computed unsigned, so that a shape whose product does not fit
// (refused by the engine's checks, which may come later) wraps instead of being undefined.
inline int64_t NumElements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return static_cast<int64_t>(n);
}

}  // namespace hvd
