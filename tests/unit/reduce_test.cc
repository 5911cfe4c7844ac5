// Reduction kernels and float16/bfloat16 conversions against references written from the
// formats' definitions (float64 arithmetic, frexp/ldexp, nearbyint), never against the kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "reduce/reduce.h"

namespace hvd {
namespace {

// ---- Reference codecs: the IEEE layouts written out. ----

double RefDecode(uint16_t bits, int mant_bits, int bias) {
  const int exp_max = (1 << (15 - mant_bits)) - 1;
  const int e = (bits >> mant_bits) & exp_max;
  const int m = bits & ((1 << mant_bits) - 1);
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  if (e == exp_max) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mant_bits);
  return sign * std::ldexp((1 << mant_bits) + m, e - bias - mant_bits);
}
double RefDecodeHalf(uint16_t h) { return RefDecode(h, 10, 15); }
double RefDecodeBF16(uint16_t b) { return RefDecode(b, 7, 127); }

// Rounds x to nearest even; returns a NaN pattern for NaN.
uint16_t RefEncode(double x, int mant_bits, int bias) {
  const int exp_max = (1 << (15 - mant_bits)) - 1;
  if (std::isnan(x)) return static_cast<uint16_t>((exp_max << mant_bits) | (1 << (mant_bits - 1)));
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  // Halfway between the largest finite value and 2^(emax+1): ties to even go up to infinity.
  const double overflow = std::ldexp(2.0 - std::ldexp(1.0, -mant_bits - 1), exp_max - 1 - bias);
  if (a >= overflow) return static_cast<uint16_t>(sign | (exp_max << mant_bits));
  if (a < std::ldexp(1.0, 1 - bias)) {  // subnormal: multiples of 2^(1-bias-mant_bits)
    return static_cast<uint16_t>(sign | static_cast<int>(std::nearbyint(
                                            std::ldexp(a, bias - 1 + mant_bits))));
  }
  int e2;
  std::frexp(a, &e2);
  const int e = e2 - 1;  // a in [2^e, 2^(e+1))
  const int q = static_cast<int>(std::nearbyint(std::ldexp(a, mant_bits - e)));  // [2^m, 2^(m+1)]
  return static_cast<uint16_t>(sign | (((e + bias) << mant_bits) + q - (1 << mant_bits)));
}
uint16_t RefEncodeHalf(double x) { return RefEncode(x, 10, 15); }
uint16_t RefEncodeBF16(double x) { return RefEncode(x, 7, 127); }

bool IsNanHalf(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0; }
bool IsNanBF16(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0; }

float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- Conversions ----

TEST(HalfConversion, DecodesEveryPatternLikeTheFormula) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double ref = RefDecodeHalf(static_cast<uint16_t>(h));
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got)) << "pattern " << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), ref) << "pattern " << h;
      ASSERT_EQ(std::signbit(got), std::signbit(ref)) << "pattern " << h;
    }
  }
}

TEST(HalfConversion, EveryPatternRoundTripsAndNanStaysNan) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = FloatToHalf(HalfToFloat(static_cast<uint16_t>(h)));
    if (IsNanHalf(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(IsNanHalf(back)) << "pattern " << h;
    } else {
      ASSERT_EQ(back, h) << "pattern " << h;
    }
  }
}

TEST(BFloat16Conversion, DecodesEveryPatternAndRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const double ref = RefDecodeBF16(bits);
    const float got = BFloat16ToFloat(bits);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got)) << "pattern " << b;
      ASSERT_TRUE(IsNanBF16(FloatToBFloat16(got))) << "pattern " << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), ref) << "pattern " << b;
      ASSERT_EQ(FloatToBFloat16(got), bits) << "pattern " << b;
    }
  }
}

// Midpoints between neighbours go to the one with an even last bit; just off the midpoint goes
// to the nearer one.
template <typename Decode, typename Encode>
void CheckTies(uint16_t largest_finite, Decode decode, Encode encode) {
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t m = 0; m < largest_finite; ++m) {
      const auto lo = static_cast<uint16_t>(sign | m);
      const auto hi = static_cast<uint16_t>(sign | (m + 1));
      const double mid = (decode(lo) + decode(hi)) / 2;  // exact in float
      const uint16_t even = (lo & 1) ? hi : lo;
      ASSERT_EQ(encode(static_cast<float>(mid)), even) << "between " << lo << " and " << hi;
      const float below = std::nextafter(static_cast<float>(mid), 0.0f);
      const float above = std::nextafter(static_cast<float>(mid), sign ? -INFINITY : INFINITY);
      ASSERT_EQ(encode(below), lo) << "just inside " << lo;
      ASSERT_EQ(encode(above), hi) << "just inside " << hi;
    }
  }
}

