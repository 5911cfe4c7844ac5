// Allreduce checks: every dtype x op x count (0, 1, odd, large), in place and out of place;
// prescale/postscale; many small tensors in flight at once (fusion); grouped allreduce; the
// response cache's fast path under churn and with a rank that waits before it submits the rest.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

#include "hvd/raw.h"
#include "mp_checks.h"

namespace mp {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::TensorView;

namespace {

struct Case {
  DataType t;
  ReduceOp op;
  int64_t count;
  bool in_place;
  int64_t salt;
  double prescale = 1.0, postscale = 1.0;
  std::string name;
  std::unique_ptr<Buffer> in, out;
  hvd::HandlePtr h;

  std::string What() const {
    return name + " dtype=" + Str(t) + " op=" + Str(op) + " count=" + std::to_string(count) +
           (in_place ? " in-place" : " out-of-place");
  }
};

// Input of the prescale/postscale cases: a multiple of 2n small enough that 3 * the sum of n
// of them fits int8, so Sum(3v) * 0.5 and Average are exact integers in every dtype.
double ScaledInput(DataType t, int r, int n, int64_t i, int64_t salt) {
  const int64_t w = 120 / (6 * n * n);
  const int64_t span = IsSigned(t) ? 2 * w + 1 : w + 1;
  const int64_t x = (i * 7 + r * 13 + salt * 31) % span;
  return 2.0 * n * (IsSigned(t) ? x - w : x);
}

double ScaledExpected(DataType t, ReduceOp op, int n, int64_t i, int64_t salt, double pre,
                      double post) {
  double sum = 0;
  for (int q = 0; q < n; ++q) sum += pre * ScaledInput(t, q, n, i, salt);
  return op == ReduceOp::kAverage ? sum * post / n : sum * post;
}

double InputOf(const Case& c, int r, int n, int64_t i) {
  if (c.prescale != 1.0 || c.postscale != 1.0) return ScaledInput(c.t, r, n, i, c.salt);
  return ReduceInput(c.t, c.op, r, n, i, c.salt);
}

double ExpectedOf(const Case& c, int n, int64_t i) {
  if (c.prescale != 1.0 || c.postscale != 1.0) {
    return ScaledExpected(c.t, c.op, n, i, c.salt, c.prescale, c.postscale);
  }
  return ExpectedReduce(c.t, c.op, n, i, c.salt);
}

void Submit(hvd::Engine& e, Case& c) {
  const int r = e.rank(), n = e.size();
  c.in = std::make_unique<Buffer>(c.t, c.count);
  for (int64_t i = 0; i < c.count; ++i) Put(c.t, c.in->data(), i, InputOf(c, r, n, i));
  TensorView in(c.in->data(), c.t, {c.count});
  TensorView out = in;
  if (!c.in_place) {
    c.out = std::make_unique<Buffer>(c.t, c.count);
    out.data = c.out->data();
  }
  c.h = e.Allreduce(c.name, in, out, c.op, c.prescale, c.postscale);
}

void Verify(Checker& ck, Case& c) {
  const int r = ck.rank(), n = ck.size();
  hvd::Status s = WaitDone(c.h);
  if (!ck.ExpectOk(s, c.What())) return;
  const void* result = c.in_place ? c.in->data() : c.out->data();
  ck.ExpectElements(c.t, result, c.count, [&](int64_t i) { return ExpectedOf(c, n, i); },
                    c.What() + " result");
  if (!c.in_place) {
    ck.ExpectElements(c.t, c.in->data(), c.count, [&](int64_t i) { return InputOf(c, r, n, i); },
                      c.What() + " input left unchanged");
  }
  c.in.reset();
  c.out.reset();
}

// Submits every case of the list at once, then waits for and checks each.
void RunBatch(hvd::Engine& e, Checker& ck, std::vector<Case>& cases) {
  for (auto& c : cases) Submit(e, c);
  for (auto& c : cases) Verify(ck, c);
}

void CheckGrid(hvd::Engine& e, Checker& ck) {
  int64_t salt = 0;
  for (DataType t : AllDataTypes()) {
    const int64_t large = t == DataType::kFloat32 ? (int64_t{1} << 20) + 7 : (int64_t{1} << 16) + 3;
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{33}, int64_t{1001}, large}) {
      std::vector<Case> cases;
      for (ReduceOp op : AllReduceOps()) {
        if (t == DataType::kBool && op == ReduceOp::kAverage) continue;
        for (bool in_place : {true, false}) {
          Case c{t, op, count, in_place, ++salt};
          c.name = "ar." + Str(t) + "." + Str(op) + "." + std::to_string(count) +
                   (in_place ? ".inplace" : ".outofplace");
          cases.push_back(std::move(c));
        }
      }
      RunBatch(e, ck, cases);
    }
  }
  // Average of bool is refused up front.
  uint8_t b = 1;
  TensorView bv(&b, DataType::kBool, {1});
  hvd::Status s = WaitDone(e.Allreduce("ar.bool.average", bv, bv, ReduceOp::kAverage));
  ck.Expect(s.code() == hvd::StatusCode::kInvalidArgument,
            "allreduce average of bool is refused with InvalidArgument: " + s.ToString());
}

