// The worker of the MPI and Slurm tests: one rank of a job started by mpirun (or by
// slurm_job_test, which fakes srun). It creates the engine from the environment, runs every
// collective over a small grid and checks each result against a formula.
//
// Output: "FAIL <what>" for each failed check, then one line
//   "[mpi-worker] rank R of N bootstrap=B ops=O: all checks passed (K checks)"
// (or "...: FAILED (F of K checks)"); exit status 0 only when every check passed.
// Argument: --expect-bootstrap=store|mpi|slurm and --expect-ops=tcp|mpi fail the run when the
// engine chose differently.
//
// --two-engines instead: a second engine beside the first, shut down first; the first works on
// (before, the second's shutdown finalized MPI under it), and MPI is finalized as it ends.
// "[mpi-worker] rank R: two engines: all checks passed ...".
//
// --rounds also: an allgather, an alltoall and a reducescatter of tens of MiB a block, unequal
// (see CheckRounds).
//
// --stop-in-allgather instead: as --stop-last, but the last rank stops inside an allgather (in
// its output allocator) while the others wait in the collective: "[mpi-worker] rank R: the
// allgather failed after S s: STATUS", exit status 3 as above.
//
// --refused-output instead: the last rank's output allocator of an allgather throws, a second
// after the other ranks are in the allgather's collective (MPI's, with
// HVD_CPU_OPERATIONS=mpi). The last rank receives into a stand-in of its engine and fails alone;
// the others' allgather completes with the right rows, long before HVD_TIMEOUT_SECONDS. Each
// rank prints
//   "[mpi-worker] rank R: the allgather succeeded|failed after S s: STATUS"
// and exits with status 0 after a shutdown once its rows are right (the last rank's error is
// its allocator's). (It abandoned the communicator before: every rank failed.)
// --leave-early instead: after one allreduce the last rank shuts its engine down and exits with
// status 4, as a program that failed does, while the others do 60 s of work of their own (no
// hvd call). Its shutdown ends every rank's engine, and each finalizes MPI then, so the last
// rank's MPI_Finalize does not wait for the others' programs: it exits at once, printing
//   "[mpi-worker] rank R: left after S s"
// and mpirun ends the job; the others print "[mpi-worker] rank R: still working" first.
//
// --stop-last instead: after one allreduce the last rank stops itself (SIGSTOP) while the others
// go on allreducing. They fail after HVD_TIMEOUT_SECONDS naming it, and their engine's end
// leaves MPI unfinalized (MPI_Finalize would wait for the stopped rank forever), so each prints
//   "[mpi-worker] rank R: ended S s after its failure: STATUS"
// and exits with status 3 once the other has printed too; mpirun then ends the job, the stopped
// rank included. (Run with 3 ranks: ranks 0 and 1 are the survivors.)
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hvd/engine.h"

namespace {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::TensorView;

int g_checks = 0, g_failures = 0;

void Expect(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL %s\n", what.c_str());
    std::fflush(stdout);
  }
}

bool ExpectOk(const hvd::Status& s, const std::string& what) {
  Expect(s.ok(), what + ": " + s.ToString());
  return s.ok();
}

