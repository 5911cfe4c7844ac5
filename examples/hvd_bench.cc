// hvd_bench: an nccl-tests style sweep of one hvd collective over message sizes.
//
//   hvdrun -np 4 build/bin/hvd_bench --coll allreduce -e 16M [--raw] [--csv]
//
// Method, per size (the same as the peers in shared/peers):
//   1. `-w` untimed warmup iterations, then `iters` timed ones (-n, or clamp(budget/size, 5, 100)).
//   2. Engine mode: before every iteration all ranks meet in an engine Barrier; then each rank
//      times its own call from the enqueue to Wait() returning (the whole engine operation,
//      negotiation and fusion included, under one tensor name per size, reused every iteration
//      as a training loop does). --raw: hvd::RunRawCollective's background thread meets the
//      others in a barrier on the transport and times the bare collective (transport and
//      algorithm alone), as MPI benchmarks time MPI_Allreduce after MPI_Barrier.
//   3. Outside the timed region: the per-rank times are reduced with an hvd allreduce Max (the
//      sample of an iteration is its slowest rank), the output of the last iteration is checked
//      element by element against the formula (bench_check.h) and the wrong counts are summed.
//   4. Rank 0 prints the median and min sample, algbw = data bytes / median and busbw.
//   --sets K: the ranks form K process sets (rank % K); every set runs the collective at the
//   same time after the global barrier, so the sample is the slowest set's; ranks and busbw
//   count in a set.
// Exit status: 0, or 1 if any element was wrong or an hvd call failed, 2 for bad flags.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_check.h"
#include "hvd/engine.h"
#include "hvd/raw.h"

namespace hvd_bench {
namespace {

using hvd::RawCollective;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<char, FreeDeleter>;

Buffer AllocPageAligned(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  return Buffer(static_cast<char*>(std::aligned_alloc(4096, rounded)));
}

[[noreturn]] void Die(int rank, const std::string& what, const hvd::Status& st) {
  std::fprintf(stderr, "hvd_bench: rank %d: %s failed: %s\n", rank, what.c_str(),
               st.ToString().c_str());
  std::exit(1);
}

double BusFactor(RawCollective c, int n) {
  switch (c) {
    case RawCollective::kAllreduce: return 2.0 * (n - 1) / n;
    case RawCollective::kBroadcast: return 1.0;
    default: return static_cast<double>(n - 1) / n;
  }
}

bool IsReducing(RawCollective c) {
  return c == RawCollective::kAllreduce || c == RawCollective::kReducescatter;
}

// Everything one sweep needs; one per process, used from the main thread only.
class Bench {
 public:
  // set: the process set this rank runs in (0: the world), and its rank and size there.
  Bench(hvd::Engine& engine, const BenchArgs& args, int32_t set, int set_rank, int set_size)
      : engine_(engine), a_(args), set_(set), world_rank_(engine.rank()), rank_(set_rank),
        size_(set_size), esize_(hvd::DataTypeSize(args.dtype)),
        checker_(args.coll, args.dtype, args.op, set_rank, set_size) {}

  // Runs every size; returns the total number of wrong elements over all ranks and sizes.
  int64_t Run();

 private:
  size_t CountFor(size_t bytes) const;
  // One operation. --raw: the bare collective after a barrier on the transport, timed on the
  // background thread (*seconds); otherwise the caller times it.
  // as_one (--paired): one allreduce of `count` elements, whatever --tensors says.
  hvd::Status RunOnce(const std::string& name, size_t count, double* seconds, bool as_one = false);
  int64_t CountWrongInSteps(size_t count) const;  // this rank's, over the step's tensors
  int64_t RunSize(size_t count);
  void PrintHeader() const;
  // tensors: how many tensors of `count` elements a sample moved.
  void PrintRow(size_t count, std::vector<double>& samples, int64_t wrong, int tensors,
                const char* label) const;