void CheckScale(hvd::Engine& e, Checker& ck) {
  std::vector<Case> cases;
  int64_t salt = 500;
  for (DataType t : AllDataTypes()) {
    if (t == DataType::kBool) continue;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      for (int64_t count : {1, 33, 1001}) {
        for (bool in_place : {true, false}) {
          Case c{t, op, count, in_place, ++salt, 3.0, 0.5};
          c.name = "scale." + Str(t) + "." + Str(op) + "." + std::to_string(count) +
                   (in_place ? ".inplace" : ".outofplace");
          cases.push_back(std::move(c));
        }
      }
    }
  }
  RunBatch(e, ck, cases);
}

void CheckFused(hvd::Engine& e, Checker& ck) {
  std::vector<Case> cases;
  const auto types = AllDataTypes();
  const auto ops = AllReduceOps();
  for (int k = 0; k < 240; ++k) {
    DataType t = types[k % types.size()];
    ReduceOp op = ops[(k / types.size()) % ops.size()];
    if (t == DataType::kBool && op == ReduceOp::kAverage) op = ReduceOp::kSum;
    Case c{t, op, 1 + (k * 37) % 97, k % 2 == 0, 2000 + k};
    c.name = "fused." + std::to_string(k);
    cases.push_back(std::move(c));
  }
  RunBatch(e, ck, cases);
}

void CheckGrouped(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  for (auto c : {std::pair{DataType::kFloat32, ReduceOp::kSum},
                 std::pair{DataType::kInt32, ReduceOp::kMax},
                 std::pair{DataType::kBFloat16, ReduceOp::kAverage}}) {
    const DataType t = c.first;  // named copies: a lambda below captures them
    const ReduceOp op = c.second;
    const std::vector<int64_t> counts = {0, 1, 7, 33, 1001, 4099};
    std::vector<std::string> names;
    std::vector<TensorView> ins, outs;
    std::vector<std::unique_ptr<Buffer>> in_bufs, out_bufs;
    for (size_t k = 0; k < counts.size(); ++k) {
      names.push_back("group." + Str(t) + "." + std::to_string(k));
      in_bufs.push_back(std::make_unique<Buffer>(t, counts[k]));
      out_bufs.push_back(std::make_unique<Buffer>(t, counts[k]));
      for (int64_t i = 0; i < counts[k]; ++i) {
        Put(t, in_bufs[k]->data(), i, ReduceInput(t, op, r, n, i, 3000 + k));
      }
      ins.emplace_back(in_bufs[k]->data(), t, std::vector<int64_t>{counts[k]});
      outs.emplace_back(out_bufs[k]->data(), t, std::vector<int64_t>{counts[k]});
    }
    auto hs = e.GroupedAllreduce(names, ins, outs, op);
    ck.Expect(hs.size() == counts.size(), "grouped allreduce returns one handle per tensor");
    for (size_t k = 0; k < hs.size() && k < counts.size(); ++k) {
      std::string what = names[k] + " dtype=" + Str(t) + " op=" + Str(op) +
                         " count=" + std::to_string(counts[k]);
      if (!ck.ExpectOk(WaitDone(hs[k]), what)) continue;
      ck.ExpectElements(t, out_bufs[k]->data(), counts[k],
                        [&](int64_t i) { return ExpectedReduce(t, op, n, i, 3000 + k); }, what);
    }
  }
}