// float16 / bfloat16 of small integers (exact in both).
uint16_t IntToHalf(int v) {
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned a = static_cast<unsigned>(std::abs(v));
  int e = 31 - __builtin_clz(a);  // a = 1.m * 2^e
  unsigned mant = (a << (10 - e)) & 0x3ff;
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | mant);
}
uint16_t IntToBf16(int v) {
  float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

// Each rank r contributes value(r, i) = r + 1 + i % 5 (small, so sums stay exact in halves).
int Value(int r, size_t i) { return r + 1 + static_cast<int>(i % 5); }

void CheckAllreduceFloat(hvd::Engine& e, size_t count, ReduceOp op) {
  const int r = e.rank(), n = e.size();
  std::vector<float> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(Value(r, i));
  std::string name = std::string("ar.f32.") + hvd::ReduceOpName(op) + "." + std::to_string(count);
  TensorView v(buf.data(), DataType::kFloat32, {static_cast<int64_t>(count)});
  if (!ExpectOk(e.Allreduce(name, v, v, op)->Wait(), name)) return;
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    double sum = 0, lo = 1e30, hi = -1e30;
    for (int k = 0; k < n; ++k) {
      sum += Value(k, i);
      lo = std::min<double>(lo, Value(k, i));
      hi = std::max<double>(hi, Value(k, i));
    }
    double want = op == ReduceOp::kSum ? sum : op == ReduceOp::kAverage ? sum / n
                  : op == ReduceOp::kMin ? lo : hi;
    if (std::fabs(buf[i] - want) > 1e-4 * std::fabs(want) + 1e-6) ++bad;
  }
  Expect(bad == 0, name + ": " + std::to_string(bad) + " wrong elements");
}

void CheckAllreduceTyped(hvd::Engine& e, DataType dtype, size_t count) {
  const int r = e.rank(), n = e.size();
  std::vector<uint8_t> buf(count * hvd::DataTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    int v = Value(r, i);
    if (dtype == DataType::kInt32) reinterpret_cast<int32_t*>(buf.data())[i] = v;
    if (dtype == DataType::kInt64) reinterpret_cast<int64_t*>(buf.data())[i] = v;
    if (dtype == DataType::kFloat64) reinterpret_cast<double*>(buf.data())[i] = v;
    if (dtype == DataType::kFloat16) reinterpret_cast<uint16_t*>(buf.data())[i] = IntToHalf(v);
    if (dtype == DataType::kBFloat16) reinterpret_cast<uint16_t*>(buf.data())[i] = IntToBf16(v);
  }
  std::string name = std::string("ar.") + hvd::DataTypeName(dtype) + "." + std::to_string(count);
  TensorView v(buf.data(), dtype, {static_cast<int64_t>(count)});
  if (!ExpectOk(e.Allreduce(name, v, v, ReduceOp::kSum)->Wait(), name)) return;
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    int want = 0;
    for (int k = 0; k < n; ++k) want += Value(k, i);
    bool ok = false;
    if (dtype == DataType::kInt32) ok = reinterpret_cast<int32_t*>(buf.data())[i] == want;
    if (dtype == DataType::kInt64) ok = reinterpret_cast<int64_t*>(buf.data())[i] == want;
    if (dtype == DataType::kFloat64) ok = reinterpret_cast<double*>(buf.data())[i] == want;
    if (dtype == DataType::kFloat16) ok = reinterpret_cast<uint16_t*>(buf.data())[i] == IntToHalf(want);
    if (dtype == DataType::kBFloat16) ok = reinterpret_cast<uint16_t*>(buf.data())[i] == IntToBf16(want);
    bad += ok ? 0 : 1;
  }
  Expect(bad == 0, name + ": " + std::to_string(bad) + " wrong elements");
}

// Several tensors at once: fused into one buffer by the engine.
void CheckGroupedAllreduce(hvd::Engine& e) {
  const int r = e.rank(), n = e.size();
  const int k = 6;
  std::vector<std::vector<int32_t>> bufs(k);
  std::vector<std::string> names;
  std::vector<TensorView> views;
  for (int t = 0; t < k; ++t) {
    bufs[t].assign(10 + t, r * 100 + t);
    names.push_back("group." + std::to_string(t));
    views.emplace_back(bufs[t].data(), DataType::kInt32, std::vector<int64_t>{10 + t});
  }
  auto hs = e.GroupedAllreduce(names, views, views, ReduceOp::kSum);
  for (int t = 0; t < k; ++t) {
    if (!ExpectOk(hs[t]->Wait(), names[t])) continue;
    int32_t want = 100 * n * (n - 1) / 2 + n * t;
    Expect(bufs[t][0] == want && bufs[t].back() == want, names[t] + " value");
  }
}

