// CPU reduction kernels: ReduceInto and Scale for every dtype, and the exported half/bfloat16
// conversions.
//
// How a call runs:
//   1. One switch on the dtype and one on the op pick a typed kernel; no per-element switch.
//   2. Native types run one plain contiguous loop over __restrict pointers with a small functor,
//      which the compiler vectorises. Signed integers wrap (the arithmetic is done unsigned).
//   3. float16 / bfloat16 are handled in blocks of kBlock elements: both operands are widened to
//      float32 on the stack, combined with the float32 loop, and rounded back (nearest even).
//   4. Float Min/Max propagate NaN so that every rank ends with the same answer whatever order
//      the operands met in.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "reduce/half_convert.h"
#include "reduce/reduce.h"

namespace hvd {
namespace {

constexpr size_t kBlock = 256;

struct SumOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};

struct ProductOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      // uint8 operands promote to int; their product (< 2^16) cannot overflow it.
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};

struct MinOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) return ((b < a) | (b != b)) ? b : a;
    else return b < a ? b : a;
  }
};

struct MaxOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) return ((b > a) | (b != b)) ? b : a;
    else return b > a ? b : a;
  }
};

// Bool is one byte; any non-zero byte is true and results are 0 or 1.
struct OrOp {
  uint8_t operator()(uint8_t a, uint8_t b) const { return static_cast<uint8_t>((a | b) != 0); }
};
struct AndOp {
  uint8_t operator()(uint8_t a, uint8_t b) const {
    return static_cast<uint8_t>((a != 0) & (b != 0));
  }
};

template <typename T, typename Op>
void Combine(T* __restrict dst, const T* __restrict src, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) dst[i] = op(dst[i], src[i]);
}

template <typename T, typename Op>
void CombineTyped(void* dst, const void* src, size_t n, Op op) {
  Combine(static_cast<T*>(dst), static_cast<const T*>(src), n, op);
}

template <typename T>
void ReduceNative(void* dst, const void* src, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: CombineTyped<T>(dst, src, n, SumOp()); return;
    case ReduceOp::kMin: CombineTyped<T>(dst, src, n, MinOp()); return;
    case ReduceOp::kMax: CombineTyped<T>(dst, src, n, MaxOp()); return;
    case ReduceOp::kProduct: CombineTyped<T>(dst, src, n, ProductOp()); return;
  }
}

void ReduceBool(void* dst, const void* src, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMin || op == ReduceOp::kProduct) {
    CombineTyped<uint8_t>(dst, src, n, AndOp());
  } else {
    CombineTyped<uint8_t>(dst, src, n, OrOp());
  }
}

// Widen, combine in float32, narrow: kBlock elements at a time.
template <float (*Decode)(uint16_t), uint16_t (*Encode)(float), typename Op>
void Combine16(uint16_t* __restrict dst, const uint16_t* __restrict src, size_t n, Op op) {
  alignas(64) float a[kBlock];
  alignas(64) float b[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) a[i] = Decode(dst[base + i]);
    for (size_t i = 0; i < m; ++i) b[i] = Decode(src[base + i]);
    Combine(a, b, m, op);
    for (size_t i = 0; i < m; ++i) dst[base + i] = Encode(a[i]);
  }
}

template <float (*Decode)(uint16_t), uint16_t (*Encode)(float)>
void Reduce16(void* dst_v, const void* src_v, size_t n, ReduceOp op) {
  auto* dst = static_cast<uint16_t*>(dst_v);
  const auto* src = static_cast<const uint16_t*>(src_v);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: Combine16<Decode, Encode>(dst, src, n, SumOp()); return;
    case ReduceOp::kMin: Combine16<Decode, Encode>(dst, src, n, MinOp()); return;
    case ReduceOp::kMax: Combine16<Decode, Encode>(dst, src, n, MaxOp()); return;
    case ReduceOp::kProduct: Combine16<Decode, Encode>(dst, src, n, ProductOp()); return;
  }
}