// The fast path under churn. Each step allreduces a subset of a pool of names (the same subset
// on every rank, chosen by the step), each rank submitting them in its own order and at its own
// pace: rounds start on different ranks and their parts cross, a rank answers a round before
// its own tensors are in, and with a small HVD_CACHE_CAPACITY (np 7) cache entries change while
// bits wait. Each step also has a name never seen before (index kPool), negotiated by rank 0
// while the cached ones go by rounds, so its lists fall between rounds. Every step's sums match
// the formula, and every rank finishes every step.
void CheckFastPathChurn(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  constexpr int kPool = 24, kSteps = 40;
  std::vector<std::vector<float>> bufs(kPool + 1);
  auto name_of = [](int k, int step) {
    return k < kPool ? "churn." + std::to_string(k) : "churn.new." + std::to_string(step);
  };
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> names;
    for (int k = 0; k < kPool; ++k) {
      if (step % 4 == 0 || (k * 7 + step * 3) % 5 != 0) names.push_back(k);
    }
    names.insert(names.begin() + static_cast<std::ptrdiff_t>(names.size() / 2), kPool);
    std::rotate(names.begin(), names.begin() + (r * 5) % static_cast<int>(names.size()),
                names.end());
    if (r % 2) std::reverse(names.begin(), names.end());
    std::vector<std::pair<int, hvd::HandlePtr>> handles;
    for (int k : names) {
      const int64_t count = 1 + (k % 5) * 3;  // the same per name every step: it stays cached
      const int64_t salt = k * 1000 + step;
      bufs[k].resize(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        bufs[k][i] =
            static_cast<float>(ReduceInput(DataType::kFloat32, ReduceOp::kSum, r, n, i, salt));
      }
      TensorView v(bufs[k].data(), DataType::kFloat32, {count});
      handles.emplace_back(k, e.Allreduce(name_of(k, step), v, v, ReduceOp::kSum));
      if ((step + k + r) % 7 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(150 * (r + 1)));
      }
    }
    for (auto& [k, h] : handles) {
      const std::string what = name_of(k, step) + " at step " + std::to_string(step);
      if (!ck.ExpectOk(WaitDone(h), what)) continue;
      const int64_t salt = k * 1000 + step;
      ck.ExpectElements(DataType::kFloat32, bufs[k].data(), static_cast<int64_t>(bufs[k].size()),
                        [&](int64_t i) {
                          return ExpectedReduce(DataType::kFloat32, ReduceOp::kSum, n, i, salt);
                        },
                        what);
    }
  }
}