// Rank r gives r + 1 rows of 3 int32 (row j of rank r holds 1000 r + j).
void CheckAllgather(hvd::Engine& e) {
  const int r = e.rank(), n = e.size();
  std::vector<int32_t> in(static_cast<size_t>(r + 1) * 3);
  for (int j = 0; j <= r; ++j) {
    for (int c = 0; c < 3; ++c) in[j * 3 + c] = 1000 * r + j;
  }
  auto h = e.Allgather("ag", TensorView(in.data(), DataType::kInt32, {r + 1, 3}));
  if (!ExpectOk(h->Wait(), "allgather")) return;
  const int rows = n * (n + 1) / 2;
  Expect(h->output_shape() == std::vector<int64_t>{rows, 3}, "allgather shape");
  if (h->output_bytes().size() != static_cast<size_t>(rows) * 3 * 4) return;
  auto* out = reinterpret_cast<const int32_t*>(h->output_bytes().data());
  size_t bad = 0, row = 0;
  for (int k = 0; k < n; ++k) {
    for (int j = 0; j <= k; ++j, ++row) bad += out[row * 3 + 2] == 1000 * k + j ? 0 : 1;
  }
  Expect(bad == 0, "allgather values: " + std::to_string(bad) + " wrong rows");
}

void CheckBroadcast(hvd::Engine& e, size_t count) {
  const int r = e.rank(), n = e.size();
  for (int root = 0; root < n; ++root) {
    std::vector<double> buf(count, r == root ? 7.0 * root + 0.5 : -1.0);
    std::string name = "bc." + std::to_string(root) + "." + std::to_string(count);
    TensorView v(buf.data(), DataType::kFloat64, {static_cast<int64_t>(count)});
    if (!ExpectOk(e.Broadcast(name, v, v, root)->Wait(), name)) continue;
    Expect(buf.front() == 7.0 * root + 0.5 && buf.back() == 7.0 * root + 0.5, name + " value");
  }
}

// Rank r sends j + 1 rows (value 100 r + j) to rank j.
void CheckAlltoall(hvd::Engine& e) {
  const int r = e.rank(), n = e.size();
  std::vector<int64_t> splits(n);
  std::vector<int32_t> in;
  for (int j = 0; j < n; ++j) {
    splits[j] = j + 1;
    in.insert(in.end(), j + 1, 100 * r + j);
  }
  auto h = e.Alltoall("a2a", TensorView(in.data(), DataType::kInt32, {static_cast<int64_t>(in.size())}), splits);
  if (!ExpectOk(h->Wait(), "alltoall")) return;
  Expect(h->output_shape() == std::vector<int64_t>{static_cast<int64_t>(n) * (r + 1)}, "alltoall shape");
  auto* out = reinterpret_cast<const int32_t*>(h->output_bytes().data());
  size_t bad = 0;
  for (int k = 0; k < n && h->output_bytes().size() == static_cast<size_t>(n * (r + 1)) * 4; ++k) {
    for (int j = 0; j <= r; ++j) bad += out[k * (r + 1) + j] == 100 * k + r ? 0 : 1;
  }
  Expect(bad == 0, "alltoall values");
}

// --rounds: an allgather, an alltoall and a reducescatter large enough that MPI's collectives
// (HVD_CPU_OPERATIONS=mpi) run them in rounds of at most 64 MiB, with blocks of unequal size
// (some empty, so that they drop out of later rounds), every element checked against a formula.
constexpr size_t kMiB = size_t{1} << 20;

