// The collective algorithms over the in-process transport, ranks as threads. Expected values
// come from formulas over (rank, index), never from the algorithms themselves.
#include "collectives/collectives.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/pipeline.h"
#include "inproc_transport.h"
#include "reduce/half_convert.h"

namespace hvd {
namespace {

using test::InProcWorld;
using test::RunRanks;
using Bytes = std::vector<uint8_t>;

constexpr int kSizes[] = {1, 2, 3, 4, 7};
constexpr DataType kDtypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt16,
                                DataType::kUInt16,  DataType::kInt32,   DataType::kInt64,
                                DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                                DataType::kFloat64, DataType::kBool};
// The allreduce grid's dtypes. Under ThreadSanitizer, one of 2 bytes (converted through float)
// and one of 4: a race is in the transport and the algorithm's steps, which every dtype takes
// alike, and the whole grid takes 4 minutes there (every dtype's kernel is checked in the
// plain and the AddressSanitizer builds).
#if defined(__SANITIZE_THREAD__)
#define HVD_TSAN_GRID 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HVD_TSAN_GRID 1
#endif
#endif
#ifdef HVD_TSAN_GRID
constexpr DataType kGridDtypes[] = {DataType::kFloat16, DataType::kFloat32};
#else
constexpr const DataType (&kGridDtypes)[11] = kDtypes;
#endif
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kProduct};
constexpr size_t kPeriod = 251;  // inputs repeat every kPeriod elements (a prime)

Deadline Soon() { return DeadlineAfterSeconds(30); }

void ExpectAllOk(const std::vector<Status>& st, const std::string& what) {
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << what << " rank " << r << ": " << st[r].ToString();
}

// ---- Allreduce inputs: small integers whose reductions are exact in every dtype ----

bool IsAndOp(ReduceOp op) { return op == ReduceOp::kMin || op == ReduceOp::kProduct; }

// Rank r's element i. Sums stay within [-14, 28], min/max within [-8, 16], products are
// products of values in {1, 2} (unsigned: at most 2^7 = 128) or of {-1, 1, 2} with 2 only on
// even ranks (signed: |product| <= 2^4), so uint8, int8, float16 and bfloat16 are all exact.
int64_t Input(DataType dtype, ReduceOp op, int r, size_t i) {
  const int64_t k = static_cast<int64_t>(i % kPeriod);
  const bool is_unsigned = dtype == DataType::kUInt8 || dtype == DataType::kUInt16;
  if (dtype == DataType::kBool)
    return IsAndOp(op) ? ((k * 3 + r) % 11 != 0) : ((k * 3 + r) % 11 == 0);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return (k * 7 + r * 3) % 5 - (is_unsigned ? 0 : 2);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return (k * 13 + r * 7) % 17 - (is_unsigned ? 0 : 8);
    case ReduceOp::kProduct:
      if (is_unsigned) return (k + r) % 3 == 0 ? 2 : 1;
      if (r % 2 == 0) return (k + r) % 3 - 1 == 0 ? 2 : (k + r) % 3 - 1;  // -1, 2, 1
      return (k + r) % 2 == 0 ? -1 : 1;
    case ReduceOp::kAdasum:  // not elementwise: the Adasum tests below have their own inputs
      break;
  }
  return 0;
}

int64_t Expected(DataType dtype, ReduceOp op, int size, size_t i) {
  int64_t acc = Input(dtype, op, 0, i);
  for (int r = 1; r < size; ++r) {
    const int64_t v = Input(dtype, op, r, i);
    if (dtype == DataType::kBool)
      acc = IsAndOp(op) ? (acc && v) : (acc || v);
    else if (op == ReduceOp::kMin)
      acc = std::min(acc, v);
    else if (op == ReduceOp::kMax)
      acc = std::max(acc, v);
    else if (op == ReduceOp::kProduct)
      acc *= v;
    else
      acc += v;
  }
  return acc;
}