// Grouped allreduces on the response cache's fast path, under churn. Each step submits up to
// three groups and two lone tensors, in each rank's own order and at its own pace: group A
// (three members) every step, group B (two, one of them empty) every other step, and group C
// whose second member grows by one element every fifth step on every rank (its cache entry
// changes: the group goes to the coordinator whole, then is cached again). With a small
// HVD_CACHE_CAPACITY (np 7: 8 entries for 9 names) entries are evicted while bits wait. Every
// sum matches the formula and every rank finishes every step. Then ten steps of group A alone:
// from the second on its members are cache hits and each step takes the fast path, whether the
// ranks agree in rounds or rank 0 answers (before, grouped operations never did). Then a step
// with one rank late past the bit patience, the last and then rank 0.
void CheckGroupedChurn(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  struct Member {
    std::string name;
    int64_t count;
    std::vector<float> buf;
  };
  std::vector<std::vector<Member>> units = {
      {{"ga.0", 1, {}}, {"ga.1", 7, {}}, {"ga.2", 33, {}}},
      {{"gb.0", 5, {}}, {"gb.1", 0, {}}},
      {{"gc.0", 3, {}}, {"gc.1", 2, {}}},
      {{"lone.0", 4, {}}},
      {{"lone.1", 9, {}}},
  };
  auto run = [&](int step, const std::vector<size_t>& which) {
    struct Pending {
      size_t u, m;  // the unit and its member
      hvd::HandlePtr h;
    };
    std::vector<Pending> handles;
    for (size_t u : which) {
      std::vector<Member>& unit = units[u];
      std::vector<std::string> names;
      std::vector<TensorView> views;
      for (size_t m = 0; m < unit.size(); ++m) {
        Member& x = unit[m];
        if (u == 2 && m == 1) x.count = 2 + step / 5;
        x.buf.resize(static_cast<size_t>(x.count));
        const int64_t salt = static_cast<int64_t>(u * 10 + m) * 1000 + step;
        for (int64_t i = 0; i < x.count; ++i) {
          x.buf[i] = static_cast<float>(ReduceInput(DataType::kFloat32, ReduceOp::kSum, r, n, i, salt));
        }
        names.push_back(x.name);
        views.emplace_back(x.buf.data(), DataType::kFloat32, std::vector<int64_t>{x.count});
      }
      if (unit.size() == 1) {
        handles.push_back({u, 0, e.Allreduce(names[0], views[0], views[0], ReduceOp::kSum)});
      } else {
        auto hs = e.GroupedAllreduce(names, views, views, ReduceOp::kSum);
        ck.Expect(hs.size() == unit.size(), "a handle per member of " + names[0] + "'s group");
        for (size_t m = 0; m < hs.size() && m < unit.size(); ++m) handles.push_back({u, m, hs[m]});
      }
      if ((step + static_cast<int>(u) + r) % 4 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(200 * (r + 1)));
      }
    }
    for (const Pending& p : handles) {
      const Member& x = units[p.u][p.m];
      const std::string what = x.name + " at step " + std::to_string(step);
      if (!ck.ExpectOk(WaitDone(p.h), what)) continue;
      const int64_t salt = static_cast<int64_t>(p.u * 10 + p.m) * 1000 + step;
      ck.ExpectElements(DataType::kFloat32, x.buf.data(), x.count,
                        [&](int64_t i) {
                          return ExpectedReduce(DataType::kFloat32, ReduceOp::kSum, n, i, salt);
                        },
                        what);
    }
  };
  constexpr int kSteps = 30;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<size_t> which = {0, 2, 3, 4};
    if (step % 2 == 0) which.push_back(1);
    std::rotate(which.begin(), which.begin() + r % static_cast<int>(which.size()), which.end());
    if (r % 2) std::reverse(which.begin(), which.end());
    run(step, which);
  }
  const char* capacity = std::getenv("HVD_CACHE_CAPACITY");
  hvd::NegotiationCounters before{};
  for (int step = kSteps; step < kSteps + 10; ++step) {
    if (step == kSteps + 1) before = hvd::ReadNegotiationCounters(e);
    run(step, {0});
  }
  const hvd::NegotiationCounters after = hvd::ReadNegotiationCounters(e);
  // Where the cache holds every name (the default capacity), whether the ranks agree in rounds
  // or rank 0 answers.
  if (capacity == nullptr) {
    ck.Expect(after.cache_hits - before.cache_hits >= 9 * 3,
              "group A's members are cache hits in 9 steps of it alone: " +
                  std::to_string(after.cache_hits - before.cache_hits) + " hits");
    ck.Expect(after.fast_path_steps - before.fast_path_steps >= 9,
              "group A's steps take the fast path: " +
                  std::to_string(after.fast_path_steps - before.fast_path_steps) + " of 9");
  }
  // A rank late past the bit patience (1 s), the last one and then rank 0: the others' members
  // of the cached group leave the fast path together for the coordinator, where the late
  // rank's join them as one batch; every sum is right, and so is the step after.
  if (n > 1) {
    int step = kSteps + 10;
    for (int late : {n - 1, 0}) {
      if (r == late) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
      run(step++, {0});
    }
    run(step, {0});
  }
}