void CheckRounds(hvd::Engine& e) {
  const int r = e.rank(), n = e.size();
  // Allgather: rank q gives L(q) bytes, byte t holding (7 t + 3 q) % 101.
  auto len = [](int q) { return q % 3 == 1 ? size_t{0} : (q + 1) * 23 * kMiB + 5 * q + 1; };
  std::vector<int8_t> mine(len(r));
  for (size_t t = 0; t < mine.size(); ++t) mine[t] = static_cast<int8_t>((7 * t + 3 * r) % 101);
  auto g = e.Allgather("rounds.ag", TensorView(mine.data(), DataType::kInt8,
                                               {static_cast<int64_t>(mine.size())}));
  if (ExpectOk(g->Wait(), "allgather in rounds")) {
    size_t want = 0, bad = 0, at = 0;
    for (int q = 0; q < n; ++q) want += len(q);
    const auto& out = g->output_bytes();
    Expect(out.size() == want, "allgather in rounds: " + std::to_string(out.size()) + " bytes");
    for (int q = 0; q < n && out.size() == want; ++q) {
      for (size_t t = 0; t < len(q); ++t, ++at) {
        bad += static_cast<int8_t>(out[at]) == static_cast<int8_t>((7 * t + 3 * q) % 101) ? 0 : 1;
      }
    }
    Expect(bad == 0, "allgather in rounds: " + std::to_string(bad) + " wrong bytes");
  }
  mine = {};
  // Alltoall: rank q sends S(q, j) bytes to rank j, byte t holding (5 t + 11 q + 3 j) % 127; the
  // longest block differs between ranks, so they must agree on the number of rounds.
  auto sent = [](int q, int j) { return ((q + 2 * j) % 3) * 17 * kMiB + 11 * j + 3 * q; };
  std::vector<int64_t> splits(n);
  std::vector<int8_t> in;
  for (int j = 0; j < n; ++j) {
    splits[j] = static_cast<int64_t>(sent(r, j));
    for (size_t t = 0; t < sent(r, j); ++t) {
      in.push_back(static_cast<int8_t>((5 * t + 11 * r + 3 * j) % 127));
    }
  }
  auto a = e.Alltoall("rounds.a2a", TensorView(in.data(), DataType::kInt8,
                                               {static_cast<int64_t>(in.size())}), splits);
  if (ExpectOk(a->Wait(), "alltoall in rounds")) {
    size_t want = 0, bad = 0, at = 0;
    for (int q = 0; q < n; ++q) want += sent(q, r);
    const auto& out = a->output_bytes();
    Expect(out.size() == want, "alltoall in rounds: " + std::to_string(out.size()) + " bytes");
    for (int q = 0; q < n && out.size() == want; ++q) {
      for (size_t t = 0; t < sent(q, r); ++t, ++at) {
        const auto want = static_cast<int8_t>((5 * t + 11 * q + 3 * r) % 127);
        bad += static_cast<int8_t>(out[at]) == want ? 0 : 1;
      }
    }
    Expect(bad == 0, "alltoall in rounds: " + std::to_string(bad) + " wrong bytes");
  }
  in = {};
  // Reducescatter (sum) of 7 Mi n + 2 floats, rank q's element i = i % 1009 + q: its rows are
  // n (i % 1009) + n (n - 1) / 2, exact in float32. The first two ranks get a row more.
  const int64_t rows = 7 * static_cast<int64_t>(kMiB) * n + 2;
  std::vector<float> x(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) x[i] = static_cast<float>(i % 1009 + r);
  auto rs = e.Reducescatter("rounds.rs", TensorView(x.data(), DataType::kFloat32, {rows}),
                            ReduceOp::kSum);
  if (ExpectOk(rs->Wait(), "reducescatter in rounds")) {
    const int64_t part = rows / n + (r < rows % n ? 1 : 0);
    int64_t first = 0;
    for (int q = 0; q < r; ++q) first += rows / n + (q < rows % n ? 1 : 0);
    const auto& out = rs->output_bytes();
    Expect(out.size() == static_cast<size_t>(part) * 4, "reducescatter in rounds: size");
    size_t bad = 0;
    const auto* f = reinterpret_cast<const float*>(out.data());
    for (int64_t i = 0; i < part && out.size() == static_cast<size_t>(part) * 4; ++i) {
      bad += f[i] == static_cast<float>(n * ((first + i) % 1009) + n * (n - 1) / 2) ? 0 : 1;
    }
    Expect(bad == 0, "reducescatter in rounds: " + std::to_string(bad) + " wrong rows");
  }
}