// Exact encodings of small integers, written from the formats' layouts.
uint16_t SmallIntTo16(int64_t v, int mant_bits, int bias) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  const int64_t a = v < 0 ? -v : v;
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  const int64_t mant = (a - (int64_t{1} << e)) << (mant_bits - e);
  return static_cast<uint16_t>(sign | ((e + bias) << mant_bits) | mant);
}

void Encode(DataType dtype, int64_t v, uint8_t* out) {
  auto put = [out](auto x) { std::memcpy(out, &x, sizeof(x)); };
  switch (dtype) {
    case DataType::kUInt8:
      put(static_cast<uint8_t>(v));
      break;
    case DataType::kInt8:
      put(static_cast<int8_t>(v));
      break;
    case DataType::kInt16:
      put(static_cast<int16_t>(v));
      break;
    case DataType::kUInt16:
      put(static_cast<uint16_t>(v));
      break;
    case DataType::kBool:
      put(static_cast<uint8_t>(v != 0));
      break;
    case DataType::kInt32:
      put(static_cast<int32_t>(v));
      break;
    case DataType::kInt64:
      put(static_cast<int64_t>(v));
      break;
    case DataType::kFloat32:
      put(static_cast<float>(v));
      break;
    case DataType::kFloat64:
      put(static_cast<double>(v));
      break;
    case DataType::kFloat16:
      put(SmallIntTo16(v, 10, 15));
      break;
    case DataType::kBFloat16:
      put(SmallIntTo16(v, 7, 127));
      break;
  }
}

// count elements whose element i is f(i % kPeriod), encoded in dtype.
template <typename F>
Bytes Tile(DataType dtype, size_t count, F f) {
  const size_t es = DataTypeSize(dtype);
  Bytes period(kPeriod * es), out(count * es);
  for (size_t k = 0; k < kPeriod; ++k) Encode(dtype, f(k), &period[k * es]);
  for (size_t i = 0; i < count; i += kPeriod) {
    std::memcpy(&out[i * es], period.data(), std::min(kPeriod, count - i) * es);
  }
  return out;
}

std::vector<size_t> AllreduceCounts(int size, DataType dtype) {
  // ... 0, 1, odd, large, and above kSegmentBytes x size so that every ring chunk is pipelined
  // in several segments of uneven length.
  return {0, 1, 37, 1001, (1u << 18) + 3, kSegmentBytes * size / DataTypeSize(dtype) + 1001};
}

void CheckAllreduce(AllreduceAlgorithm algo, int size, DataType dtype, ReduceOp op, size_t count) {
  InProcWorld world(size);
  std::vector<Bytes> bufs(size);
  for (int r = 0; r < size; ++r) {
    bufs[r] = Tile(dtype, count, [&](size_t k) { return Input(dtype, op, r, k); });
  }
  const Bytes want = Tile(dtype, count, [&](size_t k) { return Expected(dtype, op, size, k); });
  const std::string what = std::string(DataTypeName(dtype)) + " " + ReduceOpName(op) + " count " +
                           std::to_string(count) + " size " + std::to_string(size);
  auto st = RunRanks(world, [&](Transport& t) {
    ScratchBuffer scratch;
    return Allreduce(t, bufs[t.rank()].data(), count, dtype, op, scratch, Soon(), algo);
  });
  ExpectAllOk(st, what);
  for (int r = 0; r < size; ++r) {
    if (bufs[r] == want) continue;
    size_t i = 0;
    const size_t es = DataTypeSize(dtype);
    while (std::memcmp(&bufs[r][i * es], &want[i * es], es) == 0) ++i;
    ADD_FAILURE() << what << ": rank " << r << " differs first at element " << i;
  }
}

class AllreduceGrid : public ::testing::TestWithParam<std::tuple<AllreduceAlgorithm, int>> {};

TEST_P(AllreduceGrid, EveryDtypeOpAndCountMatchesTheFormula) {
  const auto [algo, size] = GetParam();
  for (DataType dtype : kGridDtypes) {
    for (ReduceOp op : kOps) {
      for (size_t count : AllreduceCounts(size, dtype))
        CheckAllreduce(algo, size, dtype, op, count);
    }
  }
}