TEST(HalfConversion, RoundsTiesToEven) {
  CheckTies(0x7BFF, RefDecodeHalf, FloatToHalf);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // tie between 65504 and 2^16: infinity
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // half of the smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(BFloat16Conversion, RoundsTiesToEven) {
  CheckTies(0x7F7F, RefDecodeBF16, FloatToBFloat16);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);
}

TEST(Conversion, SweepOfFloatsMatchesTheReferenceEncoder) {
  // Every 4099th float bit pattern across the whole range, then a denser sweep of the half range.
  auto check = [](uint32_t u) {
    const float f = FloatFromBits(u);
    const uint16_t h = FloatToHalf(f);
    const uint16_t b = FloatToBFloat16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(IsNanHalf(h)) << u;
      ASSERT_TRUE(IsNanBF16(b)) << u;
      ASSERT_EQ(h & 0x8000, (u >> 16) & 0x8000) << "NaN sign " << u;
    } else {
      ASSERT_EQ(h, RefEncodeHalf(f)) << "float bits " << u;
      ASSERT_EQ(b, RefEncodeBF16(f)) << "float bits " << u;
    }
  };
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) check(static_cast<uint32_t>(u));
  for (uint32_t u = 0x32800000u; u < 0x47800000u; u += 127) {
    check(u);
    check(u | 0x80000000u);
  }
}

// ---- ReduceInto and ReduceTo ----

// ReduceInto(dst, src) and ReduceTo(out, a, b) with copies of the same operands, both against
// `want`; ReduceTo leaves its operands alone. (dst and src are the operands.)
template <typename T>
void CheckBothForms(const std::vector<T>& dst, const std::vector<T>& src, const std::vector<T>& want,
                    DataType dtype, ReduceOp op) {
  std::vector<T> into = dst, a = dst, b = src, out(dst.size(), T{});
  ReduceInto(into.data(), src.data(), into.size(), dtype, op);
  ReduceTo(out.data(), a.data(), b.data(), out.size(), dtype, op);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(into[i], want[i]) << "ReduceInto " << DataTypeName(dtype) << " " << ReduceOpName(op)
                                << " at " << i;
    ASSERT_EQ(out[i], want[i]) << "ReduceTo " << DataTypeName(dtype) << " " << ReduceOpName(op)
                               << " at " << i;
  }
  EXPECT_EQ(a, dst) << "ReduceTo changed its first operand";
  EXPECT_EQ(b, src) << "ReduceTo changed its second operand";
}

// Values for element i: exact in every float format, with sums and products exact in float32
// (so widening to float32 and rounding once is the correctly rounded result) and within range.
double FloatInput(int i, int which) {
  const int mant = (i * 37 + which * 11) % 128;  // 7 mantissa bits: fits bfloat16 and float16
  const int exp = (i * 5 + which * 3) % 9 - 4;   // 2^-4 .. 2^4
  const double sign = ((i + which) % 3 == 0) ? -1.0 : 1.0;
  return sign * std::ldexp(128 + mant, exp - 7);
}

double RefOp(double a, double b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAverage: return a + b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kAdasum: break;  // not elementwise: collectives_test's Adasum tests
  }
  return 0;
}

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kProduct};
constexpr size_t kN = 1003;  // several 256-element blocks and a tail

template <typename T, typename ToBits>
void CheckFloatType(DataType dtype, ToBits to_bits) {
  for (ReduceOp op : kOps) {
    std::vector<T> dst(kN), src(kN), want(kN);
    for (size_t i = 0; i < kN; ++i) {
      const double a = FloatInput(static_cast<int>(i), 0), b = FloatInput(static_cast<int>(i), 1);
      dst[i] = to_bits(a);
      src[i] = to_bits(b);
      want[i] = to_bits(RefOp(a, b, op));
    }
    CheckBothForms(dst, src, want, dtype, op);
  }
}

TEST(ReduceInto, FloatTypesMatchFloat64Reference) {
  CheckFloatType<uint16_t>(DataType::kFloat16, RefEncodeHalf);
  CheckFloatType<uint16_t>(DataType::kBFloat16, RefEncodeBF16);
  CheckFloatType<float>(DataType::kFloat32, [](double x) { return static_cast<float>(x); });
  CheckFloatType<double>(DataType::kFloat64, [](double x) { return x; });
}

