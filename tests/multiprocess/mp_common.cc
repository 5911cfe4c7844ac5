#include "mp_common.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace mp {

using hvd::DataType;
using hvd::ReduceOp;

// ---------------------------------------------------------------- float16 / bfloat16

uint16_t FloatToHalfBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t fexp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (fexp == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int exp = static_cast<int>(fexp) - 127 + 15;
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: infinity
  if (exp <= 0) {                                                  // subnormal or zero
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0x1fu) {
    x = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {
    x = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBFloat16Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

float BFloat16BitsToFloat(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// ---------------------------------------------------------------- typed access

void Put(DataType t, void* buf, size_t i, double v) {
  switch (t) {
    case DataType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); return;
    case DataType::kInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v); return;
    case DataType::kInt16: static_cast<int16_t*>(buf)[i] = static_cast<int16_t>(v); return;
    case DataType::kUInt16: static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(v); return;
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); return;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); return;
    case DataType::kFloat16:
      static_cast<uint16_t*>(buf)[i] = FloatToHalfBits(static_cast<float>(v));
      return;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = FloatToBFloat16Bits(static_cast<float>(v));
      return;
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); return;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = v; return;
    case DataType::kBool: static_cast<uint8_t*>(buf)[i] = v != 0 ? 1 : 0; return;
  }
}

double Get(DataType t, const void* buf, size_t i) {
  switch (t) {
    case DataType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
    case DataType::kInt8: return static_cast<const int8_t*>(buf)[i];
    case DataType::kInt16: return static_cast<const int16_t*>(buf)[i];
    case DataType::kUInt16: return static_cast<const uint16_t*>(buf)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kFloat16: return HalfBitsToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBFloat16: return BFloat16BitsToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kBool: return static_cast<const uint8_t*>(buf)[i];  // raw byte: must be 0/1
  }
  return -1e300;
}

std::vector<DataType> AllDataTypes() {
  std::vector<DataType> v;
  for (int i = 0; i < hvd::kNumDataTypes; ++i) v.push_back(static_cast<DataType>(i));
  return v;
}

std::vector<ReduceOp> AllReduceOps() {
  std::vector<ReduceOp> v;
  for (int i = 0; i < hvd::kNumReduceOps; ++i) {
    if (static_cast<ReduceOp>(i) != ReduceOp::kAdasum) v.push_back(static_cast<ReduceOp>(i));
  }
  return v;
}

bool IsSigned(DataType t) {
  return t != DataType::kUInt8 && t != DataType::kUInt16 && t != DataType::kBool;
}

// ---------------------------------------------------------------- value formulas

namespace {

uint64_t Mix(int r, int64_t i, int64_t salt) {
  return static_cast<uint64_t>(i) * 7u + static_cast<uint64_t>(r) * 13u +
         static_cast<uint64_t>(salt) * 31u + static_cast<uint64_t>(i / 5) * 3u;
}

double Ranged(uint64_t x, int64_t lo, int64_t hi) {
  return static_cast<double>(lo + static_cast<int64_t>(x % static_cast<uint64_t>(hi - lo + 1)));
}

}  // namespace