// 2n + 1 rows of 2 floats, every element of rank r = r + row: rank q gets its rows summed.
void CheckReducescatter(hvd::Engine& e) {
  const int r = e.rank(), n = e.size();
  const int rows = 2 * n + 1;
  std::vector<float> in(static_cast<size_t>(rows) * 2);
  for (int i = 0; i < rows; ++i) in[i * 2] = in[i * 2 + 1] = static_cast<float>(r + i);
  auto h = e.Reducescatter("rs", TensorView(in.data(), DataType::kFloat32, {rows, 2}), ReduceOp::kSum);
  if (!ExpectOk(h->Wait(), "reducescatter")) return;
  const int mine = rows / n + (r < rows % n ? 1 : 0);
  int first = 0;
  for (int q = 0; q < r; ++q) first += rows / n + (q < rows % n ? 1 : 0);
  Expect(h->output_shape() == std::vector<int64_t>{mine, 2}, "reducescatter shape");
  if (h->output_bytes().size() != static_cast<size_t>(mine) * 8) return;
  auto* out = reinterpret_cast<const float*>(h->output_bytes().data());
  size_t bad = 0;
  for (int i = 0; i < mine; ++i) {
    float want = static_cast<float>(n * (n - 1) / 2 + n * (first + i));
    bad += out[i * 2] == want && out[i * 2 + 1] == want ? 0 : 1;
  }
  Expect(bad == 0, "reducescatter values");
}

int RefusedOutput(hvd::Engine& e) {
  const int last = e.size() - 1;
  std::vector<float> in(4, e.rank() + 1.0f), out;
  hvd::OutputAllocator alloc = [&](const std::vector<int64_t>& shape) -> void* {
    if (e.rank() == last) {
      // The others are in the collective by now.
      std::this_thread::sleep_for(std::chrono::seconds(1));
      throw std::runtime_error("the test's allocator refuses");
    }
    out.assign(static_cast<size_t>(shape[0]) * 4, 0.0f);
    return out.data();
  };
  const auto start = std::chrono::steady_clock::now();
  hvd::Status s = e.Allgather("refused.ag", TensorView(in.data(), DataType::kFloat32, {1, 4}), alloc)
                      ->Wait();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[mpi-worker] rank %d: the allgather %s after %.1f s: %s\n", e.rank(),
              s.ok() ? "succeeded" : "failed", took, s.ToString().c_str());
  bool right = e.rank() == last ? !s.ok() : s.ok() && out.size() == 4u * e.size();
  for (size_t i = 0; right && e.rank() != last && i < out.size(); ++i) {
    right = out[i] == static_cast<float>(i / 4 + 1);  // rank j's row holds j + 1
  }
  if (!right) std::printf("FAIL rank %d: the allgather's outcome\n", e.rank());
  std::fflush(stdout);
  return e.Shutdown().ok() && right ? 0 : 1;
}