std::string GridName(const ::testing::TestParamInfo<std::tuple<AllreduceAlgorithm, int>>& info) {
  static const char* const kNames[] = {"Auto", "Ring", "RecursiveDoubling"};
  return std::string(kNames[static_cast<int>(std::get<0>(info.param))]) + "_size" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, AllreduceGrid,
    ::testing::Combine(::testing::Values(AllreduceAlgorithm::kAuto, AllreduceAlgorithm::kRing,
                                         AllreduceAlgorithm::kRecursiveDoubling),
                       ::testing::ValuesIn(kSizes)),
    GridName);

// Every rank ends bitwise identical even when float sums round (values of mixed magnitude).
TEST(Allreduce, RanksAgreeBitwiseOnRoundedFloatSums) {
  for (AllreduceAlgorithm algo :
       {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kRecursiveDoubling}) {
    for (int size : {3, 7}) {
      const size_t count = 5003;
      InProcWorld world(size);
      std::vector<std::vector<float>> bufs(size, std::vector<float>(count));
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < count; ++i)
          bufs[r][i] = std::ldexp(1.0f + 0.1f * r, (int(i) * 7 + r * 13) % 41 - 20);
      }
      ExpectAllOk(RunRanks(world,
                           [&](Transport& t) {
                             ScratchBuffer scratch;
                             return Allreduce(t, bufs[t.rank()].data(), count, DataType::kFloat32,
                                              ReduceOp::kSum, scratch, Soon(), algo);
                           }),
                  "float sums");
      for (int r = 1; r < size; ++r)
        EXPECT_EQ(std::memcmp(bufs[r].data(), bufs[0].data(), count * 4), 0) << r;
    }
  }
}

// ---- Adasum ----

// The Adasum of two vectors, from its definition, in float64; `round` takes each element of the
// result to the dtype's precision.
std::vector<double> RefAdasumPair(const std::vector<double>& a, const std::vector<double>& b,
                                  const std::function<double(double)>& round) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  // Horovod's threshold: a coefficient is 1 only below sqrt(DBL_MIN) (zeros, in practice).
  const double tiny = std::sqrt(std::numeric_limits<double>::min());
  const double ca = aa >= tiny ? 1 - dot / (2 * aa) : 1, cb = bb >= tiny ? 1 - dot / (2 * bb) : 1;
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = round(ca * a[i] + cb * b[i]);
  return out;
}

// The binary tree over ranks in order: pairs (0, 1), (2, 3), ..., then pairs of pairs. Each
// level's vectors are held in the dtype (`round`), as a rank holds them.
std::vector<double> RefAdasum(std::vector<std::vector<double>> level,
                              const std::function<double(double)>& round =
                                  [](double v) { return v; }) {
  while (level.size() > 1) {
    std::vector<std::vector<double>> next;
    for (size_t i = 0; i < level.size(); i += 2) {
      next.push_back(RefAdasumPair(level[i], level[i + 1], round));
    }
    level = std::move(next);
  }
  return level[0];
}

double AdasumInput(int r, size_t tensor, size_t i) {
  return std::sin(0.37 * static_cast<double>(i + 1) * (r + 1) + 1.3 * tensor) * (1 + r % 3) +
         (tensor == 1 ? 0.25 * r : 0);  // tensor 1: a part the ranks share
}

// Every rank ends with the tree of adasum combinations of the ranks' tensors, each tensor of a
// fused buffer with its own dot products: sizes 1, 2, 4, 8; tensors of 0, 1, odd and large
// counts; a rank of zeros (as a joined rank gives) takes coefficient 1; float16, float32 and
// float64 (the reference takes the inputs as rounded to the dtype, and computes in float64).
// Small gradients still combine by the formula (Horovod's test_stability): [1e-5] and [3e-5]
// give 1e-5 * (1 - 3/2) + 3e-5 * (1 - 3/18) = 2e-5, not their sum.
TEST(Adasum, SmallVectorsCombineByTheFormula) {
  InProcWorld world(2);
  std::vector<std::vector<double>> bufs = {{1e-5}, {3e-5}};
  ExpectAllOk(RunRanks(world,
                       [&](Transport& t) {
                         ScratchBuffer scratch;
                         return AdasumAllreduce(t, bufs[t.rank()].data(), {1},
                                                DataType::kFloat64, scratch, Soon());
                       }),
              "adasum");
  for (int r = 0; r < 2; ++r) EXPECT_NEAR(bufs[r][0], 2e-5, 1e-18) << "rank " << r;
}

