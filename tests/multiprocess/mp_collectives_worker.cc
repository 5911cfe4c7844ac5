// The multi-process worker, run under hvdrun (`hvdrun -np N mp_collectives_worker [MODE]`).
//
// Modes:
//   (none) / --checks     every check group (see mp_checks.h); one summary line per group,
//                          exit 1 if any check failed.
//   --memory              20,000 allreduces under one name; the resident set size after them
//                          must be within 2 MiB of the size after the first 1,000.
//   --memory-cycling      the same over 3,000 names in turn (response-cache eviction), measured
//                          from allreduce 4,000.
//   --soak=N              N allreduces over 3,000 names in turn (more than the response cache
//                          holds); resident set and open descriptors sampled ten times; after
//                          allreduce 10,000 the resident set may grow by at most 1 MiB and the
//                          descriptors not at all (scripts/soak.sh).
//   --chaos               a job with every phase in a second or two: start, negotiation of
//                          many small tensors, large collectives, shutdown. Each rank prints
//                          "CHAOS-PID rank r pid p" first, CHAOS-READY once the job formed,
//                          CHAOS-SHUTDOWN before shutting down, and "CHAOS-DONE rank r" or
//                          "CHAOS-ERROR rank r: <status>" last (scripts/chaos.sh kills ranks).
//   --process-sets        the process-set checks (mp_process_sets.cc); run with
//                          HVD_DYNAMIC_PROCESS_SETS=1.
//   --process-sets-differ ranks that give different lists of sets at start: every rank's init
//                         fails saying so, listing each rank's (nothing waits).
//   --process-sets-static the engine started with the set {0, size - 1} (Options::process_sets),
//                         given again in another order, and the world's ranks (both skipped).
//   --caller-progress     a waiting caller runs the engine's work (mp_control.cc); run with a long
//                          HVD_SPIN_MICROSECONDS.
//   --waiting-cpu         the CPU a rank uses idle and through cycle-time waits (mp_control.cc);
//                          run with HVD_CYCLE_TIME=20.
//   --steps[=N]           two training steps of cached tensors alternating, one of N tensors of
//                          4 KiB (default 1,000), one of 4 MiB (mp_control.cc): values, each
//                          step one collective whose responses are kept; a tensor held while
//                          some rank has not announced another goes after the hold.
//   --random=STEPS[,SEED] STEPS steps of operations of every kind drawn at random (the same on
//                          every rank), submitted in an order of each rank's own; every value
//                          checked (mp_random.cc). SEED defaults to 1; run with
//                          HVD_DYNAMIC_PROCESS_SETS=1 to have process sets in them.
//   --peerloss=V          rank V SIGKILLs itself after a warm-up while the others keep
//                          submitting; every survivor must fail with PeerLost/Timeout naming
//                          rank V within HVD_TIMEOUT_SECONDS + 10 s. Survivors print
//                          "PEERLOSS-OK rank r" (or "PEERLOSS-FAIL ...") and exit 0 (or 1).
//   --peerloss-cached=V   the same with one name every step: the survivors' tensors wait on
//                          the fast path (in rounds, with HVD_SYMMETRIC_NEGOTIATION=on).
//   --long-host-work=MIB  an allgather of MIB MiB a rank, and an out-of-place allreduce and
//                          broadcast of MIB MiB, each into fresh memory (its pages touched for the
//                          first time by the engine's copies: seconds on some VMs). Run with a
//                          small HVD_TIMEOUT_SECONDS: the peers must hear the rank throughout.
//   --quit=V              rank V shuts hvd down after a warm-up (as a script that raised does),
//                          then exits 3 once the others have (a slow teardown); they fail with
//                          Aborted naming rank V, print "QUIT-OK rank r" and exit 1 at once.
//                          hvdrun must name rank V as the cause and exit 3.
#include <dirent.h>
#include <sys/mman.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mp_checks.h"