  hvd::Engine& engine_;
  const BenchArgs a_;
  const int32_t set_;
  const int world_rank_;  // prints
  const int rank_, size_;  // in the set
  const size_t esize_;
  const Checker checker_;
  Buffer in_, out_;
  // --tensors: the names of a step's tensors and their views, made once per size, as a trainer
  // names its gradients and keeps its parameters' buffers from step to step.
  std::vector<std::string> names_;
  std::vector<hvd::TensorView> inputs_, outputs_;
  size_t out_capacity_ = 0;  // bytes
};

// Elements per rank for a size: at least one; alltoall and reducescatter need a multiple of
// the world size (rounded down, at least size elements), as nccl-tests does.
size_t Bench::CountFor(size_t bytes) const {
  size_t count = std::max<size_t>(bytes / esize_, 1);
  if (a_.coll == RawCollective::kAlltoall || a_.coll == RawCollective::kReducescatter) {
    count = std::max<size_t>(count / size_ * size_, size_);
  }
  return count;
}

hvd::Status Bench::RunOnce(const std::string& name, size_t count, double* seconds, bool as_one) {
  if (a_.raw) {
    return hvd::RunRawCollective(engine_, a_.coll, in_.get(), out_.get(), count, a_.dtype, a_.op,
                                 seconds);
  }
  const std::vector<int64_t> shape{static_cast<int64_t>(count)};
  if (a_.tensors > 1 && !as_one) {
    // One step of a training loop: every tensor enqueued, then every handle waited on.
    std::vector<hvd::HandlePtr> hs(a_.tensors);
    if (names_.empty() || names_[0] != name + ".0") {
      names_.clear();
      inputs_.clear();
      outputs_.clear();
      for (int k = 0; k < a_.tensors; ++k) {
        const size_t at = static_cast<size_t>(k) * count * esize_;
        names_.push_back(name + "." + std::to_string(k));
        inputs_.emplace_back(in_.get() + at, a_.dtype, shape);
        outputs_.emplace_back(out_.get() + at, a_.dtype, shape);
      }
    }
    if (a_.grouped) {
      hs = engine_.GroupedAllreduce(names_, inputs_, outputs_, a_.op, 1.0, 1.0, set_);
    } else {
      for (int k = 0; k < a_.tensors; ++k) {
        hs[k] = engine_.Allreduce(names_[k], inputs_[k], outputs_[k], a_.op, 1.0, 1.0, set_);
      }
    }
    hvd::Status first;
    for (auto& h : hs) {
      hvd::Status s = h->Wait();
      if (first.ok() && !s.ok()) first = std::move(s);  // (OK over OK: no copy per tensor)
    }
    return first;
  }
  hvd::TensorView in(in_.get(), a_.dtype, shape), out(out_.get(), a_.dtype, shape);
  char* dst = out_.get();
  const size_t cap = out_capacity_, esize = esize_;
  hvd::OutputAllocator alloc = [dst, cap, esize](const std::vector<int64_t>& s) -> void* {
    size_t n = 1;
    for (int64_t d : s) n *= static_cast<size_t>(d);
    return n * esize <= cap ? dst : nullptr;
  };
  hvd::HandlePtr h;
  switch (a_.coll) {
    case RawCollective::kAllreduce: h = engine_.Allreduce(name, in, out, a_.op, 1.0, 1.0, set_); break;
    case RawCollective::kAllgather: h = engine_.Allgather(name, in, alloc, set_); break;
    case RawCollective::kBroadcast:  // from the set's first rank (its world rank)
      h = engine_.Broadcast(name, in, out, engine_.ProcessSetRanks(set_)[0], set_);
      break;
    case RawCollective::kAlltoall: h = engine_.Alltoall(name, in, {}, alloc, set_); break;
    case RawCollective::kReducescatter:
      h = engine_.Reducescatter(name, in, a_.op, 1.0, 1.0, alloc, set_);
      break;
  }
  return h->Wait();
}

// One size: warmup, timed iterations, max over ranks, check. Returns the wrong count (all ranks).
int64_t Bench::RunSize(size_t count) {
  const size_t bytes = count * esize_;
  const int iters = ItersForSize(a_, bytes * a_.tensors);
  const std::string name = std::string("bench.") + CollectiveName(a_.coll) + "." +
                           std::to_string(bytes);
  // --tensors: each tensor's input from its own start (a smaller size's tensors overwrote the
  // prefix that Run() filled for the first).
  for (int k = 0; a_.tensors > 1 && k < a_.tensors; ++k) {
    Fill(in_.get() + k * bytes, count, a_.dtype, rank_);
  }
  std::vector<double> samples(iters);
  std::vector<double> one(a_.paired ? iters : 0);  // --paired: the one tensor's samples
  int64_t wrong_one = 0;
  // Negotiation's share of the timed steps (--tensors): this rank's counters around each step.
  // ns, request and response lists (or round parts) sent, ns of it per-tensor bookkeeping
  // fast-path steps (collectives of cached tensors) and those taken again, per step
  double negotiation[5] = {0, 0, 0, 0, 0};
  for (int it = -a_.warmup; it < iters; ++it) {
    hvd::Status st;
    double seconds = 0;
    if (!a_.raw) {
      st = engine_.Barrier()->Wait();
      if (!st.ok()) Die(rank_, "barrier", st);
    }
    if (a_.paired) {  // one tensor of the step's bytes first, so that the check reads the step's
      const auto t0 = std::chrono::steady_clock::now();
      st = RunOnce(name + ".one", count * a_.tensors, nullptr, true);
      const auto t1 = std::chrono::steady_clock::now();
      if (!st.ok()) Die(rank_, "allreduce of one tensor of the step's bytes", st);
      if (it >= 0) one[it] = std::chrono::duration<double>(t1 - t0).count();
      if (it == iters - 1 && a_.check) wrong_one = CountWrongInSteps(count);
      st = engine_.Barrier()->Wait();
      if (!st.ok()) Die(rank_, "barrier", st);
    }
    const hvd::NegotiationCounters before = hvd::ReadNegotiationCounters(engine_);
    const auto t0 = std::chrono::steady_clock::now();
    st = RunOnce(name, count, &seconds);
    const auto t1 = std::chrono::steady_clock::now();
    const hvd::NegotiationCounters after = hvd::ReadNegotiationCounters(engine_);
    if (it >= 0) {
      negotiation[0] += static_cast<double>(after.nanoseconds - before.nanoseconds) / iters;
      negotiation[1] += static_cast<double>(after.messages - before.messages) / iters;
      negotiation[2] +=
          static_cast<double>(after.bookkeeping_nanoseconds - before.bookkeeping_nanoseconds) /
          iters;
      negotiation[3] += static_cast<double>(after.fast_path_steps - before.fast_path_steps) / iters;
      negotiation[4] +=
          static_cast<double>(after.fast_path_steps_reused - before.fast_path_steps_reused) / iters;
    }
    if (!st.ok()) Die(rank_, std::string(CollectiveName(a_.coll)) + " of " + std::to_string(bytes) + " bytes", st);
    if (!a_.raw) seconds = std::chrono::duration<double>(t1 - t0).count();
    if (it >= 0) samples[it] = seconds;
  }
  hvd::TensorView tv(samples.data(), hvd::DataType::kFloat64, {iters});
  hvd::Status st = engine_.Allreduce(name + ".times", tv, tv, hvd::ReduceOp::kMax)->Wait();
  if (!st.ok()) Die(rank_, "allreduce max of the times", st);

  std::vector<double> ratios(one.size());  // each pair's: busbw of the step over the one tensor's
  if (a_.paired) {
    hvd::TensorView ov(one.data(), hvd::DataType::kFloat64, {iters});
    st = engine_.Allreduce(name + ".one.times", ov, ov, hvd::ReduceOp::kMax)->Wait();
    if (!st.ok()) Die(rank_, "allreduce max of the one tensor's times", st);
    for (int i = 0; i < iters; ++i) ratios[i] = one[i] / samples[i];
  }

  int64_t wrong[2] = {a_.check ? CountWrongInSteps(count) : 0, wrong_one};
  hvd::TensorView wv(wrong, hvd::DataType::kInt64, {2});
  st = engine_.Allreduce(name + ".wrong", wv, wv, hvd::ReduceOp::kSum)->Wait();
  if (!st.ok()) Die(rank_, "allreduce sum of the wrong counts", st);
  if (world_rank_ == 0) {
    PrintRow(count, samples, wrong[0], a_.tensors, a_.raw ? "hvd-raw" : "hvd");
    if (a_.paired) {
      PrintRow(count * a_.tensors, one, wrong[1], 1, "hvd-one");
      std::sort(ratios.begin(), ratios.end());
      const size_t n = ratios.size();
      if (!a_.csv) {
        std::printf("# paired: busbw of the step of %d tensors over one tensor of its bytes, "
                    "median of the %zu pairs %.3f (quartiles %.3f-%.3f)\n",
                    a_.tensors, n, n % 2 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]),
                    ratios[n / 4], ratios[(3 * n) / 4 - (n >= 4 ? 1 : 0)]);
      }
    }
  }
  if (a_.tensors > 1 && !a_.raw) {
    // Each the most of any rank; the agreement's share too.
    double busiest[4] = {negotiation[0], negotiation[1], negotiation[2],
                         negotiation[0] - negotiation[2]};
    hvd::TensorView nv(busiest, hvd::DataType::kFloat64, {4});
    st = engine_.Allreduce(name + ".negotiation", nv, nv, hvd::ReduceOp::kMax)->Wait();
    if (!st.ok()) Die(rank_, "allreduce max of the negotiation times", st);
    if (world_rank_ == 0 && !a_.csv) {
      std::printf("# negotiation per step (mean): %.1f us on the busiest rank (%.0f ns per tensor), "
                  "%.1f us on rank 0; at most %.1f request or response lists (or round parts) "
                  "sent by a rank\n",
                  busiest[0] / 1e3, busiest[0] / a_.tensors, negotiation[0] / 1e3, busiest[1]);
      std::printf("#   of it, on the busiest rank for each: per-tensor bookkeeping %.1f us "
                  "(%.0f ns per tensor: the drain, the cache lookup, responses built "
                  "from bits); "
                  "the agreement %.1f us (parts and lists made, sent, read and ANDed)\n",
                  busiest[2] / 1e3, busiest[2] / a_.tensors, busiest[3] / 1e3);
      std::printf("#   rank 0: %.2f fast-path collectives per step, %.2f of them with the "
                  "responses of an earlier step taken again\n", negotiation[3], negotiation[4]);
      std::fflush(stdout);
    }
  }
  return wrong[0] + wrong[1];
}