TEST(Adasum, MatchesTheFormulaTensorByTensor) {
  const std::vector<size_t> counts = {0, 1, 7, 1000, 3};
  size_t total = 0;
  for (size_t c : counts) total += c;
  for (int size : {1, 2, 4, 8}) {
    for (DataType dtype : {DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
      // Element i of a buffer of `dtype`, read and written as float64.
      auto get = [dtype](const std::vector<uint8_t>& b, size_t i) -> double {
        if (dtype == DataType::kFloat64) return reinterpret_cast<const double*>(b.data())[i];
        if (dtype == DataType::kFloat32) return reinterpret_cast<const float*>(b.data())[i];
        return detail::DecodeHalf(reinterpret_cast<const uint16_t*>(b.data())[i]);
      };
      auto put = [dtype](std::vector<uint8_t>& b, size_t i, double v) {
        if (dtype == DataType::kFloat64) reinterpret_cast<double*>(b.data())[i] = v;
        else if (dtype == DataType::kFloat32)
          reinterpret_cast<float*>(b.data())[i] = static_cast<float>(v);
        else reinterpret_cast<uint16_t*>(b.data())[i] = detail::EncodeHalf(static_cast<float>(v));
      };
      // float16: every level of the tree holds its vectors in float16 (rounded through
      // float32), so the reference rounds each level the same way.
      const bool half = dtype == DataType::kFloat16;
      auto round = [half](double v) {
        if (!half) return v;
        return static_cast<double>(detail::DecodeHalf(detail::EncodeHalf(static_cast<float>(v))));
      };
      const double tolerance = dtype == DataType::kFloat64   ? 1e-12
                               : dtype == DataType::kFloat32 ? 1e-5
                                                             : 1e-3;
      InProcWorld world(size);
      std::vector<std::vector<double>> in(size, std::vector<double>(total));
      std::vector<std::vector<uint8_t>> bufs(size, std::vector<uint8_t>(total * 8));
      for (int r = 0; r < size; ++r) {
        size_t at = 0;
        for (size_t k = 0; k < counts.size(); ++k) {
          for (size_t i = 0; i < counts[k]; ++i, ++at) {
            put(bufs[r], at, (size > 2 && r == size - 1) ? 0.0 : AdasumInput(r, k, i));
            in[r][at] = get(bufs[r], at);  // as rounded to the dtype
          }
        }
      }
      ExpectAllOk(RunRanks(world,
                           [&](Transport& t) {
                             ScratchBuffer scratch;
                             return AdasumAllreduce(t, bufs[t.rank()].data(), counts, dtype,
                                                    scratch, Soon());
                           }),
                  "adasum");
      size_t at = 0;
      for (size_t k = 0; k < counts.size(); ++k) {
        std::vector<std::vector<double>> per_rank(size);
        for (int r = 0; r < size; ++r) per_rank[r].assign(in[r].begin() + at, in[r].begin() + at + counts[k]);
        const std::vector<double> want =
            counts[k] ? RefAdasum(per_rank, round) : std::vector<double>();
        for (size_t i = 0; i < counts[k]; ++i) {
          for (int r = 0; r < size; ++r) {
            const double got = get(bufs[r], at + i);
            ASSERT_NEAR(got, want[i], tolerance * (1 + std::fabs(want[i])))
                << "size " << size << " " << DataTypeName(dtype) << " tensor " << k
                << " element " << i << " rank " << r;
          }
        }
        at += counts[k];
      }
      for (int r = 1; r < size; ++r) EXPECT_EQ(bufs[r], bufs[0]) << "rank " << r << " differs";
    }
  }
}

TEST(Adasum, RefusesWorldsThatAreNotPowersOfTwoAndIntegerTypes) {
  InProcWorld world(3);
  auto st = RunRanks(world, [&](Transport& t) {
    float x[4] = {1, 2, 3, 4};
    ScratchBuffer scratch;
    return AdasumAllreduce(t, x, {4}, DataType::kFloat32, scratch, Soon());
  });
  for (const auto& s : st) EXPECT_NE(s.message().find("power of two"), std::string::npos) << s.ToString();
  InProcWorld two(2);
  st = RunRanks(two, [&](Transport& t) {
    int32_t x[4] = {1, 2, 3, 4};
    ScratchBuffer scratch;
    return AdasumAllreduce(t, x, {4}, DataType::kInt32, scratch, Soon());
  });
  for (const auto& s : st) {
    EXPECT_NE(s.message().find("float16, float32 and float64"), std::string::npos) << s.ToString();
  }
}

// ---- Allgatherv ----

uint8_t PatternByte(int r, size_t i) { return static_cast<uint8_t>(r * 31 + i * 7 + (i >> 8)); }

std::vector<std::vector<size_t>> AllgatherSizes(int size) {
  std::vector<size_t> differing, some_zero, all_zero(size, 0), large;
  for (int r = 0; r < size; ++r) {
    differing.push_back(r * 37 + 1);
    some_zero.push_back(r % 2 == 0 ? 0 : 1001 + r);
    large.push_back(kSegmentBytes + 4099 * r);
  }
  return {differing, some_zero, all_zero, large};
}

TEST(Allgatherv, DifferingAndZeroContributionsInAndOutOfPlace) {
  for (int size : kSizes) {
    for (const std::vector<size_t>& bytes : AllgatherSizes(size)) {
      for (bool in_place : {false, true}) {
        const std::vector<size_t> off = PrefixOffsets(bytes);
        const size_t total = off.back() + bytes.back();
        Bytes want(total);
        for (int r = 0; r < size; ++r)
          for (size_t i = 0; i < bytes[r]; ++i) want[off[r] + i] = PatternByte(r, i);
        std::vector<Bytes> ins(size), outs(size, Bytes(total + 1, 0xEE));
        for (int r = 0; r < size; ++r) {
          ins[r].resize(bytes[r] + 1);
          for (size_t i = 0; i < bytes[r]; ++i) ins[r][i] = PatternByte(r, i);
          if (in_place) std::memcpy(outs[r].data() + off[r], ins[r].data(), bytes[r]);
        }
        InProcWorld world(size);
        ExpectAllOk(RunRanks(world,
                             [&](Transport& t) {
                               const int r = t.rank();
                               const void* in = in_place ? outs[r].data() + off[r] : ins[r].data();
                               return Allgatherv(t, in, outs[r].data(), bytes, Soon());
                             }),
                    "allgatherv");
        for (int r = 0; r < size; ++r) {
          EXPECT_EQ(Bytes(outs[r].begin(), outs[r].begin() + total), want)
              << "size " << size << " rank " << r;
          EXPECT_EQ(outs[r][total], 0xEE) << "wrote past the end";
        }
      }
    }
  }
}

// ---- Broadcast ----

TEST(Broadcast, EveryRootTreeAndChain) {
  for (int size : kSizes) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1001}, kSmallBroadcastBytes,
                         kSmallBroadcastBytes + 1, 2 * kSegmentBytes + 12345}) {
      for (int root = 0; root < size; ++root) {
        std::vector<Bytes> bufs(size, Bytes(bytes));
        for (int r = 0; r < size; ++r)
          for (size_t i = 0; i < bytes; ++i) bufs[r][i] = PatternByte(r, i);
        InProcWorld world(size);
        ExpectAllOk(RunRanks(world,
                             [&](Transport& t) {
                               return Broadcast(t, bufs[t.rank()].data(), bytes, root, Soon());
                             }),
                    "broadcast");
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < bytes; ++i) {
            ASSERT_EQ(bufs[r][i], PatternByte(root, i))
                << "size " << size << " root " << root << " rank " << r << " byte " << i;
          }
        }
      }
    }
  }
}

