// Element-wise kernels per dtype x op on the CPU. Loops are plain and contiguous so that the
// compiler vectorises them; float16 and bfloat16 are widened to float32, combined, and rounded
// back to nearest-even once per call.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>

#include "hvd/types.h"

namespace hvd {

// dst[i] = dst[i] (op) src[i] for i < count. Average combines like Sum (the division is a
// separate Scale step). Bool: Sum/Max = or, Min/Product = and.
void ReduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// dst[i] = a[i] (op) b[i]: the same result as copying `a` to dst and then ReduceInto(dst, b),
// in one pass. `a` is dst itself or does not overlap it; `b` does not overlap dst.
void ReduceTo(void* dst, const void* a, const void* b, size_t count, DataType dtype,
              ReduceOp op);

// buf[i] *= factor (integers: rounded to nearest, as Horovod does for prescale/postscale).
// No-op when factor == 1.0.
void Scale(void* buf, size_t count, DataType dtype, double factor);

// float16 / bfloat16 <-> float32 (round to nearest even; NaN stays NaN).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace hvd
