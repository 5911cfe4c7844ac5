// Barrier, join, many caller threads, the engine's work run by a waiting caller, and training
// steps on the fast path.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hvd/raw.h"
#include "mp_checks.h"
#include "sanitized.h"

namespace mp {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::TensorView;

namespace {

void CheckBarrier(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  for (int k = 0; k < 20; ++k) ck.ExpectOk(WaitDone(e.Barrier()), "barrier " + std::to_string(k));
  // Rank r arrives r * 150 ms late: no rank may leave before the last one arrived. The 100 ms
  // slack covers the ranks leaving the first barrier at slightly different times.
  ck.ExpectOk(WaitDone(e.Barrier()), "barrier before the staggered one");
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(150 * r));
  ck.ExpectOk(WaitDone(e.Barrier()), "staggered barrier");
  const double waited = SecondsSince(t0), least = 0.15 * (n - 1) - 0.1;
  ck.Expect(waited >= least, "staggered barrier returned after " + std::to_string(waited) +
                                 " s, before the last rank arrived (>= " + std::to_string(least) + " s)");
}

// One round of join: rank r runs steps(r) steps, then joins. Each step is a float32 and an int32
// allreduce (Sum), where ranks that have joined contribute zeros, and an int32 allgather, which
// fails on every rank that submitted it once some rank has joined (as in Horovod).
void JoinRound(hvd::Engine& e, Checker& ck, int round, int (*steps)(int r, int n)) {
  const int r = e.rank(), n = e.size();
  int last = 0;
  for (int q = 1; q < n; ++q) {
    if (steps(q, n) > steps(last, n)) last = q;
  }
  const std::string tag = "join" + std::to_string(round);
  auto fval = [](int q, int k, int64_t i) { return 1.0 + (q + k + i) % 5; };
  auto ival = [](int q, int k, int64_t i) { return 10.0 * q + k + i; };
  for (int k = 0; k < steps(r, n); ++k) {
    const std::string step = tag + ".step" + std::to_string(k);
    Buffer f(DataType::kFloat32, 17), in(DataType::kInt32, 5), g(DataType::kInt32, 2 * (1 + r));
    for (int64_t i = 0; i < 17; ++i) Put(DataType::kFloat32, f.data(), i, fval(r, k, i));
    for (int64_t i = 0; i < 5; ++i) Put(DataType::kInt32, in.data(), i, ival(r, k, i));
    for (int64_t i = 0; i < 2 * (1 + r); ++i) Put(DataType::kInt32, g.data(), i, Pattern(DataType::kInt32, r, i, k));
    TensorView fv(f.data(), DataType::kFloat32, {17}), iv(in.data(), DataType::kInt32, {5});
    auto hf = e.Allreduce(step + ".f", fv, fv, ReduceOp::kSum);
    auto hi = e.Allreduce(step + ".i", iv, iv, ReduceOp::kSum);
    auto hg = e.Allgather(step + ".g", TensorView(g.data(), DataType::kInt32, {1 + r, 2}));
    auto present = [&](int q) { return steps(q, n) > k; };
    auto sum = [&](auto val, int64_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += present(q) ? val(q, k, i) : 0;
      return s;
    };
    if (ck.ExpectOk(WaitDone(hf), step + ".f dtype=float32 op=sum count=17")) {
      ck.ExpectElements(DataType::kFloat32, f.data(), 17, [&](int64_t i) { return sum(fval, i); },
                        step + ".f: joined ranks contribute zeros");
    }
    if (ck.ExpectOk(WaitDone(hi), step + ".i dtype=int32 op=sum count=5")) {
      ck.ExpectElements(DataType::kInt32, in.data(), 5, [&](int64_t i) { return sum(ival, i); },
                        step + ".i: joined ranks contribute zeros");
    }
    bool all_present = true;
    for (int q = 0; q < n; ++q) all_present = all_present && present(q);
    if (!all_present) {
      hvd::Status s = WaitDone(hg);
      ck.Expect(s.code() == hvd::StatusCode::kInvalidArgument &&
                    s.message().find("Allgather is not supported with Join at this time") != std::string::npos,
                step + ".g: allgather with a joined rank fails: " + s.ToString());
    } else if (ck.ExpectOk(WaitDone(hg), step + ".g allgather dtype=int32")) {
      std::vector<std::pair<int, int64_t>> origin;
      for (int q = 0; q < n; ++q) {
        for (int64_t j = 0; j < 2 * (1 + q); ++j) origin.emplace_back(q, j);
      }
      const int64_t total = static_cast<int64_t>(origin.size());
      ck.Expect(hg->output_shape() == std::vector<int64_t>{total / 2, 2},
                step + ".g: output shape " + ShapeStr(hg->output_shape()));
      if (hg->output_bytes().size() >= static_cast<size_t>(total) * 4) {
        ck.ExpectElements(DataType::kInt32, hg->output_bytes().data(), total,
                          [&](int64_t i) {
                            auto [q, j] = origin[static_cast<size_t>(i)];
                            return Pattern(DataType::kInt32, q, j, k);
                          },
                          step + ".g values");
      }
    }
  }
  auto hj = e.Join();
  if (ck.ExpectOk(WaitDone(hj), tag + ": join")) {
    ck.Expect(hj->join_last_rank() == last, tag + ": join_last_rank() is " +
                                                std::to_string(hj->join_last_rank()) +
                                                ", expected " + std::to_string(last));
  }
  // After the join every rank takes part again.
  int64_t x = r + 1;
  TensorView xv(&x, DataType::kInt64, {1});
  if (ck.ExpectOk(WaitDone(e.Allreduce(tag + ".after", xv, xv, ReduceOp::kSum)), tag + ".after")) {
    ck.Expect(x == int64_t{n} * (n + 1) / 2, tag + ".after: sum of rank+1 over all ranks is " + std::to_string(x));
  }
}

int StepsRotated(int r, int n) { return 2 + 2 * ((r + 1) % n); }  // last to join: n-2 (n >= 2)
int StepsByRank(int r, int n) { return 1 + r; }                   // last to join: n-1

// Rank n-1 joins at once; meanwhile the others' reducescatter and broadcast are refused (they
// cannot run with a joined rank, as in Horovod) and their barrier works. Needs n >= 2.
void JoinRefusals(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  hvd::HandlePtr hj;
  if (r == n - 1) {
    hj = e.Join();
  } else {
    float x[6] = {1, 2, 3, 4, 5, 6};
    hvd::Status s = WaitDone(e.Reducescatter("join2.rs", TensorView(x, DataType::kFloat32, {6}), ReduceOp::kSum));
    ck.Expect(s.code() == hvd::StatusCode::kInvalidArgument &&
                  s.message().find("join2.rs") != std::string::npos,
              "join2.rs: reducescatter while rank " + std::to_string(n - 1) +
                  " has joined fails with InvalidArgument naming it: " + s.ToString());
    int64_t b[3] = {r == 0 ? 7 : 0, r == 0 ? 8 : 0, r == 0 ? 9 : 0};
    TensorView bv(b, DataType::kInt64, {3});
    s = WaitDone(e.Broadcast("join2.bc", bv, bv, 0));
    ck.Expect(s.code() == hvd::StatusCode::kInvalidArgument &&
                  s.message().find("Broadcast is not supported with Join at this time") != std::string::npos &&
                  b[1] == (r == 0 ? 8 : 0),
              "join2.bc: broadcast with a joined rank fails and leaves the tensor: " + s.ToString());
    ck.ExpectOk(WaitDone(e.Barrier()), "join2: barrier with a joined rank");
    hj = e.Join();
  }
  if (ck.ExpectOk(WaitDone(hj), "join2: join")) {
    ck.Expect(hj->join_last_rank() >= 0 && hj->join_last_rank() < n - 1,
              "join2: join_last_rank() " + std::to_string(hj->join_last_rank()) + " is not the rank that joined first");
  }
}

void CheckJoin(hvd::Engine& e, Checker& ck) {
  JoinRound(e, ck, 0, StepsRotated);
  JoinRound(e, ck, 1, StepsByRank);
  if (e.size() > 1) JoinRefusals(e, ck);
}

// Four caller threads submit allreduces with distinct names at once.
void CheckThreads(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  auto worker = [&](int t) {
    const int ops = 40;
    std::vector<std::unique_ptr<Buffer>> bufs(ops);
    std::vector<hvd::HandlePtr> hs(ops);
    auto meta = [&](int k, DataType* dt, int64_t* count, int64_t* salt) {
      *dt = k % 2 ? DataType::kInt64 : DataType::kFloat32;
      *count = 1 + (t * 13 + k * 7) % 300;
      *salt = 9000 + t * 100 + k;
    };
    auto submit = [&](int k) {
      DataType dt;
      int64_t count, salt;
      meta(k, &dt, &count, &salt);
      bufs[k] = std::make_unique<Buffer>(dt, count);
      for (int64_t i = 0; i < count; ++i) Put(dt, bufs[k]->data(), i, ReduceInput(dt, ReduceOp::kSum, r, n, i, salt));
      TensorView v(bufs[k]->data(), dt, {count});
      hs[k] = e.Allreduce("thread" + std::to_string(t) + "." + std::to_string(k), v, v, ReduceOp::kSum);
    };
    auto verify = [&](int k) {
      DataType dt;
      int64_t count, salt;
      meta(k, &dt, &count, &salt);
      std::string what = "thread " + std::to_string(t) + " op " + std::to_string(k) +
                         " dtype=" + Str(dt) + " op=sum count=" + std::to_string(count);
      if (!ck.ExpectOk(WaitDone(hs[k]), what)) return;
      ck.ExpectElements(dt, bufs[k]->data(), count,
                        [&](int64_t i) { return ExpectedReduce(dt, ReduceOp::kSum, n, i, salt); }, what);
    };
    if (t % 2 == 0) {  // one at a time
      for (int k = 0; k < ops; ++k) {
        submit(k);
        verify(k);
      }
    } else {  // all in flight, then waited
      for (int k = 0; k < ops; ++k) submit(k);
      for (int k = 0; k < ops; ++k) verify(k);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
}

// Each thread of this process by id, with the CPUs it may run on.
std::vector<std::pair<std::string, cpu_set_t>> ThreadMasks() {
  std::vector<std::pair<std::string, cpu_set_t>> masks;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return masks;
  while (dirent* t = readdir(d)) {
    if (t->d_name[0] < '0' || t->d_name[0] > '9') continue;
    cpu_set_t m;
    if (sched_getaffinity(std::atoi(t->d_name), sizeof(m), &m) == 0) {
      masks.emplace_back(t->d_name, m);
    }
  }
  closedir(d);
  return masks;
}

// The threads that may no longer run on every CPU they could in `before` (a thread not there
// then: on every CPU of the process's, `start`), by id. (A snapshot may catch the background
// thread still pinned from earlier help: one CPU then, all of them now, is fine.)
std::string ThreadsWithOtherMasks(const std::vector<std::pair<std::string, cpu_set_t>>& before,
                                  const cpu_set_t& start) {
  std::string off;
  for (const auto& [id, now] : ThreadMasks()) {
    const cpu_set_t* had = &start;
    for (const auto& b : before) {
      if (b.first == id) had = &b.second;
    }
    cpu_set_t kept;
    CPU_AND(&kept, &now, had);
    if (!CPU_EQUAL(&kept, had)) {
      off += (off.empty() ? "" : ", ") + id + " (" + std::to_string(CPU_COUNT(&now)) +
             " CPUs, had " + std::to_string(CPU_COUNT(had)) + ")";
    }
  }
  return off;
}

// Caller-driven progress (engine/engine_impl.h): with a core per rank, a thread that waits on a
// small operation runs the engine's work itself once the background thread is idle, so some
// allgathers' output allocators (called where the response executes) run on the waiting thread.
// With more ranks on the host than cores callers never help, so none may. Which thread finishes
// a given operation depends on timing: a helping caller gives up when nothing moves for the spin
// window, which a loaded machine's scheduling outlasts. So "at least one" is asserted only under
// a long window (HVD_SPIN_MICROSECONDS >= 10,000, as mp_caller_progress_np* set it), and even
// then a batch of 200 can miss (1 run in 20 under TSan, and a run that misses one often misses
// several): while any rank has seen none, all run another batch, up to 40 (seconds, under TSan).
// Every result is checked either way.
void CheckWaitRunsTheWork(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  // Stepped aside on a host with no core to spare, the background thread is kept on its
  // helping caller's CPU while it yields, and gets its CPUs back after (AsidePin).
  cpu_set_t start;
  const bool have_mask = sched_getaffinity(0, sizeof(start), &start) == 0;
  const auto masks_before = ThreadMasks();
  // (With more ranks than cores too: a small operation's caller polls, and helps meanwhile.)
  const bool helps = e.options().spin_microseconds != 0;
  const bool long_window = e.options().spin_microseconds >= 10000;
  const std::thread::id me = std::this_thread::get_id();
  int on_caller = 0;
  constexpr int kBatch = 200, kBatches = 40;
  int ran = 0;
  for (int batch = 0; batch < kBatches; ++batch) {
    for (int k = batch * kBatch; k < (batch + 1) * kBatch; ++k) {
      int32_t in[2] = {r, k};
      std::vector<int32_t> out;
      hvd::OutputAllocator alloc = [&](const std::vector<int64_t>& shape) -> void* {
        if (std::this_thread::get_id() == me) ++on_caller;
        out.assign(static_cast<size_t>(shape[0]) * 2, -1);
        return out.data();
      };
      auto h = e.Allgather("waitwork." + std::to_string(k % 7),
                           TensorView(in, DataType::kInt32, {1, 2}), alloc);
      if (!ck.ExpectOk(WaitDone(h), "allgather " + std::to_string(k))) return;
      bool right = out.size() == static_cast<size_t>(2 * n);
      for (int q = 0; right && q < n; ++q) right = out[2 * q] == q && out[2 * q + 1] == k;
      ck.Expect(right, "allgather " + std::to_string(k) + " values");
      ++ran;
    }
    if (!helps || !long_window) break;
    // Another batch while any rank has seen none (the same decision on every rank).
    int32_t none = on_caller == 0 ? 1 : 0;
    TensorView nv(&none, DataType::kInt32, {1});
    if (!ck.ExpectOk(WaitDone(e.Allreduce("waitwork.none." + std::to_string(batch), nv, nv,
                                          ReduceOp::kMax)),
                     "batch decision " + std::to_string(batch))) {
      return;
    }
    if (none == 0) break;
  }
  if (have_mask) {
    // (It returns when it next runs; the last helper left with the last operation.)
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    std::string off = ThreadsWithOtherMasks(masks_before, start);
    while (!off.empty() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      off = ThreadsWithOtherMasks(masks_before, start);
    }
    ck.Expect(off.empty(), "threads " + off + " may run on fewer CPUs than before, 5 s after " +
                               "the last helped operation (expected every one's back)");
  }
  if (helps && long_window) {
    ck.Expect(on_caller > 0, "none of " + std::to_string(ran) +
                                 " allgathers ran on the thread that waited for it");
  } else if (!helps) {
    ck.Expect(on_caller == 0, std::to_string(on_caller) + " allgathers ran on the waiting thread, "
                              "though HVD_SPIN_MICROSECONDS=0 (callers do not help)");
  }
}

// Training steps on the fast path: a step of `kSmall` gradients of 4 KiB (A) and a step of one 4 MiB
// tensor (B, a loss or metric allreduced once per step in a real loop), alternating, every value
// checked. Counted around each A step (hvd::ReadNegotiationCounters): it runs as one fast-path
// collective (a step agreed in pieces as its tensors arrive, as when a polling background
// thread sent a part after each batch it drained, runs as several), and that collective's
// responses are the ones kept from the A step before, although B came between (the engine
// keeps its last few steps). Medians over the steps, so that a step cut by a rank descheduled
// in the middle of its enqueues does not decide; not under a sanitizer, where enqueuing a step
// takes longer than the holds that gather it.
void CheckAlternatingSteps(hvd::Engine& e, Checker& ck, int kSmall) {
  const int r = e.rank(), n = e.size();
  constexpr int kSmallCount = 1024, kLargeCount = 1 << 20;
  constexpr int kWarm = 4, kSteps = 40;
  std::vector<std::vector<float>> in(kSmall, std::vector<float>(kSmallCount)), out = in;
  std::vector<std::string> names;
  for (int t = 0; t < kSmall; ++t) names.push_back("steps.grad." + std::to_string(t));
  std::vector<float> big_in(kLargeCount), big_out(kLargeCount);
  // Small integers: every sum is exact in float32, whatever the order.
  auto small = [](int q, int s, int t, int64_t i) { return static_cast<float>((q + s + t + i) % 7); };
  auto large = [](int q, int s, int64_t i) { return static_cast<float>((q * 3 + s + i) % 11); };
  auto sum_small = [&](int s, int t, int64_t i) {
    double v = 0;
    for (int q = 0; q < n; ++q) v += small(q, s, t, i);
    return v;
  };
  auto sum_large = [&](int s, int64_t i) {
    double v = 0;
    for (int q = 0; q < n; ++q) v += large(q, s, i);
    return v;
  };
  std::vector<uint64_t> collectives, reused;  // of each timed A step
  int wrong_steps = 0;
  for (int s = 0; s < kWarm + kSteps; ++s) {
    for (int t = 0; t < kSmall; ++t) {
      for (int i = 0; i < kSmallCount; ++i) in[t][i] = small(r, s, t, i);
    }
    for (int64_t i = 0; i < kLargeCount; ++i) big_in[i] = large(r, s, i);
    const hvd::NegotiationCounters before = hvd::ReadNegotiationCounters(e);
    std::vector<hvd::HandlePtr> hs;
    for (int t = 0; t < kSmall; ++t) {
      hs.push_back(e.Allreduce(names[t], TensorView(in[t].data(), DataType::kFloat32, {kSmallCount}),
                               TensorView(out[t].data(), DataType::kFloat32, {kSmallCount}),
                               ReduceOp::kSum));
    }
    bool ok = true;
    for (int t = 0; t < kSmall; ++t) {
      ok = ck.ExpectOk(WaitDone(hs[t]), "step " + std::to_string(s) + ": " + names[t]) && ok;
    }
    const hvd::NegotiationCounters after = hvd::ReadNegotiationCounters(e);
    if (s >= kWarm) {
      collectives.push_back(after.fast_path_steps - before.fast_path_steps);
      reused.push_back(after.fast_path_steps_reused - before.fast_path_steps_reused);
    }
    ok = ck.ExpectOk(WaitDone(e.Allreduce("steps.loss",
                                          TensorView(big_in.data(), DataType::kFloat32, {kLargeCount}),
                                          TensorView(big_out.data(), DataType::kFloat32, {kLargeCount}),
                                          ReduceOp::kSum)),
                     "step " + std::to_string(s) + ": steps.loss") && ok;
    if (!ok) break;  // every rank's operations failed alike (the job failed)
    for (int t = 0; t < kSmall && ok; ++t) {
      for (int i = 0; i < kSmallCount && ok; ++i) ok = out[t][i] == sum_small(s, t, i);
      if (!ok) {
        ck.Expect(false, "step " + std::to_string(s) + ": " + names[t] + " has a wrong element");
      }
    }
    for (int64_t i = 0; i < kLargeCount && ok; ++i) {
      if (big_out[i] != sum_large(s, i)) {
        ok = ck.Expect(false, "step " + std::to_string(s) + ": steps.loss element " +
                                  std::to_string(i) + " is " + Checker::Num(big_out[i]) +
                                  ", expected " + Checker::Num(sum_large(s, i)));
      }
    }
    wrong_steps += ok ? 0 : 1;
  }
  ck.Expect(wrong_steps == 0, std::to_string(wrong_steps) + " steps gave wrong values");
  if (collectives.size() != static_cast<size_t>(kSteps)) return;  // (failed above)
  uint64_t total = 0, total_reused = 0;
  for (int k = 0; k < kSteps; ++k) {
    total += collectives[k];
    total_reused += reused[k];
  }
  std::sort(collectives.begin(), collectives.end());
  std::sort(reused.begin(), reused.end());
  std::printf("[mp] rank %d: A steps: %llu fast-path collectives in %d steps (median %llu a "
              "step), %llu with the responses of an earlier step taken again (median %llu)\n", r,
              static_cast<unsigned long long>(total), kSteps,
              static_cast<unsigned long long>(collectives[kSteps / 2]),
              static_cast<unsigned long long>(total_reused),
              static_cast<unsigned long long>(reused[kSteps / 2]));
#ifndef HVD_SANITIZED
  ck.Expect(collectives[kSteps / 2] == 1,
            "the median step of " + std::to_string(kSmall) + " cached tensors ran as " +
                std::to_string(collectives[kSteps / 2]) + " fast-path collectives (expected 1: "
                "the step agreed at once)");
  ck.Expect(reused[kSteps / 2] == 1,
            "the median step of " + std::to_string(kSmall) + " cached tensors took " + std::to_string(reused[kSteps / 2]) +
                " responses of an earlier step again (expected 1: the step before last's, "
                "kept while the 4 MiB step came between)");
#endif
}

// The last rank runs its operations one at a time while the others submit two at once: every
// rank but the last has announced b, which the last announces only once a has completed. a waits
// for the straggler hold (300 µs) and then runs. Its wait once lasted until rank 0's loop woke
// for something else: 100 ms, its idle tick, where no other message came.
void CheckUnevenAnnouncements(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  const bool last = r == n - 1;
  float a[4], b[4], ao[4], bo[4];
  auto run = [&](int step, std::vector<double>* latency) {
    for (int i = 0; i < 4; ++i) a[i] = b[i] = static_cast<float>(r + step + i);
    const TensorView av(a, DataType::kFloat32, {4}), bv(b, DataType::kFloat32, {4});
    const TensorView aov(ao, DataType::kFloat32, {4}), bov(bo, DataType::kFloat32, {4});
    ck.ExpectOk(WaitDone(e.Barrier()), "barrier before uneven step " + std::to_string(step));
    const auto t0 = Clock::now();
    hvd::HandlePtr ha = e.Allreduce("uneven.a", av, aov, ReduceOp::kSum), hb;
    if (!last) hb = e.Allreduce("uneven.b", bv, bov, ReduceOp::kSum);
    ck.ExpectOk(WaitDone(ha), "uneven step " + std::to_string(step) + ": a");
    if (latency) latency->push_back(SecondsSince(t0));
    if (last) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      hb = e.Allreduce("uneven.b", bv, bov, ReduceOp::kSum);
    }
    ck.ExpectOk(WaitDone(hb), "uneven step " + std::to_string(step) + ": b");
    const double base = n * (n - 1) / 2.0 + n * step;  // sum over q of (q + step)
    ck.ExpectElements(DataType::kFloat32, ao, 4, [&](int64_t i) { return base + n * i; },
                      "uneven step " + std::to_string(step) + ": a's values");
    ck.ExpectElements(DataType::kFloat32, bo, 4, [&](int64_t i) { return base + n * i; },
                      "uneven step " + std::to_string(step) + ": b's values");
  };
  for (int s = 0; s < 3; ++s) run(s, nullptr);  // a and b cached on every rank
  std::vector<double> latency;
  for (int s = 3; s < 14; ++s) run(s, &latency);
  std::sort(latency.begin(), latency.end());
  const double median = latency[latency.size() / 2];
  std::printf("[mp] rank %d: a with b announced by all but the last rank: median %.2f ms\n", r,
              median * 1e3);
#ifndef HVD_SANITIZED
  ck.Expect(median < 0.05, "a took " + std::to_string(median * 1e3) +
                               " ms (median) while only some ranks had announced b; the hold "
                               "is 0.3 ms (expected under 50 ms)");
#endif
}

// One step of kStepTensors cached allreduces named `prefix`.t, enqueued in `batches` batches
// with a `pause` between them on this rank (zero: none; busy, or yielding the core to whatever
// else may run: this rank's background thread), waited on and checked. `parts` and
// `collectives`: this rank's round parts (or lists) sent and fast-path collectives over the
// step; false where an operation failed.
constexpr int kStepTensors = 64, kStepBatches = 4;
bool RunBatchedStep(hvd::Engine& e, Checker& ck, const std::string& prefix, int s, int batches,
                    std::chrono::microseconds pause, bool yield, int64_t* parts,
                    int64_t* collectives) {
  const int r = e.rank(), n = e.size();
  constexpr int kCount = 16;
  std::vector<std::vector<float>> in(kStepTensors, std::vector<float>(kCount)), out = in;
  for (int t = 0; t < kStepTensors; ++t) {
    for (int i = 0; i < kCount; ++i) in[t][i] = static_cast<float>((r + s + t + i) % 5);
  }
  const std::string step = prefix + " step " + std::to_string(s);
  ck.ExpectOk(WaitDone(e.Barrier()), "barrier before " + step);
  const hvd::NegotiationCounters before = hvd::ReadNegotiationCounters(e);
  std::vector<hvd::HandlePtr> hs;
  for (int t = 0; t < kStepTensors; ++t) {
    if (pause.count() > 0 && t > 0 && t % (kStepTensors / batches) == 0) {
      const auto until = Clock::now() + pause;
      while (Clock::now() < until) {
        if (yield) std::this_thread::yield();
      }
    }
    hs.push_back(e.Allreduce(prefix + "." + std::to_string(t),
                             TensorView(in[t].data(), DataType::kFloat32, {kCount}),
                             TensorView(out[t].data(), DataType::kFloat32, {kCount}),
                             ReduceOp::kSum));
  }
  bool ok = true;
  for (int t = 0; t < kStepTensors; ++t) {
    ok = ck.ExpectOk(WaitDone(hs[t]), step + ": tensor " + std::to_string(t)) && ok;
  }
  const hvd::NegotiationCounters after = hvd::ReadNegotiationCounters(e);
  if (!ok) return false;
  *parts = static_cast<int64_t>(after.messages - before.messages);
  *collectives = static_cast<int64_t>(after.fast_path_steps - before.fast_path_steps);
  for (int t = 0; t < kStepTensors; ++t) {
    ck.ExpectElements(DataType::kFloat32, out[t].data(), kCount,
                      [&](int64_t i) {
                        double v = 0;
                        for (int q = 0; q < n; ++q) v += (q + s + t + i) % 5;
                        return v;
                      },
                      step + ": tensor " + std::to_string(t));
  }
  return true;
}

// The last rank's caller enqueues a step of cached tensors in kLastRankBatches batches with
// 30 µs pauses between them, yielding its core, while the others enqueue it at once. Run with
// HVD_SPIN_MICROSECONDS=10 (mp_steps_batched_np2), so that a part waits for a pause of 10 µs at
// most and each batch of the last rank's reaches its background thread on its own. Each such
// batch would start a round that holds (its part lacks the rest of the step), every rank
// answering it with a part: a ping-pong of parts, about one per batch, that took the cores the
// enqueuing callers needed. The last rank's part waits instead until it has every bit the
// others announced: the step takes two rounds (the last rank's answer to the others' part, and
// its whole part) or, where the last rank's first part went before the others had enqueued any
// of the step (their callers still waking from the barrier: about half the steps where the
// machine is otherwise idle, few under load), three. So the median is at most one part beyond
// two a collective on each rank, however many batches; a part per batch makes about one per
// batch beyond the first.
constexpr int kLastRankBatches = 8;
void CheckStepInBatches(hvd::Engine& e, Checker& ck) {
  const bool last = e.rank() == e.size() - 1;
  // Of each timed step: this rank's parts beyond two for each fast-path collective, the step's
  // parts and collectives.
  std::vector<int64_t> extra;
  std::string seen;
  for (int s = 0; s < 24; ++s) {
    int64_t parts = 0, collectives = 0;
    const auto pause = std::chrono::microseconds(last ? 30 : 0);
    if (!RunBatchedStep(e, ck, "batched", s, kLastRankBatches, pause, true, &parts,
                        &collectives)) {
      return;
    }
    if (s < 4) continue;
    extra.push_back(parts - 2 * collectives);
    seen += " " + std::to_string(parts) + "/" + std::to_string(collectives);
  }
  std::sort(extra.begin(), extra.end());
  const int64_t median = extra[extra.size() / 2];
  // Where rank 0 answers, a worker sends it a list per batch.
  const bool rounds = hvd::NegotiatesInRounds(e);
  std::printf("[mp] rank %d: a step enqueued in %d batches by the last rank (%s): parts or lists "
              "sent / fast-path collectives of each step:%s; median %lld parts beyond two a "
              "collective\n",
              e.rank(), kLastRankBatches, rounds ? "rounds" : "rank 0 answers", seen.c_str(),
              static_cast<long long>(median));
#ifndef HVD_SANITIZED
  if (rounds) ck.Expect(median <= 1, "a step enqueued in " + std::to_string(kLastRankBatches) +
                             " batches by the last rank took " + std::to_string(median) +
                             " parts beyond two for each of its collectives (median) on this "
                             "rank (expected at most one: the last rank's part waits for the "
                             "rest of the step; a part per batch makes about one a batch)");
#endif
}

// Every rank's caller pauses for 20 µs between batches of its step (as an interpreter's call,
// a vector that grows or a moment without its core does), at the same points on every rank. A
// background thread that polled through such a pause saw no tensor since its last drain and
// sent its part, on every rank with the same bits: the round agreed on the first batches alone,
// and the step ran as two or more collectives (mp_steps_np2 failed about one run in seven on
// its step of 1,000 tensors, whose handle vector grows at 512). A part now waits while the
// last tensor came less than 50 µs ago: the step is one collective. (Before, two runs in three
// split 11-15 of the 20 steps; one in three, whose background threads did not poll through the
// pauses, split none.)
void CheckStepWithPauses(hvd::Engine& e, Checker& ck) {
  std::vector<int64_t> collectives;
  std::string seen;
  for (int s = 0; s < 24; ++s) {
    int64_t parts = 0, got = 0;
    if (!RunBatchedStep(e, ck, "paused", s, kStepBatches, std::chrono::microseconds(20), false, &parts, &got)) {
      return;
    }
    if (s < 4) continue;
    collectives.push_back(got);
    seen += " " + std::to_string(got);
  }
  const auto split = std::count_if(collectives.begin(), collectives.end(),
                                   [](int64_t c) { return c > 1; });
  const bool rounds = hvd::NegotiatesInRounds(e);
  std::printf("[mp] rank %d: a step enqueued in %d batches 20 us apart by every rank (%s): "
              "fast-path collectives of each step:%s\n",
              e.rank(), kStepBatches, rounds ? "rounds" : "rank 0 answers", seen.c_str());
#ifndef HVD_SANITIZED
  if (rounds) {
    ck.Expect(split <= 4, std::to_string(split) + " of " + std::to_string(collectives.size()) +
                              " steps enqueued in " + std::to_string(kStepBatches) +
                              " batches 20 us apart by every rank ran as more than one "
                              "fast-path collective (expected at most 4: a part waits while "
                              "the last tensor came less than 50 us ago)");
  }
#endif
}

// This process's CPU time (every thread's), in seconds.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The CPU a rank uses while it waits: idle (no operation for 300 ms), and through the waits of a
// cycle time (run with HVD_CYCLE_TIME=20: each small allreduce, 10 ms after the last, waits for
// the next round or list). The background thread sleeps through both, to the microsecond by a
// timer; it once re-armed that timer on every pass, each re-arm ending its next sleep at once,
// and spun through every wait. Bounds far above a sleeping thread's share (a few percent) and
// below a spinning one's; not under a sanitizer.
void CheckWaitingCpu(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  float v[4], out[4];
  auto step = [&](int s) {
    for (int i = 0; i < 4; ++i) v[i] = static_cast<float>(r + s + i);
    ck.ExpectOk(WaitDone(e.Allreduce("waiting.cpu", TensorView(v, DataType::kFloat32, {4}),
                                     TensorView(out, DataType::kFloat32, {4}), ReduceOp::kSum)),
                "allreduce " + std::to_string(s));
    ck.ExpectElements(DataType::kFloat32, out, 4,
                      [&](int64_t i) { return n * (n - 1) / 2.0 + n * (s + i); },
                      "allreduce " + std::to_string(s) + "'s values");
  };
  step(0);
  ck.ExpectOk(WaitDone(e.Barrier()), "barrier before the idle stretch");
  double cpu0 = ProcessCpuSeconds();
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double idle = (ProcessCpuSeconds() - cpu0) / SecondsSince(t0);
  ck.ExpectOk(WaitDone(e.Barrier()), "barrier after the idle stretch");
  cpu0 = ProcessCpuSeconds();
  t0 = Clock::now();
  for (int s = 1; s <= 20; ++s) {
    step(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double cycling = (ProcessCpuSeconds() - cpu0) / SecondsSince(t0);
  std::printf("[mp] rank %d: CPU used idle %.1f%%, through the waits of a cycle time %.1f%%\n",
              r, idle * 100, cycling * 100);
#ifndef HVD_SANITIZED
  ck.Expect(idle < 0.15, "an idle rank used " + std::to_string(idle * 100) +
                             "% of a core (expected near zero, under 15%)");
  ck.Expect(cycling < 0.4, "a rank waiting through cycle times used " +
                               std::to_string(cycling * 100) +
                               "% of a core (expected a few percent, under 40%)");
#endif
}

}  // namespace

int RunWaitingCpuChecks(hvd::Engine& e, Checker& ck) {
  ck.Begin("waiting cpu");
  CheckWaitingCpu(e, ck);
  return ck.End();
}

int RunStepChecks(hvd::Engine& e, Checker& ck, int tensors) {
  ck.Begin("alternating steps");
  CheckAlternatingSteps(e, ck, tensors);
  CheckUnevenAnnouncements(e, ck);
  CheckStepWithPauses(e, ck);
  return ck.End();
}

int RunBatchedStepChecks(hvd::Engine& e, Checker& ck) {
  ck.Begin("a step in batches");
  CheckStepInBatches(e, ck);
  return ck.End();
}

// The descriptors of the process whose /proc/self/fd link starts with one of `kinds`, with their
// links (hvd's: the worker opens none itself).
std::vector<std::pair<int, std::string>> DescriptorsOf(const std::vector<std::string>& kinds) {
  std::vector<std::pair<int, std::string>> found;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return found;
  while (dirent* d = ::readdir(dir)) {
    const int fd = std::atoi(d->d_name);
    if (d->d_name[0] == '.' || fd == ::dirfd(dir)) continue;
    char target[256] = {0};
    const std::string link = std::string("/proc/self/fd/") + d->d_name;
    if (::readlink(link.c_str(), target, sizeof(target) - 1) <= 0) continue;
    for (const std::string& k : kinds) {
      if (std::string(target).rfind(k, 0) == 0) found.emplace_back(fd, target);
    }
  }
  ::closedir(dir);
  return found;
}

// Every socket, eventfd and pidfd of the process is close-on-exec, so that a program the rank
// starts does not keep its connections open after it dies.
void CheckCloseOnExec(Checker& ck) {
  const auto fds = DescriptorsOf({"socket:", "anon_inode:[eventfd]", "anon_inode:[pidfd]"});
  for (const auto& [fd, what] : fds) {
    const int flags = ::fcntl(fd, F_GETFD);
    ck.Expect(flags >= 0 && (flags & FD_CLOEXEC) != 0,
              "descriptor " + std::to_string(fd) + " (" + what + ") is close-on-exec");
  }
  ck.Expect(!fds.empty() || ck.size() == 1, "found hvd's descriptors to look at");
}

// A child forked from the rank without exec (a DataLoader worker): its copies of hvd's sockets
// point at /dev/null, so that a peer sees the rank's end when the rank dies; an operation there,
// and the wait of one the rank started before the fork, fail at once instead of hanging; and its
// shutdown leaves the rank's engine running.
void CheckForkedChild(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  const auto sockets = DescriptorsOf({"socket:"});
  float one[1] = {1}, got[1] = {0}, child_out[1] = {0}, go[1] = {0};
  const TensorView in(one, DataType::kFloat32, {1}), out(got, DataType::kFloat32, {1});
  // Rank 0's stays pending through the fork: the others submit theirs after its child is gone.
  hvd::HandlePtr pending;
  if (r == 0) pending = e.Allreduce("fork.pending", in, out, ReduceOp::kSum);
  int report[2];
  if (!ck.Expect(::pipe2(report, O_CLOEXEC) == 0, "a pipe for the child's report")) return;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    std::string bad;
    for (const auto& [fd, what] : sockets) {
      char target[256] = {0};
      const std::string link = "/proc/self/fd/" + std::to_string(fd);
      if (::readlink(link.c_str(), target, sizeof(target) - 1) <= 0 ||
          std::string(target) != "/dev/null") {
        bad += "descriptor " + std::to_string(fd) + " is " + target + ", not /dev/null; ";
      }
    }
    const hvd::Status s = e.Allreduce("fork.child", in, TensorView(child_out, DataType::kFloat32, {1}),
                                      ReduceOp::kSum)->Wait();
    if (s.code() != hvd::StatusCode::kFailedPrecondition ||
        s.message().find("forked") == std::string::npos) {
      bad += "an allreduce in the child ended " + s.ToString() + "; ";
    }
    if (pending && n > 1) {
      if (!pending->Poll()) bad += "a poll of an allreduce pending at the fork says pending; ";
      const hvd::Status w = pending->Wait();
      if (w.code() != hvd::StatusCode::kFailedPrecondition) {
        bad += "the wait of an allreduce pending at the fork ended " + w.ToString() + "; ";
      }
    }
    e.Shutdown();  // stops nothing: the engine is the rank's
    const ssize_t ignored = ::write(report[1], bad.data(), bad.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(report[1]);
  if (!ck.Expect(pid > 0, "fork")) {
    ::close(report[0]);
    return;
  }
  std::string text;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (char buf[512];;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{report[0], POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      ck.Expect(false, "the forked child reported within 30 s");
      ::kill(pid, SIGKILL);
      break;
    }
    const ssize_t got_bytes = ::read(report[0], buf, sizeof(buf));
    if (got_bytes <= 0) break;
    text.append(buf, static_cast<size_t>(got_bytes));
  }
  ::close(report[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ck.Expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child exited with 0");
  ck.Expect(text.empty(), "in the forked child: " + text);
  // The rank's engine runs on: rank 0's pending allreduce finishes once the others join it.
  ck.ExpectOk(WaitDone(e.Broadcast("fork.go", TensorView(go, DataType::kFloat32, {1}),
                                   TensorView(go, DataType::kFloat32, {1}), 0)),
              "a broadcast after the child exited");
  if (r != 0) pending = e.Allreduce("fork.pending", in, out, ReduceOp::kSum);
  ck.ExpectOk(WaitDone(pending), "the allreduce pending at the fork");
  ck.ExpectElements(DataType::kFloat32, got, 1, [&](int64_t) { return n; },
                    "the allreduce pending at the fork's value");
}

int RunBarrierAndJoinChecks(hvd::Engine& e, Checker& ck) {
  int failures = 0;
  ck.Begin("close-on-exec");
  CheckCloseOnExec(ck);
  failures += ck.End();
  ck.Begin("a forked child");
  CheckForkedChild(e, ck);
  failures += ck.End();
  ck.Begin("barrier");
  CheckBarrier(e, ck);
  failures += ck.End();
  ck.Begin("join");
  CheckJoin(e, ck);
  failures += ck.End();
  return failures;
}

int RunThreadChecks(hvd::Engine& e, Checker& ck) {
  ck.Begin("caller threads");
  CheckThreads(e, ck);
  CheckWaitRunsTheWork(e, ck);
  return ck.End();
}

int RunCallerProgressChecks(hvd::Engine& e, Checker& ck) {
  ck.Begin("caller progress");
  CheckWaitRunsTheWork(e, ck);
  CheckThreads(e, ck);  // four callers at once, two of them waiting on each operation
  return ck.End();
}

}  // namespace mp