// ---- Alltoallv ----

// Bytes rank `from` sends to rank `to`: uneven, with zeros, or large.
size_t Split(int pattern, int from, int to) {
  if (pattern == 0) return ((from * 3 + to * 5) % 7) * 13;
  return 70000 + 1009 * ((from + 2 * to) % 5);
}

TEST(Alltoallv, UnevenAndZeroSplits) {
  for (int size : kSizes) {
    for (int pattern : {0, 1}) {
      std::vector<Bytes> ins(size), outs(size);
      std::vector<std::vector<size_t>> sends(size), recvs(size);
      for (int r = 0; r < size; ++r) {
        for (int j = 0; j < size; ++j) {
          sends[r].push_back(Split(pattern, r, j));
          recvs[r].push_back(Split(pattern, j, r));
        }
        for (int j = 0; j < size; ++j) {  // byte i of the part r sends to j
          for (size_t i = 0; i < sends[r][j]; ++i) ins[r].push_back(PatternByte(r * 8 + j, i));
        }
        outs[r].assign(PrefixOffsets(recvs[r]).back() + recvs[r].back(), 0);
      }
      InProcWorld world(size);
      ExpectAllOk(RunRanks(world,
                           [&](Transport& t) {
                             const int r = t.rank();
                             return Alltoallv(t, ins[r].data(), sends[r], outs[r].data(), recvs[r],
                                              Soon());
                           }),
                  "alltoallv");
      for (int r = 0; r < size; ++r) {
        Bytes want;
        for (int j = 0; j < size; ++j)
          for (size_t i = 0; i < recvs[r][j]; ++i) want.push_back(PatternByte(j * 8 + r, i));
        EXPECT_EQ(outs[r], want) << "size " << size << " pattern " << pattern << " rank " << r;
      }
    }
  }
}

