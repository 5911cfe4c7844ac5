// Shared helpers of the multi-process checks: typed element access (float16 / bfloat16 through
// the test's own converters, independent of the library's), the value formulas that every rank
// evaluates for every other rank, and a thread-safe failure counter that prints one summary
// line per check group.
//
// Values are chosen so that every result is exact in every dtype: small integers whose sums and
// products stay inside int8 / uint8 and inside the integers that bfloat16 holds exactly (<= 256).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "hvd/engine.h"

namespace mp {

// ---- float16 / bfloat16 bit patterns (round to nearest even).
uint16_t FloatToHalfBits(float f);
float HalfBitsToFloat(uint16_t h);
uint16_t FloatToBFloat16Bits(float f);
float BFloat16BitsToFloat(uint16_t b);

// ---- typed element access: buf[i] of dtype t as a double, and back.
void Put(hvd::DataType t, void* buf, size_t i, double v);
double Get(hvd::DataType t, const void* buf, size_t i);

// Every dtype, every elementwise op (not Adasum), in enum order.
std::vector<hvd::DataType> AllDataTypes();
std::vector<hvd::ReduceOp> AllReduceOps();
bool IsSigned(hvd::DataType t);  // uint8 and bool are not

// Element i of rank r's allreduce input for (dtype, op) in a world of n ranks; `salt` tells
// tensors apart. The expected result is ExpectedReduce over r = 0..n-1.
double ReduceInput(hvd::DataType t, hvd::ReduceOp op, int r, int n, int64_t i, int64_t salt);
// The reduction of ReduceInput(t, op, q, n, i, salt) over q = 0..n-1 (Average divides by n).
double ExpectedReduce(hvd::DataType t, hvd::ReduceOp op, int n, int64_t i, int64_t salt);

// The rows of a reducescatter of `rows` rows over `n` ranks that rank `q` gets: `count` rows from
// row `first`; the first rows % n ranks get one row more.
struct RowShare {
  int64_t first, count;
};
RowShare ReducescatterShare(int64_t rows, int n, int q);

// A small non-negative pattern value (0..49; 0/1 for bool) for data-movement collectives.
double Pattern(hvd::DataType t, int64_t a, int64_t b, int64_t c);

// Names of things for messages: "float32", "sum".
std::string Str(hvd::DataType t);
std::string Str(hvd::ReduceOp op);
// "[2, 3]". (hvd::ShapeToString is declared in hvd/types.h but not exported from the library.)
std::string ShapeStr(const std::vector<int64_t>& shape);

// Waits with a deadline so that a lost operation cannot hang the worker.
hvd::Status WaitDone(const hvd::HandlePtr& h, double seconds = 60.0);

// Counts checks and failures; prints at most a few failure lines per group. Thread-safe.
class Checker {
 public:
  Checker(int rank, int size) : rank_(rank), size_(size) {}

  void Begin(const std::string& group);
  // Prints "[mp] <group>: N checks, F failures (rank r of n)"; returns F.
  int End();
  // Records a check; on failure prints "FAIL <what> (rank r)".
  bool Expect(bool ok, const std::string& what);
  // Expect(status.ok()) with the status in the message.
  bool ExpectOk(const hvd::Status& s, const std::string& what);
  // Compares count elements of `got` with expected(i); reports the first mismatch.
  template <typename Fn>
  bool ExpectElements(hvd::DataType t, const void* got, int64_t count, Fn expected,
                      const std::string& what) {
    for (int64_t i = 0; i < count; ++i) {
      double want = expected(i), have = Get(t, got, static_cast<size_t>(i));
      if (!(want == have)) {
        return Expect(false, what + ": element " + std::to_string(i) + " is " + Num(have) +
                                 ", expected " + Num(want));
      }
    }
    return Expect(true, what);
  }
  int total_failures() const;
  int rank() const { return rank_; }
  int size() const { return size_; }

  static std::string Num(double v);

 private:
  const int rank_, size_;
  mutable std::mutex mu_;
  std::string group_;
  int checks_ = 0, failures_ = 0, printed_ = 0, total_failures_ = 0;
};

// A typed buffer of `count` elements, zero-filled.
struct Buffer {
  Buffer(hvd::DataType t, int64_t count)
      : dtype(t), bytes(static_cast<size_t>(count) * hvd::DataTypeSize(t) + 1, 0) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  hvd::DataType dtype;
  std::vector<uint8_t> bytes;  // one spare byte: data() is never null, even for 0 elements
};

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t0);
// The verdict of a peer-loss run (--peerloss=V) on a survivor: `st`, its failure after `steps`
// steps since t0, must be PeerLost or Timeout naming rank `victim`, within the engine's timeout
// + 10 s; and its next allreduce (of v, in place) must fail at once. Prints "PEERLOSS-OK rank
// r: ..." or "PEERLOSS-FAIL rank r: ..."; returns the exit code (0 or 1).
int PeerLossVerdict(hvd::Engine& e, int victim, Clock::time_point t0, int steps,
                    const hvd::Status& st, const hvd::TensorView& v);

}  // namespace mp