int LeaveEarly(std::unique_ptr<hvd::Engine> e) {
  int32_t one = 1;
  ExpectOk(e->Allreduce("early.one", TensorView(&one, DataType::kInt32, {1}),
                        TensorView(&one, DataType::kInt32, {1}), ReduceOp::kSum)
               ->Wait(),
           "allreduce before the early exit");
  const int rank = e->rank();
  if (rank != e->size() - 1) {
    std::printf("[mpi-worker] rank %d: still working\n", rank);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  e.reset();  // shuts down, and MPI finalizes with the others' engines
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[mpi-worker] rank %d: left after %.1f s\n", rank, took);
  std::fflush(stdout);
  return 4;
}

int ExitAfterTheOtherSurvivor(int rank);

int StopLast(std::unique_ptr<hvd::Engine> e) {
  int32_t one = 1;
  TensorView v(&one, DataType::kInt32, {1});
  ExpectOk(e->Allreduce("stop.warm", v, v, ReduceOp::kSum)->Wait(), "allreduce before the stop");
  const int rank = e->rank();
  if (rank == e->size() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting
    raise(SIGSTOP);
    return 0;
  }
  hvd::Status s;
  for (int i = 0; s.ok() && i < 100000; ++i) {
    s = e->Allreduce("stop.step" + std::to_string(i), v, v, ReduceOp::kSum)->Wait();
  }
  const auto failed = std::chrono::steady_clock::now();
  e.reset();  // shuts down; MPI is left unfinalized
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - failed).count();
  std::printf("[mpi-worker] rank %d: ended %.1f s after its failure: %s\n", rank, took,
              s.ToString().c_str());
  std::fflush(stdout);
  return ExitAfterTheOtherSurvivor(rank);
}

// Rank 2 stops (SIGSTOP) inside an allgather, in its output allocator, a moment after ranks 0
// and 1 are in the collective (MPI's with HVD_CPU_OPERATIONS=mpi). Rank 0 finds it silent after
// HVD_TIMEOUT_SECONDS and aborts; the abort must end the survivors' waits inside MPI's
// collective (polled between MPI_Test calls), which MPI alone would never end.
int StopInAllgather(std::unique_ptr<hvd::Engine> e) {
  const int rank = e->rank(), last = e->size() - 1;
  std::vector<float> in(4, 1.0f), out;
  hvd::OutputAllocator alloc = [&](const std::vector<int64_t>& shape) -> void* {
    if (rank == last) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting
      raise(SIGSTOP);
    }
    out.assign(static_cast<size_t>(shape[0]) * 4, 0.0f);
    return out.data();
  };
  const auto start = std::chrono::steady_clock::now();
  hvd::Status s =
      e->Allgather("stop.ag", TensorView(in.data(), DataType::kFloat32, {1, 4}), alloc)->Wait();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  e.reset();  // shuts down; MPI is left unfinalized
  std::printf("[mpi-worker] rank %d: the allgather %s after %.1f s: %s\n", rank,
              s.ok() ? "succeeded" : "failed", took, s.ToString().c_str());
  std::fflush(stdout);
  return ExitAfterTheOtherSurvivor(rank);
}