// ---- ReduceScatter ----

std::vector<std::vector<size_t>> ScatterCounts(int size) {
  std::vector<size_t> uneven, all_zero(size, 0), large;
  for (int c = 0; c < size; ++c) {
    uneven.push_back(c % 3 == 1 ? 0 : 17 * c + 5);
    large.push_back(kSegmentBytes / 2 + 3001 * c);  // several segments for 4- and 8-byte types
  }
  return {uneven, all_zero, large};
}

TEST(ReduceScatter, UnevenCountsInAndOutOfPlace) {
  const std::pair<DataType, ReduceOp> cases[] = {{DataType::kFloat32, ReduceOp::kSum},
                                                 {DataType::kInt8, ReduceOp::kMax},
                                                 {DataType::kFloat16, ReduceOp::kProduct},
                                                 {DataType::kBool, ReduceOp::kMin},
                                                 {DataType::kInt64, ReduceOp::kSum}};
  for (int size : kSizes) {
    for (const std::vector<size_t>& counts : ScatterCounts(size)) {
      for (auto c : cases) {
        const DataType dtype = c.first;
        const ReduceOp op = c.second;
        for (bool in_place : {false, true}) {
          const std::vector<size_t> off = PrefixOffsets(counts);
          const size_t total = off.back() + counts.back(), es = DataTypeSize(dtype);
          std::vector<Bytes> ins(size), outs(size);
          for (int r = 0; r < size; ++r) {
            ins[r] = Tile(dtype, total, [&](size_t k) { return Input(dtype, op, r, k); });
            outs[r].assign(counts[r] * es, 0);
          }
          InProcWorld world(size);
          ExpectAllOk(RunRanks(world,
                               [&](Transport& t) {
                                 ScratchBuffer scratch;
                                 const int r = t.rank();
                                 void* out =
                                     in_place ? ins[r].data() + off[r] * es : outs[r].data();
                                 return ReduceScatter(t, ins[r].data(), out, counts, dtype, op,
                                                      scratch, Soon());
                               }),
                      "reducescatter");
          const Bytes want =
              Tile(dtype, total, [&](size_t k) { return Expected(dtype, op, size, k); });
          for (int r = 0; r < size; ++r) {
            const uint8_t* got = in_place ? ins[r].data() + off[r] * es : outs[r].data();
            if (counts[r] == 0) continue;  // an empty part may have no storage (null)
            EXPECT_EQ(std::memcmp(got, want.data() + off[r] * es, counts[r] * es), 0)
                << DataTypeName(dtype) << " size " << size << " rank " << r << " in_place "
                << in_place;
          }
        }
      }
    }
  }
}