void Bench::PrintHeader() const {
  if (world_rank_ != 0) return;
  if (a_.csv) {
    std::printf("label,ranks,bytes,count,iters,median_us,min_us,algbw_GBps,busbw_GBps,check\n");
  } else {
    const char* op = IsReducing(a_.coll) ? hvd::ReduceOpName(a_.op) : "none";
    std::printf("# hvd_bench %s %s %s, ranks=%d, %s\n", CollectiveName(a_.coll),
                hvd::DataTypeName(a_.dtype), op, size_,
                a_.raw ? "raw (hvd::RunRawCollective: the bare collective after a transport barrier, timed on the background thread)"
                       : "engine (enqueue to Wait(): negotiation, fusion, collective)");
    if (a_.sets > 1) {
      std::printf("# %d process sets of %d ranks each (rank %% %d) at the same time; ranks and "
                  "busbw count in a set, time is the slowest set's\n", a_.sets, size_, a_.sets);
    }
    if (a_.tensors > 1) {
      std::printf("# %d tensors of each size per step, under the same names every step; time is per"
                  " step, data = size x %d\n", a_.tensors, a_.tensors);
      if (a_.grouped) {
        std::printf("# --grouped: each step is one GroupedAllreduce of its %d tensors\n", a_.tensors);
      }
      if (a_.paired) {
        std::printf("# --paired: before each step, after its own barrier, one allreduce of one"
                    " tensor of the step's bytes (row hvd-one: size = those bytes)\n");
      }
    }
    std::printf("# size = bytes of each rank's input buffer, count = its elements; algbw = data/time"
                " with data = size (allgather: size x ranks, the gathered output, as nccl-tests)\n");
    std::printf("# time = median over the timed iterations of the max over ranks (--csv adds the"
                " iteration count and the fastest sample);"
                " GB/s = 1e9 B/s; busbw = algbw x %s\n",
                a_.coll == RawCollective::kAllreduce   ? "2(n-1)/n"
                : a_.coll == RawCollective::kBroadcast ? "1"
                                                       : "(n-1)/n");
    std::printf("%12s %12s %9s %7s %12s %12s %12s %8s\n", "size", "count", "type", "redop",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  }
  std::fflush(stdout);
}

int64_t Bench::CountWrongInSteps(size_t count) const {
  int64_t wrong = 0;
  for (int k = 0; k < a_.tensors; ++k) {
    wrong += checker_.CountWrong(out_.get() + static_cast<size_t>(k) * count * esize_, count);
  }
  return wrong;
}

void Bench::PrintRow(size_t count, std::vector<double>& samples, int64_t wrong, int tensors,
                     const char* label) const {
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  const double med = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  const double data = static_cast<double>(count * esize_) * tensors *
                      (a_.coll == RawCollective::kAllgather ? size_ : 1);
  const double algbw = data / med / 1e9;
  const double busbw = algbw * BusFactor(a_.coll, size_);
  if (a_.csv) {
    std::printf("%s,%d,%zu,%zu,%zu,%.3f,%.3f,%.4f,%.4f,%s\n", label, size_,
                count * esize_, count, n, med * 1e6, samples[0] * 1e6, algbw, busbw,
                !a_.check ? "skip" : wrong ? "FAIL" : "ok");
  } else {
    const std::string w = a_.check ? std::to_string(wrong) : "N/A";
    std::printf("%12zu %12zu %9s %7s %12.2f %12.3f %12.3f %8s\n", count * esize_, count,
                hvd::DataTypeName(a_.dtype),
                IsReducing(a_.coll) ? hvd::ReduceOpName(a_.op) : "none", med * 1e6, algbw, busbw,
                w.c_str());
  }
  std::fflush(stdout);
}

int64_t Bench::Run() {
  const size_t max_count = CountFor(a_.max_bytes);
  const size_t in_bytes = max_count * esize_ * a_.tensors;
  out_capacity_ = in_bytes * (a_.coll == RawCollective::kAllgather ? size_ : 1);
  in_ = AllocPageAligned(in_bytes);
  out_ = AllocPageAligned(out_capacity_);
  if (!in_ || !out_) Die(rank_, "allocation of " + std::to_string(in_bytes + out_capacity_) + " bytes",
                         hvd::Status::Internal("out of memory"));
  Fill(in_.get(), max_count, a_.dtype, rank_);  // v(r, i) depends on i only: every size is a prefix
  std::memset(out_.get(), 0, out_capacity_);    // fault the pages in up front
  PrintHeader();
  int64_t wrong = 0;
  size_t last = 0;
  for (size_t bytes = a_.min_bytes; bytes <= a_.max_bytes; bytes *= a_.factor) {
    const size_t count = CountFor(bytes);
    if (count != last && count <= max_count) wrong += RunSize(count);
    last = count;
    if (bytes > a_.max_bytes / a_.factor) break;  // the next step would overflow
  }
  return wrong;
}

}  // namespace
}  // namespace hvd_bench

