// CPU reduction kernels: ReduceInto, ReduceTo and Scale for every dtype, and the exported
// half/bfloat16 conversions.
//
// How a call runs:
//   1. One switch on the dtype and one on the op pick a typed kernel; no per-element switch.
//   2. Native types run one plain contiguous loop over __restrict pointers with a small functor,
//      which the compiler vectorises: dst op= b when the result goes to the first operand
//      (ReduceInto), dst = a op b otherwise. Signed integers wrap (the arithmetic is done
//      unsigned).
//   3. float16 / bfloat16 are handled in blocks of kBlock elements: both operands are widened to
//      float32 on the stack, combined with the float32 loop, and rounded back (nearest even).
//      float16 blocks use the F16C conversion instructions where the CPU has them (checked once
//      at run time), else the portable branch-free code of half_convert.h; both give the same
//      bits (NaN payloads aside).
//   4. Float Min/Max propagate NaN so that every rank ends with the same answer whatever order
//      the operands met in.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "reduce/half_convert.h"
#include "reduce/reduce.h"
#include "reduce/scale_rules.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace hvd {
namespace {

constexpr size_t kBlock = 256;

// ---- Block codecs for the 16-bit float types ----

using DecodeBlockFn = void (*)(const uint16_t* __restrict, float* __restrict, size_t);
using EncodeBlockFn = void (*)(const float* __restrict, uint16_t* __restrict, size_t);
struct Codec16 {
  DecodeBlockFn decode;
  EncodeBlockFn encode;
};

template <float (*Decode)(uint16_t)>
void DecodePortable(const uint16_t* __restrict src, float* __restrict dst, size_t m) {
  for (size_t i = 0; i < m; ++i) dst[i] = Decode(src[i]);
}
template <uint16_t (*Encode)(float)>
void EncodePortable(const float* __restrict src, uint16_t* __restrict dst, size_t m) {
  for (size_t i = 0; i < m; ++i) dst[i] = Encode(src[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void DecodeHalfF16C(const uint16_t* __restrict src,
                                                         float* __restrict dst, size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < m; ++i) dst[i] = detail::DecodeHalf(src[i]);
}
__attribute__((target("avx,f16c"))) void EncodeHalfF16C(const float* __restrict src,
                                                         uint16_t* __restrict dst, size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < m; ++i) dst[i] = detail::EncodeHalf(src[i]);
}
#endif

#if defined(__x86_64__)
// AVX with its register state enabled by the OS, and F16C (CPUID leaf 1, ECX bits 28, 27, 29).
// Read from CPUID directly: not every compiler's __builtin_cpu_supports knows "f16c".
bool CpuHasF16C() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool avx = (c >> 28) & 1, osxsave = (c >> 27) & 1, f16c = (c >> 29) & 1;
  if (!avx || !osxsave || !f16c) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6) == 0x6;  // the OS saves the XMM and YMM registers
}
#endif

Codec16 HalfCodec() {
#if defined(__x86_64__)
  static const bool has_f16c = CpuHasF16C();
  if (has_f16c) return {DecodeHalfF16C, EncodeHalfF16C};
#endif
  return {DecodePortable<detail::DecodeHalf>, EncodePortable<detail::EncodeHalf>};
}

Codec16 BFloat16Codec() {
  return {DecodePortable<detail::DecodeBFloat16>, EncodePortable<detail::EncodeBFloat16>};
}

// ---- Combining functors ----

struct SumOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      // Unsigned arithmetic at least as wide as unsigned int: it wraps instead of overflowing
      // (narrower operands would promote to int).
      using W = std::common_type_t<std::make_unsigned_t<T>, unsigned>;
      return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
    } else {
      return a + b;
    }
  }
};

struct ProductOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      // As SumOp: uint16 operands would promote to int, and 65535 * 65535 overflows it.
      using W = std::common_type_t<std::make_unsigned_t<T>, unsigned>;
      return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
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
void Combine3(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) dst[i] = op(a[i], b[i]);
}

// dst = a op b; `a` is dst itself or does not overlap it.
template <typename T, typename Op>
void CombineTyped(void* dst, const void* a, const void* b, size_t n, Op op) {
  if (dst == a) {
    Combine(static_cast<T*>(dst), static_cast<const T*>(b), n, op);
  } else {
    Combine3(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n, op);
  }
}

// Calls f with the combining functor of `op`.
template <typename F>
void WithOp(ReduceOp op, F f) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
    case ReduceOp::kAdasum:  // not elementwise: the engine runs AdasumAllreduce, never this
      f(SumOp());
      return;
    case ReduceOp::kMin: f(MinOp()); return;
    case ReduceOp::kMax: f(MaxOp()); return;
    case ReduceOp::kProduct: f(ProductOp()); return;
  }
}

template <typename T>
void ReduceNative(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  WithOp(op, [&](auto f) { CombineTyped<T>(dst, a, b, n, f); });
}