// ---- Barrier ----

TEST(Barrier, NoRankLeavesBeforeEveryRankEntered) {
  for (int size : kSizes) {
    for (int late = 0; late < size; late += 3) {
      std::atomic<int> entered{0};
      InProcWorld world(size);
      ExpectAllOk(RunRanks(world,
                           [&](Transport& t) -> Status {
                             if (t.rank() == late)
                               std::this_thread::sleep_for(std::chrono::milliseconds(20));
                             entered.fetch_add(1);
                             HVD_RETURN_IF_ERROR(Barrier(t, Soon()));
                             if (entered.load() != size)
                               return Status::Internal("left the barrier early");
                             return Status::OK();
                           }),
                  "barrier");
    }
  }
}

// ---- Faults: a dead peer gives PeerLost naming it, a missing one Timeout; nothing hangs ----

using Collective = std::function<Status(Transport&, Deadline)>;

std::vector<std::pair<std::string, Collective>> AllCollectives(int size) {
  auto buffers = std::make_shared<std::vector<Bytes>>(size, Bytes(4 * kSegmentBytes));
  auto scratch = std::make_shared<std::vector<ScratchBuffer>>(size);
  auto allreduce = [=](AllreduceAlgorithm algo, size_t count) {
    return [=](Transport& t, Deadline d) {
      return Allreduce(t, (*buffers)[t.rank()].data(), count, DataType::kFloat32, ReduceOp::kSum,
                       (*scratch)[t.rank()], d, algo);
    };
  };
  std::vector<size_t> per_rank(size, 1000), counts(size, 1000);
  return {
      {"ring allreduce", allreduce(AllreduceAlgorithm::kRing, kSegmentBytes)},
      {"recursive doubling allreduce", allreduce(AllreduceAlgorithm::kRecursiveDoubling, 100)},
      {"auto allreduce", allreduce(AllreduceAlgorithm::kAuto, 10)},
      {"allgatherv",
       [=](Transport& t, Deadline d) {
         Bytes& b = (*buffers)[t.rank()];
         return Allgatherv(t, b.data(), b.data() + per_rank[0], per_rank, d);
       }},
      {"broadcast tree",
       [=](Transport& t, Deadline d) {
         return Broadcast(t, (*buffers)[t.rank()].data(), 100, 2, d);
       }},
      {"broadcast chain",
       [=](Transport& t, Deadline d) {
         return Broadcast(t, (*buffers)[t.rank()].data(), 2 * kSegmentBytes, 2, d);
       }},
      {"alltoallv",
       [=](Transport& t, Deadline d) {
         Bytes& b = (*buffers)[t.rank()];
         return Alltoallv(t, b.data(), per_rank, b.data() + 2 * kSegmentBytes, per_rank, d);
       }},
      {"reducescatter",
       [=](Transport& t, Deadline d) {
         Bytes& b = (*buffers)[t.rank()];
         return ReduceScatter(t, b.data(), b.data() + 3 * kSegmentBytes, counts, DataType::kInt32,
                              ReduceOp::kMax, (*scratch)[t.rank()], d);
       }},
      {"barrier", [](Transport& t, Deadline d) { return Barrier(t, d); }},
  };
}

TEST(Faults, KilledPeerFailsEverySurvivorWithPeerLostNamingIt) {
  const int size = 4, dead = 2;
  for (bool before_start : {true, false}) {
    for (const auto& named : AllCollectives(size)) {
      const auto& name = named.first;
      const auto& collective = named.second;
      InProcWorld world(size);
      if (before_start) world.KillRank(dead);
      std::thread killer([&] {
        if (before_start) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        world.KillRank(dead);
      });
      const auto start = Clock::now();
      auto st = RunRanks(
          world, [&](Transport& t) { return collective(t, DeadlineAfterSeconds(30)); }, {dead});
      killer.join();
      EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << name;
      for (int r = 0; r < size; ++r) {
        if (r == dead) continue;
        EXPECT_EQ(st[r].code(), StatusCode::kPeerLost)
            << name << " rank " << r << ": " << st[r].ToString();
        EXPECT_NE(st[r].message().find("rank 2 lost"), std::string::npos)
            << name << ": " << st[r].message();
      }
    }
  }
}