int main(int argc, char** argv) {
  hvd_bench::BenchArgs args;
  std::string error;
  if (!hvd_bench::ParseBenchArgs(argc, argv, &args, &error)) {
    std::fprintf(stderr, "hvd_bench: %s\n%s", error.c_str(), hvd_bench::BenchUsage(argv[0]).c_str());
    return 2;
  }
  if (args.help) {
    std::printf("%s", hvd_bench::BenchUsage(argv[0]).c_str());
    return 0;
  }
  if (args.dtype == hvd::DataType::kBool && args.op == hvd::ReduceOp::kAverage &&
      hvd_bench::IsReducing(args.coll)) {
    std::fprintf(stderr, "hvd_bench: -o average is not defined for -d bool\n");
    return 2;
  }
  auto options = hvd::Options::FromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "hvd_bench: %s\n", options.status().ToString().c_str());
    return 1;
  }
  const int k = args.sets, world = options->size;
  if (k > 1 && (world % k != 0 || world == k)) {
    std::fprintf(stderr, "hvd_bench: --sets %d needs a world size that is a multiple of %d, larger "
                 "than it (the world has %d ranks)\n", k, k, world);
    return 2;
  }
  for (int j = 0; k > 1 && j < k; ++j) {
    std::vector<int> ranks;
    for (int r = j; r < world; r += k) ranks.push_back(r);
    options->process_sets.push_back(ranks);  // ids 1..k
  }
  auto engine = hvd::Engine::Create(*options);
  if (!engine.ok()) {
    std::fprintf(stderr, "hvd_bench: engine init failed: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const int rank = (*engine)->rank();
  hvd_bench::Bench bench(**engine, args, k > 1 ? rank % k + 1 : hvd::kGlobalProcessSet,
                         k > 1 ? rank / k : rank, k > 1 ? world / k : world);
  const int64_t wrong = bench.Run();
  hvd::Status st = (*engine)->Shutdown();
  if (!st.ok()) std::fprintf(stderr, "hvd_bench: shutdown: %s\n", st.ToString().c_str());
  if (wrong) {
    std::fprintf(stderr, "hvd_bench: %lld wrong elements\n", static_cast<long long>(wrong));
    return 1;
  }
  return 0;
}