// mpirun kills the job at the first non-zero exit: each survivor (rank 0 or 1) leaves a file
// once it has printed, and exits with 3 once the other's is there too (or after 20 s), so both
// lines come out. The ranks of this one-host job share their parent (mpirun's daemon): it
// names the job.
int ExitAfterTheOtherSurvivor(int rank) {
  auto marker = [](int r) {
    return "/tmp/hvd-stop-last." + std::to_string(::getppid()) + "." + std::to_string(r);
  };
  if (std::FILE* f = std::fopen(marker(rank).c_str(), "w")) std::fclose(f);
  const auto t0 = std::chrono::steady_clock::now();
  while (::access(marker(1 - rank).c_str(), F_OK) != 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the other saw this one's
  // Both, since mpirun may kill the other as this one exits.
  std::remove(marker(rank).c_str());
  std::remove(marker(1 - rank).c_str());
  return 3;
}

// A second engine alive beside the first (a program's second hvd_init): shutting it down
// leaves MPI to the first, which works on, and MPI is finalized as the last one ends.
int TwoEngines(std::unique_ptr<hvd::Engine> first) {
  auto second = hvd::Engine::CreateFromEnvironment();
  if (!second.ok()) {
    std::printf("FAIL second init: %s\n", second.status().ToString().c_str());
    return 2;
  }
  CheckAllreduceFloat(**second, 7, ReduceOp::kSum);
  ExpectOk((*second)->Shutdown(), "the second engine's shutdown");
  second->reset();
  CheckAllreduceFloat(*first, 1000, ReduceOp::kSum);
  CheckBroadcast(*first, 3);
  ExpectOk(first->Barrier()->Wait(), "barrier");
  const int rank = first->rank();
  ExpectOk(first->Shutdown(), "shutdown");
  first.reset();
  std::printf("[mpi-worker] rank %d: two engines: %s (%d of %d checks failed)\n", rank,
              g_failures ? "FAILED" : "all checks passed", g_failures, g_checks);
  return g_failures ? 1 : 0;
}

const char* BootstrapName(hvd::Options::Bootstrap b) {
  switch (b) {
    case hvd::Options::Bootstrap::kStore: return "store";
    case hvd::Options::Bootstrap::kMpi: return "mpi";
    case hvd::Options::Bootstrap::kSlurm: return "slurm";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  std::string want_bootstrap, want_ops;
  bool refused_output = false, leave_early = false, stop_last = false, stop_in_allgather = false,
       rounds = false, two_engines = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--refused-output") refused_output = true;
    if (a == "--leave-early") leave_early = true;
    if (a == "--stop-last") stop_last = true;
    if (a == "--stop-in-allgather") stop_in_allgather = true;
    if (a == "--rounds") rounds = true;
    if (a == "--two-engines") two_engines = true;
    if (a.rfind("--expect-bootstrap=", 0) == 0) want_bootstrap = a.substr(19);
    if (a.rfind("--expect-ops=", 0) == 0) want_ops = a.substr(13);
  }
  auto created = hvd::Engine::CreateFromEnvironment();
  if (!created.ok()) {
    std::printf("FAIL init: %s\n", created.status().ToString().c_str());
    return 2;
  }
  if (leave_early) return LeaveEarly(std::move(*created));
  if (stop_last) return StopLast(std::move(*created));
  if (stop_in_allgather) return StopInAllgather(std::move(*created));
  if (two_engines) return TwoEngines(std::move(*created));
  hvd::Engine& e = **created;
  if (refused_output) return RefusedOutput(e);
  const char* bootstrap = BootstrapName(e.options().bootstrap);
  const char* ops = e.options().cpu_operations == hvd::Options::CpuOperations::kMpi ? "mpi" : "tcp";
  if (!want_bootstrap.empty()) Expect(want_bootstrap == bootstrap, std::string("bootstrap is ") + bootstrap);
  if (!want_ops.empty()) Expect(want_ops == ops, std::string("cpu operations are ") + ops);

  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax}) {
      CheckAllreduceFloat(e, count, op);
    }
  }
  for (DataType d : {DataType::kInt32, DataType::kInt64, DataType::kFloat64, DataType::kFloat16,
                     DataType::kBFloat16}) {
    CheckAllreduceTyped(e, d, 5);
    CheckAllreduceTyped(e, d, 40000);
  }
  CheckGroupedAllreduce(e);
  CheckAllgather(e);
  CheckBroadcast(e, 3);
  CheckBroadcast(e, 300000);
  CheckAlltoall(e);
  CheckReducescatter(e);
  if (rounds) CheckRounds(e);
  ExpectOk(e.Barrier()->Wait(), "barrier");
  ExpectOk(e.Shutdown(), "shutdown");

  std::printf("[mpi-worker] rank %d of %d local %d/%d cross %d/%d bootstrap=%s ops=%s: %s (%d of %d checks failed)\n",
              e.rank(), e.size(), e.local_rank(), e.local_size(), e.cross_rank(), e.cross_size(),
              bootstrap, ops, g_failures ? "FAILED" : "all checks passed", g_failures, g_checks);
  return g_failures ? 1 : 0;
}