TEST(Faults, PeerThatNeverShowsUpGivesTimeout) {
  const int size = 3, missing = 1;
  for (const auto& named : AllCollectives(size)) {
    const auto& name = named.first;
    const auto& collective = named.second;
    if (name.rfind("broadcast", 0) == 0) continue;  // root 2 needs nothing from rank 1
    InProcWorld world(size);
    const auto start = Clock::now();
    auto st = RunRanks(
        world, [&](Transport& t) { return collective(t, DeadlineAfterSeconds(0.2)); }, {missing});
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << name;
    for (int r = 0; r < size; ++r) {
      if (r != missing)
        EXPECT_EQ(st[r].code(), StatusCode::kTimeout)
            << name << " rank " << r << ": " << st[r].ToString();
    }
  }
}

TEST(Collectives, InconsistentArgumentsAreRefused) {
  InProcWorld world(2);
  ScratchBuffer scratch;
  Transport& t = world.transport(0);
  Bytes b(16);
  EXPECT_EQ(Allgatherv(t, b.data(), b.data(), {1}, Soon()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Broadcast(t, b.data(), 4, 2, Soon()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Alltoallv(t, b.data(), {1, 2}, b.data() + 8, {2, 2}, Soon()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ReduceScatter(t, b.data(), b.data(), {1}, DataType::kUInt8, ReduceOp::kSum, scratch, Soon())
          .code(),
      StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hvd

namespace hvd {
namespace {

// The engine reserves what the algorithms take from scratch before a collective starts; these
// must be what they take: after reserving, running them never grows the buffer.
TEST(Scratch, ReservedBytesAreWhatTheAlgorithmsUse) {
  for (int p : {2, 3, 4, 7}) {
    for (size_t count : {size_t{1}, size_t{1000}, size_t{16385}, size_t{300000}}) {
      std::vector<ScratchBuffer> scratch(p);
      std::vector<size_t> reserved(p), after(p);
      const size_t ar = AllreduceScratchBytes(count, DataType::kFloat32, p);
      std::vector<size_t> counts(p, count / p);
      counts[0] += count % p;
      const size_t rs = ReduceScatterScratchBytes(counts, DataType::kFloat32);
      InProcWorld world(p);
      ExpectAllOk(RunRanks(world, [&](Transport& t) {
        std::vector<float> buf(count, 1.0f), out(counts[t.rank()]);
        ScratchBuffer& s = scratch[t.rank()];
        if (s.Get(std::max(ar, rs)) == nullptr) return Status::ResourceExhausted("reserve");
        reserved[t.rank()] = s.capacity();
        HVD_RETURN_IF_ERROR(Allreduce(t, buf.data(), count, DataType::kFloat32, ReduceOp::kSum, s,
                                      Soon()));
        HVD_RETURN_IF_ERROR(ReduceScatter(t, buf.data(), out.data(), counts, DataType::kFloat32,
                                          ReduceOp::kSum, s, Soon()));
        after[t.rank()] = s.capacity();
        return Status::OK();
      }), "scratch");
      EXPECT_EQ(after, reserved) << "p=" << p << " count=" << count;
    }
  }
}

TEST(Scratch, AnImpossibleSizeIsNullNotAThrow) {
  ScratchBuffer s;
  ASSERT_NE(s.Get(100), nullptr);
  EXPECT_EQ(s.Get(SIZE_MAX - 8), nullptr);
  EXPECT_EQ(s.capacity(), 0u);
  EXPECT_EQ(s.Get(size_t{1} << 62), nullptr);
  EXPECT_NE(s.Get(100), nullptr);
  EXPECT_GE(s.capacity(), 100u);
}

}  // namespace
}  // namespace hvd