namespace mp {
namespace {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::TensorView;

std::unique_ptr<hvd::Engine> CreateOrDie() {
  auto e = hvd::Engine::CreateFromEnvironment();
  if (!e.ok()) {
    std::printf("FAIL [init] Engine::CreateFromEnvironment: %s\n", e.status().ToString().c_str());
    std::exit(2);
  }
  return std::move(*e);
}

// One group of checks on an engine from the environment: prints the rank's verdict and returns
// the exit status.
int RunGroup(const char* what, const std::function<int(hvd::Engine&, Checker&)>& checks) {
  auto e = CreateOrDie();
  Checker ck(e->rank(), e->size());
  const int failures = checks(*e, ck);
  std::printf("[mp] rank %d of %d: %s %s\n", e->rank(), e->size(), what,
              failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}

int RunSteps(int tensors) {
  return RunGroup("alternating steps",
                  [tensors](hvd::Engine& e, Checker& ck) { return RunStepChecks(e, ck, tensors); });
}

int RunChecks() {
  auto e = CreateOrDie();
  Checker ck(e->rank(), e->size());
  auto t0 = Clock::now();
  int failures = 0;
  failures += RunAllreduceChecks(*e, ck);
  failures += RunMovementChecks(*e, ck);
  failures += RunReducescatterChecks(*e, ck);
  failures += RunBarrierAndJoinChecks(*e, ck);
  failures += RunThreadChecks(*e, ck);
  failures += RunMismatchChecks(*e, ck);
  failures += RunShutdownChecks(*e, ck);
  std::printf("[mp] rank %d of %d: %s (%d failed checks, %.1f s)\n", e->rank(), e->size(),
              failures ? "FAILED" : "all checks passed", failures, SecondsSince(t0));
  return failures ? 1 : 0;
}

// Ranks that give different lists of sets at start: rank 0 the set {0}, another rank a
// second set too, the rest none. Every rank's Create fails with InvalidArgument listing every
// rank's sets ("SETS-DIFFER-OK rank r"), instead of rank 0 waiting to add a set the others never
// add.
int RunSetsDiffer() {
  auto o = hvd::Options::FromEnvironment();
  if (!o.ok()) {
    std::printf("FAIL [init] %s\n", o.status().ToString().c_str());
    return 2;
  }
  const int r = o->rank;
  // Rank 0 gives {0} and the world's ranks (which adds nothing: left out), rank 1 nothing but
  // the world, and the last rank (at 3 ranks and more) {0} and another set.
  std::vector<int> world(o->size);
  for (int q = 0; q < o->size; ++q) world[q] = o->size - 1 - q;
  if (r == 0) o->process_sets = {{0}, world};
  if (r == 1) o->process_sets = {world};
  if (r == o->size - 1 && r > 1) o->process_sets = {{0}, {1, r}};
  auto created = hvd::Engine::Create(*o);
  const std::string want = "rank 0 [[0]], rank 1 []";
  if (created.ok() || created.status().code() != hvd::StatusCode::kInvalidArgument ||
      created.status().message().find("differ across ranks") == std::string::npos ||
      created.status().message().find(want) == std::string::npos) {
    std::printf("FAIL rank %d: sets that differ at start gave %s\n", r,
                created.ok() ? "an engine" : created.status().ToString().c_str());
    return 1;
  }
  std::printf("SETS-DIFFER-OK rank %d: %s\n", r, created.status().message().c_str());
  return 0;
}

int RunSetChecks(bool at_start) {
  std::unique_ptr<hvd::Engine> e;
  if (at_start) {
    auto o = hvd::Options::FromEnvironment();
    if (o.ok()) {
      // The set {0, size - 1}, then (skipped, as in Horovod) the same ranks in another order
      // and the world's ranks.
      std::vector<int> world(o->size);
      for (int r = 0; r < o->size; ++r) world[r] = o->size - 1 - r;
      o->process_sets = {{0, o->size - 1}, {o->size - 1, 0}, world};
    }
    hvd::StatusOr<std::unique_ptr<hvd::Engine>> created =
        o.ok() ? hvd::Engine::Create(*o) : hvd::StatusOr<std::unique_ptr<hvd::Engine>>(o.status());
    if (!created.ok()) {
      std::printf("FAIL [init] Engine::Create with process sets: %s\n", created.status().ToString().c_str());
      return 2;
    }
    e = std::move(*created);
  } else {
    e = CreateOrDie();
  }
  Checker ck(e->rank(), e->size());
  int failures = at_start ? RunStaticProcessSetChecks(*e, ck) : RunProcessSetChecks(*e, ck);
  std::printf("[mp] rank %d of %d: %s (%d failed checks)\n", e->rank(), e->size(),
              failures ? "FAILED" : "all checks passed", failures);
  return failures ? 1 : 0;
}

// Resident set size in bytes, from /proc/self/statm (second field, in pages).
long ResidentBytes() {
  std::ifstream f("/proc/self/statm");
  long size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// `total` allreduces of 16 float32 (Sum), the k-th named name_of(k); checks the values now and
// then and that the resident set after all of them is within 2 MiB of the size after `settle`.
template <typename NameFn>
int RunMemory(const char* label, int total, int settle, NameFn name_of) {
  auto e = CreateOrDie();
  Checker ck(e->rank(), e->size());
  const int r = e->rank(), n = e->size();
  ck.Begin(label);
  long after_settle = 0;
  float buf[16];
  TensorView v(buf, DataType::kFloat32, {16});
  for (int k = 1; k <= total; ++k) {
    for (int i = 0; i < 16; ++i) buf[i] = static_cast<float>(r + i);
    hvd::Status s = WaitDone(e->Allreduce(name_of(k), v, v, ReduceOp::kSum));
    if (!ck.ExpectOk(s, "allreduce " + std::to_string(k) + " dtype=float32 op=sum count=16")) break;
    if (k % 997 == 0) {
      const float want = static_cast<float>(n * (n - 1) / 2 + 5 * n);
      ck.Expect(buf[5] == want, "allreduce " + std::to_string(k) + " value");
    }
    if (k == settle) after_settle = ResidentBytes();
  }
  const long after_all = ResidentBytes();
  std::printf("[mp] %s: resident %ld KiB after %d allreduces, %ld KiB after %d (rank %d)\n", label,
              after_settle >> 10, settle, after_all >> 10, total, r);
  ck.Expect(after_all - after_settle <= (2L << 20),
            "resident set grew by " + std::to_string((after_all - after_settle) >> 10) +
                " KiB between allreduce " + std::to_string(settle) + " and " +
                std::to_string(total) + " (allowed 2048 KiB)");
  ck.ExpectOk(WaitDone(e->Barrier()), "final barrier");
  return ck.End() ? 1 : 0;
}

int OpenDescriptors() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n - 3;  // ".", ".." and the directory's own descriptor
}

int RunSoak(long total) {
  auto e = CreateOrDie();
  Checker ck(e->rank(), e->size());
  const int r = e->rank(), n = e->size();
  const long settle = std::min(total, 10000L);
  ck.Begin("soak");
  long rss_settled = 0, rss_max = 0;
  int fds_settled = 0, fds_max = 0;
  float buf[16];
  TensorView v(buf, DataType::kFloat32, {16});
  auto t0 = Clock::now();
  for (long k = 1; k <= total; ++k) {
    for (int i = 0; i < 16; ++i) buf[i] = static_cast<float>(r + i);
    std::string name = "soak." + std::to_string(k % 3000);
    if (!ck.ExpectOk(WaitDone(e->Allreduce(name, v, v, ReduceOp::kSum)),
                     "allreduce " + std::to_string(k))) {
      break;
    }
    if (k % 997 == 0) {
      ck.Expect(buf[5] == static_cast<float>(n * (n - 1) / 2 + 5 * n),
                "allreduce " + std::to_string(k) + " value");
    }
    if (k == settle) {
      rss_settled = ResidentBytes();
      fds_settled = OpenDescriptors();
    }
    if (k >= settle && (k % std::max(1L, total / 10) == 0 || k == total)) {
      const long rss = ResidentBytes();
      const int fds = OpenDescriptors();
      rss_max = std::max(rss_max, rss);
      fds_max = std::max(fds_max, fds);
      if (r == 0) {
        std::printf("[soak] %ld allreduces, %.1f s: resident %ld KiB, %d descriptors\n", k,
                    SecondsSince(t0), rss >> 10, fds);
      }
    }
  }
  std::printf("[soak] rank %d: resident %ld KiB after %ld allreduces, at most %ld KiB after; "
              "descriptors %d, at most %d\n",
              r, rss_settled >> 10, settle, rss_max >> 10, fds_settled, fds_max);
  ck.Expect(rss_max - rss_settled <= (1L << 20),
            "resident set grew by " + std::to_string((rss_max - rss_settled) >> 10) +
                " KiB after allreduce " + std::to_string(settle) + " (allowed 1024 KiB)");
  ck.Expect(fds_max == fds_settled, "open descriptors went from " + std::to_string(fds_settled) +
                                        " to " + std::to_string(fds_max));
  ck.ExpectOk(WaitDone(e->Barrier()), "final barrier");
  return ck.End() ? 1 : 0;
}

constexpr int kChaosRounds = 40;

int RunChaos() {
  const char* env_rank = std::getenv("HVD_RANK");
  const int r = env_rank ? std::atoi(env_rank) : 0;
  std::printf("CHAOS-PID rank %d pid %d\n", r, static_cast<int>(getpid()));
  std::fflush(stdout);
  auto created = hvd::Engine::CreateFromEnvironment();
  auto fail = [r](const hvd::Status& s) {
    std::printf("CHAOS-ERROR rank %d: %s\n", r, s.ToString().c_str());
    std::fflush(stdout);
    return 1;
  };
  if (!created.ok()) return fail(created.status());
  hvd::Engine& e = **created;
  std::printf("CHAOS-READY rank %d\n", r);
  std::fflush(stdout);
  std::vector<float> small(64, 1.0f), large(1 << 20, 1.0f);  // 4 MiB: a pipelined ring
  for (int round = 0; round < kChaosRounds; ++round) {
    std::vector<hvd::HandlePtr> hs;
    for (int t = 0; t < 16; ++t) {
      TensorView v(small.data() + 4 * t, DataType::kFloat32, {4});
      hs.push_back(e.Allreduce("chaos.small." + std::to_string(t), v, v, ReduceOp::kAverage));
    }
    TensorView lv(large.data(), DataType::kFloat32, {1 << 20});
    hs.push_back(e.Allreduce("chaos.large", lv, lv, ReduceOp::kAverage));
    for (auto& h : hs) {
      hvd::Status s = WaitDone(h, e.options().timeout_seconds + 20);
      if (!s.ok()) return fail(s);
    }
  }
  std::printf("CHAOS-SHUTDOWN rank %d\n", r);
  std::fflush(stdout);
  hvd::Status s = e.Shutdown();
  if (!s.ok()) return fail(s);
  std::printf("CHAOS-DONE rank %d\n", r);
  return 0;
}

int RunPeerLoss(int victim, bool cached) {
  auto e = CreateOrDie();
  const int r = e->rank();
  const double timeout = e->options().timeout_seconds;
  float x[64] = {0};
  TensorView v(x, DataType::kFloat32, {64});
  hvd::Status warm = WaitDone(e->Allreduce("peerloss.warmup", v, v, ReduceOp::kSum));
  if (!warm.ok()) {
    std::printf("PEERLOSS-FAIL rank %d: warm-up failed: %s\n", r, warm.ToString().c_str());
    return 1;
  }
  if (r == victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // survivors are now waiting
    std::printf("[mp] rank %d kills itself\n", r);
    std::fflush(stdout);
    raise(SIGKILL);
  }
  auto t0 = Clock::now();
  hvd::Status s;
  int steps = 0;
  while (s.ok() && SecondsSince(t0) < timeout + 20) {
    const std::string name = cached ? "peerloss.step" : "peerloss.step" + std::to_string(steps);
    ++steps;
    s = WaitDone(e->Allreduce(name, v, v, ReduceOp::kSum), timeout + 10);
  }
  return PeerLossVerdict(*e, victim, t0, steps, s, v);
}

// A rank's own failure whose effects reach hvdrun first (see --quit above).
// --long-host-work: see the file comment. Values are checked at every 4,093rd element and the
// last, against formulas.
int RunLongHostWork(size_t mib) {
  return RunGroup("long host work", [mib](hvd::Engine& e, Checker& ck) {
    ck.Begin("long host work");
    const int r = e.rank(), n = e.size();
    const size_t bytes = mib << 20;
    auto fresh = [](size_t len) {
      void* p = ::mmap(nullptr, std::max<size_t>(len, 1), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
    };
    auto sampled = [](size_t count, const std::function<bool(size_t)>& ok) {
      for (size_t i = 0; i < count; i += 4093) {
        if (!ok(i)) return false;
      }
      return count == 0 || ok(count - 1);
    };
    const auto t0 = Clock::now();
    // Allgather: rank q's block holds (i * 7 + q * 3) % 101.
    std::vector<int8_t> mine(bytes);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<int8_t>((i * 7 + r * 3) % 101);
    uint8_t* gathered = nullptr;
    const int64_t len = static_cast<int64_t>(bytes);
    hvd::Status s = e.Allgather("long.allgather", TensorView(mine.data(), DataType::kInt8, {len}),
                                [&](const std::vector<int64_t>& shape) -> void* {
                                  return gathered = fresh(static_cast<size_t>(shape[0]));
                                })->Wait();
    if (ck.ExpectOk(s, "allgather of " + std::to_string(mib) + " MiB a rank")) {
      ck.Expect(sampled(bytes * n,
                        [&](size_t i) {
                          const size_t q = i / bytes, at = i % bytes;
                          return static_cast<int8_t>(gathered[i]) ==
                                 static_cast<int8_t>((at * 7 + q * 3) % 101);
                        }),
                "allgather values");
    }
    if (gathered) ::munmap(gathered, bytes * n);
    mine = std::vector<int8_t>();
    // Allreduce (sum) out of place: rank q gives (i % 1000) + q.
    const size_t count = bytes / 4;
    std::vector<float> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(i % 1000 + r);
    auto* out = reinterpret_cast<float*>(fresh(bytes));
    const int64_t c = static_cast<int64_t>(count);
    s = e.Allreduce("long.allreduce", TensorView(in.data(), DataType::kFloat32, {c}),
                    TensorView(out, DataType::kFloat32, {c}), ReduceOp::kSum)->Wait();
    if (ck.ExpectOk(s, "out-of-place allreduce of " + std::to_string(mib) + " MiB")) {
      const double ranks = n * (n - 1) / 2.0;
      ck.Expect(sampled(count, [&](size_t i) { return out[i] == n * (i % 1000) + ranks; }),
                "allreduce values");
    }
    ::munmap(out, bytes);
    in = std::vector<float>();
    // Broadcast from the last rank, not in place: (i * 13 + root) % 251.
    const int root = n - 1;
    std::vector<uint8_t> src(bytes);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>((i * 13 + root) % 251);
    uint8_t* dst = fresh(bytes);
    s = e.Broadcast("long.broadcast", TensorView(src.data(), DataType::kUInt8, {len}),
                    TensorView(dst, DataType::kUInt8, {len}), root)->Wait();
    if (ck.ExpectOk(s, "broadcast of " + std::to_string(mib) + " MiB, not in place")) {
      ck.Expect(sampled(bytes, [&](size_t i) { return dst[i] == (i * 13 + root) % 251; }),
                "broadcast values");
    }
    ::munmap(dst, bytes);
    std::printf("[mp] rank %d: long host work took %.1f s\n", r, SecondsSince(t0));
    return ck.End();
  });
}

int RunQuit(int quitter) {
  auto e = CreateOrDie();
  const int r = e->rank();
  float x[64] = {0};
  TensorView v(x, DataType::kFloat32, {64});
  int64_t pid = ::getpid();
  auto pids = e->Allgather("quit.pids", TensorView(&pid, DataType::kInt64, {1}));
  hvd::Status warm = WaitDone(pids);
  if (warm.ok()) warm = WaitDone(e->Allreduce("quit.warmup", v, v, ReduceOp::kSum));
  if (!warm.ok()) {
    std::printf("QUIT-FAIL rank %d: warm-up failed: %s\n", r, warm.ToString().c_str());
    return 2;
  }
  if (r == quitter) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are now waiting
    (void)e->Shutdown();
    // A slow teardown: this rank exits after every other one has (hvdrun reaps them at once),
    // or after 30 s.
    std::vector<int64_t> others(e->size());
    std::memcpy(others.data(), pids->output_bytes().data(), others.size() * sizeof(int64_t));
    const auto t0 = Clock::now();
    for (int q = 0; q < e->size() && SecondsSince(t0) < 30; ++q) {
      while (q != r && ::kill(static_cast<pid_t>(others[q]), 0) == 0 && SecondsSince(t0) < 30) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return 3;
  }
  const double timeout = e->options().timeout_seconds;
  auto t0 = Clock::now();
  hvd::Status s;
  for (int step = 0; s.ok() && SecondsSince(t0) < timeout + 20; ++step) {
    s = WaitDone(e->Allreduce("quit.step" + std::to_string(step), v, v, ReduceOp::kSum),
                 timeout + 10);
  }
  const std::string who = "rank " + std::to_string(quitter) + " called shutdown";
  if (s.code() == hvd::StatusCode::kAborted && s.message().find(who) != std::string::npos) {
    std::printf("QUIT-OK rank %d\n", r);
  } else {
    std::printf("QUIT-FAIL rank %d: %s\n", r, s.ToString().c_str());
  }
  return 1;
}

}  // namespace
}  // namespace mp

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "--checks";
  if (mode == "--checks") return mp::RunChecks();
  if (mode == "--process-sets") return mp::RunSetChecks(false);
  if (mode == "--caller-progress") return mp::RunGroup("caller progress", mp::RunCallerProgressChecks);
  if (mode == "--steps") return mp::RunSteps(1000);
  if (mode == "--steps-batched") return mp::RunGroup("a step in batches", mp::RunBatchedStepChecks);
  if (mode == "--waiting-cpu") return mp::RunGroup("waiting cpu", mp::RunWaitingCpuChecks);
  if (mode.rfind("--steps=", 0) == 0) return mp::RunSteps(std::max(1, std::atoi(mode.c_str() + 8)));
  if (mode == "--process-sets-static") return mp::RunSetChecks(true);
  if (mode == "--process-sets-differ") return mp::RunSetsDiffer();
  if (mode == "--memory") {
    return mp::RunMemory("memory", 20000, 1000, [](int) { return std::string("memory.same.name"); });
  }
  if (mode == "--memory-cycling") {
    // 3,000 names in turn: more than the response cache holds (1024 by default), so entries
    // are evicted and replaced all the time. By allreduce 4,000 every name has been seen.
    return mp::RunMemory("memory cycling", 20000, 4000,
                         [](int k) { return "memory.cycle." + std::to_string(k % 3000); });
  }
  if (mode.rfind("--peerloss=", 0) == 0) {
    return mp::RunPeerLoss(std::atoi(mode.c_str() + 11), false);
  }
  if (mode.rfind("--peerloss-cached=", 0) == 0) {
    return mp::RunPeerLoss(std::atoi(mode.c_str() + 18), true);
  }
  if (mode.rfind("--quit=", 0) == 0) return mp::RunQuit(std::atoi(mode.c_str() + 7));
  if (mode.rfind("--long-host-work=", 0) == 0) {
    return mp::RunLongHostWork(static_cast<size_t>(std::atol(mode.c_str() + 17)));
  }
  if (mode.rfind("--soak=", 0) == 0) return mp::RunSoak(std::atol(mode.c_str() + 7));
  if (mode == "--chaos") return mp::RunChaos();
  if (mode.rfind("--random=", 0) == 0) {
    const char* arg = mode.c_str() + 9;
    const char* comma = std::strchr(arg, ',');
    const long long steps = std::atoll(arg);
    const unsigned long long seed = comma ? std::strtoull(comma + 1, nullptr, 10) : 1;
    return mp::RunGroup("random steps", [steps, seed](hvd::Engine& e, mp::Checker& ck) {
      return mp::RunRandomSteps(e, ck, steps, seed);
    });
  }
  std::fprintf(stderr,
               "usage: %s [--checks | --process-sets | --process-sets-static | --caller-progress | --steps[=N] | --steps-batched | --waiting-cpu | --memory | --memory-cycling | --soak=N | --chaos | --random=STEPS[,SEED] | "
               "--peerloss=RANK | --peerloss-cached=RANK | --quit=RANK | --long-host-work=MIB]\n",
               argv[0]);
  return 2;
}