template <typename T>
void CheckIntegerType(DataType dtype) {
  using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
  for (ReduceOp op : kOps) {
    std::vector<T> dst(kN), src(kN), want(kN);
    for (size_t i = 0; i < kN; ++i) {
      // Operands spread over the whole range so that sums and products wrap.
      const Wide a = static_cast<Wide>(static_cast<T>(i * 2654435761u + 12345));
      const Wide b = static_cast<Wide>(static_cast<T>(i * 40503u + 977));
      dst[i] = static_cast<T>(a);
      src[i] = static_cast<T>(b);
      uint64_t r = 0;  // wrapped result, computed modulo 2^64 then truncated
      switch (op) {
        case ReduceOp::kSum: case ReduceOp::kAverage: r = uint64_t(a) + uint64_t(b); break;
        case ReduceOp::kMin: r = uint64_t(a < b ? a : b); break;
        case ReduceOp::kMax: r = uint64_t(a > b ? a : b); break;
        case ReduceOp::kProduct: r = uint64_t(a) * uint64_t(b); break;
        case ReduceOp::kAdasum: break;  // not elementwise
      }
      want[i] = static_cast<T>(r);
    }
    CheckBothForms(dst, src, want, dtype, op);
  }
}

TEST(ReduceInto, IntegersWrapAndCompareLikeTheirType) {
  CheckIntegerType<uint8_t>(DataType::kUInt8);
  CheckIntegerType<int8_t>(DataType::kInt8);
  CheckIntegerType<int16_t>(DataType::kInt16);
  CheckIntegerType<uint16_t>(DataType::kUInt16);
  CheckIntegerType<int32_t>(DataType::kInt32);
  CheckIntegerType<int64_t>(DataType::kInt64);
}

TEST(ReduceInto, BoolIsOrForSumAndMaxAndForMinAndProduct) {
  for (ReduceOp op : kOps) {
    const bool is_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
    std::vector<uint8_t> dst(kN), src(kN), want(kN);
    for (size_t i = 0; i < kN; ++i) {
      dst[i] = static_cast<uint8_t>(i % 3);  // 2 is a non-canonical true
      src[i] = static_cast<uint8_t>((i / 3) % 2);
      const bool a = (i % 3) != 0, b = ((i / 3) % 2) != 0;
      want[i] = (is_and ? (a && b) : (a || b)) ? 1 : 0;
    }
    CheckBothForms(dst, src, want, DataType::kBool, op);
  }
}

TEST(ReduceInto, MinAndMaxPropagateNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    float d32[4] = {nan, 1.0f, nan, 2.0f}, s32[4] = {1.0f, nan, nan, 3.0f};
    ReduceInto(d32, s32, 4, DataType::kFloat32, op);
    EXPECT_TRUE(std::isnan(d32[0]) && std::isnan(d32[1]) && std::isnan(d32[2]));
    EXPECT_EQ(d32[3], op == ReduceOp::kMin ? 2.0f : 3.0f);
    double d64[2] = {NAN, 1.0}, s64[2] = {1.0, NAN};
    ReduceInto(d64, s64, 2, DataType::kFloat64, op);
    EXPECT_TRUE(std::isnan(d64[0]) && std::isnan(d64[1]));
    uint16_t dh[2] = {0x7E00, 0x3C00}, sh[2] = {0x3C00, 0x7E01};
    ReduceInto(dh, sh, 2, DataType::kFloat16, op);
    EXPECT_TRUE(IsNanHalf(dh[0]) && IsNanHalf(dh[1]));
    // ReduceTo keeps the operand order of ReduceInto (first operand = the accumulated one).
    float a32[4] = {nan, 1.0f, nan, 2.0f}, o32[4] = {0, 0, 0, 0};
    ReduceTo(o32, a32, s32, 4, DataType::kFloat32, op);
    EXPECT_TRUE(std::isnan(o32[0]) && std::isnan(o32[1]) && std::isnan(o32[2]));
    EXPECT_EQ(o32[3], op == ReduceOp::kMin ? 2.0f : 3.0f);
  }
}