void ReduceBool(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMin || op == ReduceOp::kProduct) {
    CombineTyped<uint8_t>(dst, a, b, n, AndOp());
  } else {
    CombineTyped<uint8_t>(dst, a, b, n, OrOp());
  }
}

// Widen, combine in float32, narrow: kBlock elements at a time (a block of `a` is read before
// the same block of dst is written, so dst may be `a`).
template <typename Op>
void Combine16(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n, Codec16 codec,
               Op op) {
  alignas(64) float x[kBlock];
  alignas(64) float y[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    codec.decode(a + base, x, m);
    codec.decode(b + base, y, m);
    Combine(x, y, m, op);
    codec.encode(x, dst + base, m);
  }
}

void Reduce16(void* dst, const void* a, const void* b, size_t n, ReduceOp op, Codec16 codec) {
  WithOp(op, [&](auto f) {
    Combine16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
              static_cast<const uint16_t*>(b), n, codec, f);
  });
}

// dst = a op b for every dtype (ReduceTo's contract).
void Reduce(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  switch (dtype) {
    case DataType::kUInt8: ReduceNative<uint8_t>(dst, a, b, count, op); return;
    case DataType::kInt8: ReduceNative<int8_t>(dst, a, b, count, op); return;
    case DataType::kInt16: ReduceNative<int16_t>(dst, a, b, count, op); return;
    case DataType::kUInt16: ReduceNative<uint16_t>(dst, a, b, count, op); return;
    case DataType::kInt32: ReduceNative<int32_t>(dst, a, b, count, op); return;
    case DataType::kInt64: ReduceNative<int64_t>(dst, a, b, count, op); return;
    case DataType::kFloat32: ReduceNative<float>(dst, a, b, count, op); return;
    case DataType::kFloat64: ReduceNative<double>(dst, a, b, count, op); return;
    case DataType::kBool: ReduceBool(dst, a, b, count, op); return;
    case DataType::kFloat16: Reduce16(dst, a, b, count, op, HalfCodec()); return;
    case DataType::kBFloat16: Reduce16(dst, a, b, count, op, BFloat16Codec()); return;
  }
}

// Integers: Horovod's rule (reduce/scale_rules.h): in float64, truncated toward zero.
template <typename T>
void ScaleInteger(T* __restrict p, size_t n, double factor) {
  for (size_t i = 0; i < n; ++i) p[i] = ScaleIntegerValue(p[i], factor);
}

// float32 in float32 with the factor rounded to float32, as Horovod scales it.
void ScaleFloat(float* __restrict p, size_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (size_t i = 0; i < n; ++i) p[i] *= f;
}

void ScaleDouble(double* __restrict p, size_t n, double factor) {
  for (size_t i = 0; i < n; ++i) p[i] *= factor;
}

void Scale16(void* buf, size_t n, double factor, Codec16 codec) {
  auto* p = static_cast<uint16_t*>(buf);
  const float f = static_cast<float>(factor);
  alignas(64) float a[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    codec.decode(p + base, a, m);
    for (size_t i = 0; i < m; ++i) a[i] *= f;
    codec.encode(a, p + base, m);
  }
}

}  // namespace

void ReduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  Reduce(dst, dst, src, count, dtype, op);
}

void ReduceTo(void* dst, const void* a, const void* b, size_t count, DataType dtype,
              ReduceOp op) {
  Reduce(dst, a, b, count, dtype, op);
}

void Scale(void* buf, size_t count, DataType dtype, double factor) {
  if (factor == 1.0 || count == 0) return;
  switch (dtype) {
    case DataType::kUInt8: ScaleInteger(static_cast<uint8_t*>(buf), count, factor); return;
    case DataType::kInt8: ScaleInteger(static_cast<int8_t*>(buf), count, factor); return;
    case DataType::kInt16: ScaleInteger(static_cast<int16_t*>(buf), count, factor); return;
    case DataType::kUInt16: ScaleInteger(static_cast<uint16_t*>(buf), count, factor); return;
    case DataType::kInt32: ScaleInteger(static_cast<int32_t*>(buf), count, factor); return;
    case DataType::kInt64: ScaleInteger(static_cast<int64_t*>(buf), count, factor); return;
    case DataType::kFloat32: ScaleFloat(static_cast<float*>(buf), count, factor); return;
    case DataType::kFloat64: ScaleDouble(static_cast<double*>(buf), count, factor); return;
    case DataType::kFloat16: Scale16(buf, count, factor, HalfCodec()); return;
    case DataType::kBFloat16: Scale16(buf, count, factor, BFloat16Codec()); return;
    case DataType::kBool: return;  // scaling a truth value is meaningless; left unchanged
  }
}

float HalfToFloat(uint16_t h) { return detail::DecodeHalf(h); }
uint16_t FloatToHalf(float f) { return detail::EncodeHalf(f); }
float BFloat16ToFloat(uint16_t b) { return detail::DecodeBFloat16(b); }
uint16_t FloatToBFloat16(float f) { return detail::EncodeBFloat16(f); }

}  // namespace hvd
