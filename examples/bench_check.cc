// Fill and check for hvd_bench (see bench_check.h for the pattern).
#include "bench_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace hvd_bench {
namespace {

using hvd::DataType;
using hvd::ReduceOp;

// IEEE binary16, round to nearest even.
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half, exactly a * 2^24 rounded
    float af;
    std::memcpy(&af, &a, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(af * 16777216.0f)));
  }
  uint32_t h = a - 0x38000000u;  // exponent bias 127 -> 15
  const uint32_t rest = h & 0x1fffu;
  h >>= 13;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) bits = sign | 0x7f800000u | (mant << 13);
  else bits = sign | ((exp + 112u) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float Bf16ToFloat(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

template <typename T>
T At(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void Put(void* p, size_t i, T v) {
  std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T));
}

double Load(const void* p, size_t i, DataType t) {
  switch (t) {
    case DataType::kUInt8: return At<uint8_t>(p, i);
    case DataType::kInt8: return At<int8_t>(p, i);
    case DataType::kInt16: return At<int16_t>(p, i);
    case DataType::kUInt16: return At<uint16_t>(p, i);
    case DataType::kInt32: return At<int32_t>(p, i);
    case DataType::kInt64: return static_cast<double>(At<int64_t>(p, i));
    case DataType::kFloat16: return HalfToFloat(At<uint16_t>(p, i));
    case DataType::kBFloat16: return Bf16ToFloat(At<uint16_t>(p, i));
    case DataType::kFloat32: return At<float>(p, i);
    case DataType::kFloat64: return At<double>(p, i);
    case DataType::kBool: return At<uint8_t>(p, i) != 0 ? 1.0 : 0.0;
  }
  return 0;
}

// Integers are given as int64 and wrap to the dtype's width; floats round to the dtype.
void Store(void* p, size_t i, DataType t, double fv, int64_t iv) {
  switch (t) {
    case DataType::kUInt8: Put<uint8_t>(p, i, static_cast<uint8_t>(iv)); break;
    case DataType::kInt8: Put<int8_t>(p, i, static_cast<int8_t>(iv)); break;
    case DataType::kInt16: Put<int16_t>(p, i, static_cast<int16_t>(iv)); break;
    case DataType::kUInt16: Put<uint16_t>(p, i, static_cast<uint16_t>(iv)); break;
    case DataType::kInt32: Put<int32_t>(p, i, static_cast<int32_t>(iv)); break;
    case DataType::kInt64: Put<int64_t>(p, i, iv); break;
    case DataType::kFloat16: Put<uint16_t>(p, i, FloatToHalf(static_cast<float>(fv))); break;
    case DataType::kBFloat16: Put<uint16_t>(p, i, FloatToBf16(static_cast<float>(fv))); break;
    case DataType::kFloat32: Put<float>(p, i, static_cast<float>(fv)); break;
    case DataType::kFloat64: Put<double>(p, i, fv); break;
    case DataType::kBool: Put<uint8_t>(p, i, static_cast<uint8_t>(iv & 1)); break;
  }
}

bool IsFloat(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat32 ||
         t == DataType::kFloat64;
}

// The value a double (or int64) has once stored in the dtype and read back.
double RoundTrip(DataType t, double fv, int64_t iv) {
  uint64_t slot = 0;
  Store(&slot, 0, t, fv, iv);
  return Load(&slot, 0, t);
}

// Reduces the stored values of residue k over all ranks the way the dtype's arithmetic does.
double ReduceResidue(const std::vector<double>& stored, int k, int p, DataType t, ReduceOp op) {
  if (t == DataType::kBool) {
    bool any = false, all = true;
    for (int r = 0; r < p; ++r) {
      any = any || stored[r * 13 + k] != 0;
      all = all && stored[r * 13 + k] != 0;
    }
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? all : any;
  }
  if (!IsFloat(t)) {  // wrap-around arithmetic in 64 bits, then narrowed to the dtype's width
    uint64_t sum = 0, prod = 1;
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    for (int r = 0; r < p; ++r) {
      const int64_t v = static_cast<int64_t>(stored[r * 13 + k]);
      sum += static_cast<uint64_t>(v);
      prod *= static_cast<uint64_t>(v);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    const double s = RoundTrip(t, 0, static_cast<int64_t>(sum));
    switch (op) {
      case ReduceOp::kSum: return s;
      case ReduceOp::kAverage: return std::nearbyint(s / p);  // compared within 1
      case ReduceOp::kMin: return static_cast<double>(lo);
      case ReduceOp::kMax: return static_cast<double>(hi);
      case ReduceOp::kProduct: return RoundTrip(t, 0, static_cast<int64_t>(prod));
      case ReduceOp::kAdasum: return s;  // refused by the flags (bench_args.cc)
    }
  }
  double sum = 0, prod = 1, lo = INFINITY, hi = -INFINITY;
  for (int r = 0; r < p; ++r) {
    const double v = stored[r * 13 + k];
    sum += v;
    prod *= v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  double v = op == ReduceOp::kSum       ? sum
             : op == ReduceOp::kAverage ? sum / p
             : op == ReduceOp::kMin     ? lo
             : op == ReduceOp::kMax     ? hi
                                        : prod;
  return RoundTrip(t, v, 0);
}

}  // namespace

void Fill(void* buf, size_t count, DataType dtype, int rank) {
  for (size_t i = 0; i < count; ++i) {
    const int64_t v = static_cast<int64_t>(rank + 1) * static_cast<int64_t>(i % 13 + 1);
    Store(buf, i, dtype, static_cast<double>(v), v);
  }
}

Checker::Checker(hvd::RawCollective coll, DataType dtype, ReduceOp op, int rank, int size)
    : coll_(coll), dtype_(dtype), op_(op), rank_(rank), size_(size) {
  stored_.resize(static_cast<size_t>(size) * 13);
  for (int r = 0; r < size; ++r) {
    for (int k = 0; k < 13; ++k) {
      const int64_t v = static_cast<int64_t>(r + 1) * (k + 1);
      stored_[r * 13 + k] = RoundTrip(dtype, static_cast<double>(v), v);
    }
  }
  for (int k = 0; k < 13; ++k) reduced_.push_back(ReduceResidue(stored_, k, size, dtype, op));
}

size_t Checker::OutputCount(size_t in_count) const {
  switch (coll_) {
    case hvd::RawCollective::kAllgather: return in_count * size_;
    case hvd::RawCollective::kReducescatter: return in_count / size_;
    default: return in_count;
  }
}

double Checker::Expected(size_t j, size_t in_count) const {
  const size_t part = in_count / size_;
  switch (coll_) {
    case hvd::RawCollective::kAllreduce: return reduced_[j % 13];
    case hvd::RawCollective::kReducescatter: return reduced_[(rank_ * part + j) % 13];
    case hvd::RawCollective::kBroadcast: return stored_[j % 13];  // root 0
    case hvd::RawCollective::kAllgather:
      return stored_[(j / in_count) * 13 + (j % in_count) % 13];
    case hvd::RawCollective::kAlltoall:  // block r of rank q's output = block q of rank r's input
      return stored_[(j / part) * 13 + (rank_ * part + j % part) % 13];
  }
  return 0;
}

bool Checker::Matches(double got, double want) const {
  if (got == want) return true;
  const bool reducing = coll_ == hvd::RawCollective::kAllreduce ||
                        coll_ == hvd::RawCollective::kReducescatter;
  if (!reducing || std::isnan(got) || std::isnan(want) || dtype_ == DataType::kBool) return false;
  if (!IsFloat(dtype_)) return op_ == ReduceOp::kAverage && std::fabs(got - want) <= 1.0;
  // Exact values stay exact in float32/float64 for sum, min and max; the rest may round per
  // step in an order the formula does not know: allow (p + 1) units in the last place.
  const bool exact = (dtype_ == DataType::kFloat32 || dtype_ == DataType::kFloat64) &&
                     (op_ == ReduceOp::kSum || op_ == ReduceOp::kMin || op_ == ReduceOp::kMax);
  if (exact) return false;
  const double eps = dtype_ == DataType::kFloat16    ? 0x1p-10
                     : dtype_ == DataType::kBFloat16 ? 0x1p-7
                     : dtype_ == DataType::kFloat32  ? 0x1p-23
                                                     : 0x1p-52;
  return std::fabs(got - want) <= eps * (size_ + 1) * std::fabs(want);
}

int64_t Checker::CountWrong(const void* out, size_t in_count) const {
  const size_t n = OutputCount(in_count);
  int64_t wrong = 0;
  for (size_t j = 0; j < n; ++j) {
    if (!Matches(Load(out, j, dtype_), Expected(j, in_count))) ++wrong;
  }
  return wrong;
}

}  // namespace hvd_bench