TEST(ReduceInto, InfinitiesCombineByIeeeRules) {
  uint16_t d[3] = {0x7C00, 0x7C00, 0x3C00}, s[3] = {0xFC00, 0x7C00, 0x7BFF};  // +inf, -inf, 1
  ReduceInto(d, s, 3, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_TRUE(IsNanHalf(d[0]));  // inf + -inf
  EXPECT_EQ(d[1], 0x7C00);
  EXPECT_EQ(d[2], 0x7BFF);  // 65504 + 1 rounds back to 65504
}

// ---- Scale ----

TEST(Scale, FloatsMatchFloat64Reference) {
  for (double factor : {0.5, 0.75, 3.0, -0.25, 1.0 / 3.0}) {
    std::vector<float> f32(kN);
    std::vector<double> f64(kN);
    for (size_t i = 0; i < kN; ++i) f32[i] = static_cast<float>(f64[i] = FloatInput(int(i), 2));
    Scale(f32.data(), kN, DataType::kFloat32, factor);
    Scale(f64.data(), kN, DataType::kFloat64, factor);
    for (size_t i = 0; i < kN; ++i) {
      const double x = FloatInput(int(i), 2);
      // float32 as Horovod scales it: in float32, by the factor rounded to float32.
      ASSERT_EQ(f32[i], static_cast<float>(x) * static_cast<float>(factor)) << factor << " at " << i;
      ASSERT_EQ(f64[i], x * factor) << factor << " at " << i;
    }
  }
  // float16/bfloat16 with factors whose products are exact in float32: one rounding.
  for (double factor : {0.5, 0.75, 3.0, -0.25}) {
    std::vector<uint16_t> h(kN), b(kN);
    for (size_t i = 0; i < kN; ++i) {
      h[i] = RefEncodeHalf(FloatInput(int(i), 3));
      b[i] = RefEncodeBF16(FloatInput(int(i), 3));
    }
    Scale(h.data(), kN, DataType::kFloat16, factor);
    Scale(b.data(), kN, DataType::kBFloat16, factor);
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(h[i], RefEncodeHalf(FloatInput(int(i), 3) * factor)) << factor << " at " << i;
      ASSERT_EQ(b[i], RefEncodeBF16(FloatInput(int(i), 3) * factor)) << factor << " at " << i;
    }
  }
}

// Horovod's rule: the product in float64, the fraction truncated toward zero (an integer
// Average of 7 over 2 ranks is 3, of -7 is -3); saturated where Horovod's cast is undefined.
TEST(Scale, IntegersTruncateTowardZeroAndSaturate) {
  int32_t i32[6] = {3, 5, -3, -5, 7, 1 << 30};
  Scale(i32, 6, DataType::kInt32, 0.5);  // 1.5 2.5 -1.5 -2.5 3.5 2^29
  const int32_t want32[6] = {1, 2, -1, -2, 3, 1 << 29};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(i32[i], want32[i]) << i;
  int8_t i8[3] = {100, -100, 7};
  Scale(i8, 3, DataType::kInt8, 2.0);
  EXPECT_EQ(i8[0], 127);
  EXPECT_EQ(i8[1], -128);
  EXPECT_EQ(i8[2], 14);
  int16_t i16[3] = {20000, -20000, 7};
  Scale(i16, 3, DataType::kInt16, 2.0);
  EXPECT_EQ(i16[0], 32767);
  EXPECT_EQ(i16[1], -32768);
  EXPECT_EQ(i16[2], 14);
  uint16_t u16[2] = {40000, 5};
  Scale(u16, 2, DataType::kUInt16, 1.5);
  EXPECT_EQ(u16[0], 60000);
  EXPECT_EQ(u16[1], 7);  // 7.5 truncated
  uint8_t u8[2] = {200, 3};
  Scale(u8, 1, DataType::kUInt8, -1.0);
  EXPECT_EQ(u8[0], 0);
  Scale(u8 + 1, 1, DataType::kUInt8, 100.0);
  EXPECT_EQ(u8[1], 255);
  int64_t i64[2] = {std::numeric_limits<int64_t>::max(), 9};
  Scale(i64, 2, DataType::kInt64, 4.0);
  EXPECT_EQ(i64[0], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(i64[1], 36);
}

TEST(Scale, FactorOneAndBoolLeaveDataAlone) {
  float f[2] = {1.25f, NAN};
  Scale(f, 2, DataType::kFloat32, 1.0);
  EXPECT_EQ(f[0], 1.25f);
  uint8_t b[2] = {1, 0};
  Scale(b, 2, DataType::kBool, 0.5);
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 0);
}

}  // namespace
}  // namespace hvd
