// The integer scaling rule, shared by the CPU kernels (cpu_reduce.cc) and the CUDA ones
// (device/cuda_kernels.cu) so that host and device tensors scale alike. It is Horovod's: the
// value times the factor in float64, cast back (the fraction truncated toward zero), so an
// integer Average (a sum times 1/size) matches Horovod element for element. Where Horovod's cast
// is undefined hvd saturates to the type's range, and NaN becomes 0.
//
// Thread-safety: a pure function.
#pragma once

#include <math.h>

#include <limits>

#if defined(__CUDACC__)
#define HVD_HOST_DEVICE __host__ __device__
#else
#define HVD_HOST_DEVICE
#endif

namespace hvd {

template <typename T>
HVD_HOST_DEVICE inline T ScaleIntegerValue(T x, double factor) {
  const double lo = static_cast<double>(std::numeric_limits<T>::min());
  // max + 1 (2^digits) is exact in float64 even for int64, unlike max itself.
  const double above = ldexp(1.0, std::numeric_limits<T>::digits);
  const double v = trunc(static_cast<double>(x) * factor);
  if (v != v) return 0;
  if (v <= lo) return std::numeric_limits<T>::min();
  if (v >= above) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

}  // namespace hvd