double ReduceInput(DataType t, ReduceOp op, int r, int n, int64_t i, int64_t salt) {
  const uint64_t x = Mix(r, i, salt);
  const bool sgn = IsSigned(t);
  if (t == DataType::kBool) {
    if (op == ReduceOp::kMin || op == ReduceOp::kProduct) return (i + r + salt) % (n + 1) != 0;
    return (i + 2 * r + salt) % (n + 2) == 0;
  }
  switch (op) {
    case ReduceOp::kSum: {
      const int64_t m = std::max(1, 120 / n);  // |sum| <= 120: exact in int8 and bfloat16
      return sgn ? Ranged(x, -m, m) : Ranged(x, 0, m);
    }
    case ReduceOp::kAverage: {  // a multiple of n, so the average is an integer
      const int64_t w = 120 / (n * n);
      return n * (sgn ? Ranged(x, -w, w) : Ranged(x, 0, w));
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return sgn ? Ranged(x, -100, 100) : Ranged(x, 0, 200);
    case ReduceOp::kProduct: {  // one rank per element gives 2: |product| <= 2
      const double base = (i + r + salt) % n == 0 ? 2 : 1;
      const bool neg = sgn && (i * 5 + r + salt) % 3 == 0;
      return neg ? -base : base;
    }
    case ReduceOp::kAdasum:  // not elementwise: mp_adasum.cc has its own inputs
      break;
  }
  return 0;
}

double ExpectedReduce(DataType t, ReduceOp op, int n, int64_t i, int64_t salt) {
  double acc = ReduceInput(t, op, 0, n, i, salt);
  for (int q = 1; q < n; ++q) {
    const double v = ReduceInput(t, op, q, n, i, salt);
    if (t == DataType::kBool) {
      const bool both_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
      acc = both_and ? (acc != 0 && v != 0) : (acc != 0 || v != 0);
      continue;
    }
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc += v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kAdasum: break;  // not elementwise
    }
  }
  if (op == ReduceOp::kAverage) acc /= n;
  return acc;
}

double Pattern(DataType t, int64_t a, int64_t b, int64_t c) {
  if (t == DataType::kBool) return (a + b + c) % 2;
  return static_cast<double>((a * 17 + b * 5 + c * 3) % 50);
}

std::string Str(DataType t) { return hvd::DataTypeName(t); }
std::string Str(ReduceOp op) { return hvd::ReduceOpName(op); }

std::string ShapeStr(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}

hvd::Status WaitDone(const hvd::HandlePtr& h, double seconds) {
  return h->WaitFor(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

RowShare ReducescatterShare(int64_t rows, int n, int q) {
  return {q * (rows / n) + std::min<int64_t>(q, rows % n), rows / n + (q < rows % n ? 1 : 0)};
}

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int PeerLossVerdict(hvd::Engine& e, int victim, Clock::time_point t0, int steps,
                    const hvd::Status& st, const hvd::TensorView& v) {
  const double took = SecondsSince(t0);
  const std::string named = "rank " + std::to_string(victim);
  bool ok = (st.code() == hvd::StatusCode::kPeerLost || st.code() == hvd::StatusCode::kTimeout) &&
            st.message().find(named) != std::string::npos &&
            took < e.options().timeout_seconds + 10;
  // Later operations fail too, at once.
  hvd::Status later = WaitDone(e.Allreduce("peerloss.later", v, v, hvd::ReduceOp::kSum), 5.0);
  ok = ok && !later.ok() && later.code() != hvd::StatusCode::kTimeout;
  std::printf("%s rank %d: failed after %.2f s and %d steps with %s; the next operation: %s\n",
              ok ? "PEERLOSS-OK" : "PEERLOSS-FAIL", e.rank(), took, steps, st.ToString().c_str(),
              later.ToString().c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------- Checker

void Checker::Begin(const std::string& group) {
  std::lock_guard<std::mutex> l(mu_);
  group_ = group;
  checks_ = failures_ = printed_ = 0;
}

int Checker::End() {
  std::lock_guard<std::mutex> l(mu_);
  std::printf("[mp] %-22s %6d checks, %d failures (rank %d of %d)\n", (group_ + ":").c_str(),
              checks_, failures_, rank_, size_);
  std::fflush(stdout);
  return failures_;
}

bool Checker::Expect(bool ok, const std::string& what) {
  std::lock_guard<std::mutex> l(mu_);
  ++checks_;
  if (ok) return true;
  ++failures_;
  ++total_failures_;
  if (printed_++ < 20) {
    std::printf("FAIL [%s] %s (rank %d of %d)\n", group_.c_str(), what.c_str(), rank_, size_);
    std::fflush(stdout);
  }
  return false;
}

bool Checker::ExpectOk(const hvd::Status& s, const std::string& what) {
  return Expect(s.ok(), what + ": " + s.ToString());
}

int Checker::total_failures() const {
  std::lock_guard<std::mutex> l(mu_);
  return total_failures_;
}

std::string Checker::Num(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

}  // namespace mp