// A rank that waits for one cached tensor before it submits the step's others, while the
// other ranks have submitted them all: they have announced more than it has, which (where rank
// 0 answers) holds the agreed tensor back only for a while (EngineImpl::AgreedGoAt), so its wait
// ends and it goes on.
// Each rank in turn is the one that waits (the first two steps cache the names). Every sum
// matches the formula and every wait ends.
void CheckFastPathHold(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  constexpr int kNames = 3;
  constexpr int64_t kCount = 5;
  std::vector<std::vector<float>> bufs(kNames, std::vector<float>(kCount));
  for (int step = 0; step < 2 + 2 * n; ++step) {
    const int late = step < 2 ? -1 : (step - 2) % n;
    auto salt = [step](int k) { return static_cast<int64_t>(k) * 100 + step; };
    auto submit = [&](int k) {
      for (int64_t i = 0; i < kCount; ++i) {
        bufs[k][i] =
            static_cast<float>(ReduceInput(DataType::kFloat32, ReduceOp::kSum, r, n, i, salt(k)));
      }
      TensorView v(bufs[k].data(), DataType::kFloat32, {kCount});
      return e.Allreduce("hold." + std::to_string(k), v, v, ReduceOp::kSum);
    };
    auto check = [&](int k, const hvd::HandlePtr& h) {
      const std::string what = "hold." + std::to_string(k) + " at step " + std::to_string(step) +
                               (r == late ? " (this rank waited for it first)" : "");
      if (!ck.ExpectOk(WaitDone(h, 20.0), what)) return;
      ck.ExpectElements(DataType::kFloat32, bufs[k].data(), kCount,
                        [&](int64_t i) {
                          return ExpectedReduce(DataType::kFloat32, ReduceOp::kSum, n, i, salt(k));
                        },
                        what);
    };
    std::vector<hvd::HandlePtr> hs(kNames);
    if (r == late) {
      hs[0] = submit(0);
      check(0, hs[0]);
      for (int k = 1; k < kNames; ++k) hs[k] = submit(k);
      for (int k = 1; k < kNames; ++k) check(k, hs[k]);
    } else {
      for (int k = 0; k < kNames; ++k) hs[k] = submit(k);
      for (int k = 0; k < kNames; ++k) check(k, hs[k]);
    }
  }
}

}  // namespace

int RunAllreduceChecks(hvd::Engine& e, Checker& ck) {
  int failures = 0;
  ck.Begin("allreduce grid");
  CheckGrid(e, ck);
  failures += ck.End();
  ck.Begin("allreduce scale");
  CheckScale(e, ck);
  failures += ck.End();
  ck.Begin("allreduce fused");
  CheckFused(e, ck);
  failures += ck.End();
  ck.Begin("grouped allreduce");
  CheckGrouped(e, ck);
  failures += ck.End();
  ck.Begin("grouped allreduce churn");
  CheckGroupedChurn(e, ck);
  failures += ck.End();
  ck.Begin("fast path churn");
  CheckFastPathChurn(e, ck);
  failures += ck.End();
  ck.Begin("fast path hold");
  CheckFastPathHold(e, ck);
  failures += ck.End();
  return failures;
}

}  // namespace mp
