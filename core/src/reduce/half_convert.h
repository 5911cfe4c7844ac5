// Inline float16 / bfloat16 <-> float32 conversions used by the CPU kernels. Every function is
// branch-free (selects only) so that loops calling them vectorise.
//
// float -> float16 rounds to nearest even with integer arithmetic plus one float addition for
// the subnormal range (so FMA contraction cannot change a result); overflow gives infinity; NaN
// stays NaN (quiet bit set, the top payload bits and the sign kept).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

namespace hvd {
namespace detail {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// cond ? a : b as mask arithmetic. A plain ?: between values computed with float operations
// lets the compiler move each operation under a branch, which it then will not vectorise (a
// float operation may trap), so the selects stay integer.
inline uint32_t Select(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

inline float DecodeHalf(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // exponent and mantissa, sign shifted out
  // Normal, infinite and NaN inputs: move exponent+mantissa under the float layout, add
  // 224 to the exponent (so 31 becomes 255) and scale by 2^-112 (net rebias 127 - 15).
  const float normal = BitsToFloat((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal inputs: 0.5 + m * 2^-24 minus 0.5 leaves m * 2^-24 exactly.
  const float subnormal = BitsToFloat((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t bits = Select(two_w < (1u << 27), FloatBits(subnormal), FloatBits(normal));
  return BitsToFloat(sign | bits);
}

inline uint16_t EncodeHalf(float f) {
  const uint32_t w = FloatBits(f);
  const uint32_t sign = (w >> 16) & 0x8000u;
  const uint32_t a = w & 0x7FFFFFFFu;
  // Normal range: rebias the exponent by 127 - 15 and round 23 mantissa bits down to 10,
  // ties to even; a carry moves into the exponent on its own.
  const uint32_t t = a - (112u << 23);
  const uint32_t normal = (t + 0x0FFFu + ((t >> 13) & 1u)) >> 13;
  // Below 2^-14: adding 0.5 makes the float unit in the last place 2^-24, the half subnormal
  // spacing, so the addition itself rounds to nearest even; 0x400 (the smallest normal) may
  // come out, which is the right encoding.
  const uint32_t subnormal = FloatBits(BitsToFloat(a) + 0.5f) - FloatBits(0.5f);
  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x03FFu);
  uint32_t r = Select(a < 0x38800000u, subnormal, normal);
  r = Select(a >= 0x477FF000u, 0x7C00u, r);  // 65520 and above round to infinity
  r = Select(a > 0x7F800000u, nan, r);
  return static_cast<uint16_t>(sign | r);
}

inline float DecodeBFloat16(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t EncodeBFloat16(float f) {
  const uint32_t w = FloatBits(f);
  const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  const uint32_t nan = (w >> 16) | 0x0040u;
  return static_cast<uint16_t>(Select((w & 0x7FFFFFFFu) > 0x7F800000u, nan, rounded));
}

}  // namespace detail
}  // namespace hvd