// Integers: multiply in float64, round to nearest (ties to even), saturate to the type's range.
template <typename T>
void ScaleInteger(T* __restrict p, size_t n, double factor) {
  const double lo = static_cast<double>(std::numeric_limits<T>::min());
  // max + 1 (2^digits) is exact in float64 even for int64, unlike max itself.
  const double above = std::ldexp(1.0, std::numeric_limits<T>::digits);
  for (size_t i = 0; i < n; ++i) {
    const double v = std::nearbyint(static_cast<double>(p[i]) * factor);
    T out;
    if (v != v) out = 0;
    else if (v <= lo) out = std::numeric_limits<T>::min();
    else if (v >= above) out = std::numeric_limits<T>::max();
    else out = static_cast<T>(v);
    p[i] = out;
  }
}

void ScaleFloat(float* __restrict p, size_t n, double factor) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(static_cast<double>(p[i]) * factor);
}

void ScaleDouble(double* __restrict p, size_t n, double factor) {
  for (size_t i = 0; i < n; ++i) p[i] *= factor;
}

template <float (*Decode)(uint16_t), uint16_t (*Encode)(float)>
void Scale16(uint16_t* __restrict p, size_t n, double factor) {
  const float f = static_cast<float>(factor);
  alignas(64) float a[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) a[i] = Decode(p[base + i]) * f;
    for (size_t i = 0; i < m; ++i) p[base + i] = Encode(a[i]);
  }
}

}  // namespace

void ReduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  switch (dtype) {
    case DataType::kUInt8: ReduceNative<uint8_t>(dst, src, count, op); return;
    case DataType::kInt8: ReduceNative<int8_t>(dst, src, count, op); return;
    case DataType::kInt32: ReduceNative<int32_t>(dst, src, count, op); return;
    case DataType::kInt64: ReduceNative<int64_t>(dst, src, count, op); return;
    case DataType::kFloat32: ReduceNative<float>(dst, src, count, op); return;
    case DataType::kFloat64: ReduceNative<double>(dst, src, count, op); return;
    case DataType::kBool: ReduceBool(dst, src, count, op); return;
    case DataType::kFloat16:
      Reduce16<detail::DecodeHalf, detail::EncodeHalf>(dst, src, count, op);
      return;
    case DataType::kBFloat16:
      Reduce16<detail::DecodeBFloat16, detail::EncodeBFloat16>(dst, src, count, op);
      return;
  }
}

void Scale(void* buf, size_t count, DataType dtype, double factor) {
  if (factor == 1.0 || count == 0) return;
  switch (dtype) {
    case DataType::kUInt8: ScaleInteger(static_cast<uint8_t*>(buf), count, factor); return;
    case DataType::kInt8: ScaleInteger(static_cast<int8_t*>(buf), count, factor); return;
    case DataType::kInt32: ScaleInteger(static_cast<int32_t*>(buf), count, factor); return;
    case DataType::kInt64: ScaleInteger(static_cast<int64_t*>(buf), count, factor); return;
    case DataType::kFloat32: ScaleFloat(static_cast<float*>(buf), count, factor); return;
    case DataType::kFloat64: ScaleDouble(static_cast<double*>(buf), count, factor); return;
    case DataType::kFloat16:
      Scale16<detail::DecodeHalf, detail::EncodeHalf>(static_cast<uint16_t*>(buf), count, factor);
      return;
    case DataType::kBFloat16:
      Scale16<detail::DecodeBFloat16, detail::EncodeBFloat16>(static_cast<uint16_t*>(buf), count,
                                                              factor);
      return;
    case DataType::kBool: return;  // scaling a truth value is meaningless; left unchanged
  }
}

float HalfToFloat(uint16_t h) { return detail::DecodeHalf(h); }
uint16_t FloatToHalf(float f) { return detail::EncodeHalf(f); }
float BFloat16ToFloat(uint16_t b) { return detail::DecodeBFloat16(b); }
uint16_t FloatToBFloat16(float f) { return detail::EncodeBFloat16(f); }

}  // namespace hvd
