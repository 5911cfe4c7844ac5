// Mismatch errors (shape, dtype, reduce op, scale, operation, allgather row shape, broadcast
// root, duplicate names, one member of a group): each fails with InvalidArgument naming the
// tensor, and the next operation works. Then shutdown: later operations fail.
#include <chrono>
#include <climits>
#include <thread>
#include <vector>

#include "mp_checks.h"

namespace mp {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::StatusCode;
using hvd::TensorView;

namespace {

void ExpectInvalid(Checker& ck, const hvd::HandlePtr& h, const std::string& name,
                   const std::string& differs) {
  hvd::Status s = WaitDone(h);
  const std::string what = "mismatch '" + name + "'";
  ck.Expect(s.code() == StatusCode::kInvalidArgument, what + " fails with InvalidArgument; got " + s.ToString());
  ck.Expect(s.message().find(name) != std::string::npos, what + ": the message names the tensor: " + s.message());
  if (!differs.empty()) {
    ck.Expect(s.message().find(differs) != std::string::npos,
              what + ": the message says what differed ('" + differs + "'): " + s.message());
  }
}

// The operation after an error works: an int32 Sum of rank + 1.
void ExpectNextWorks(hvd::Engine& e, Checker& ck, const std::string& after) {
  const int r = e.rank(), n = e.size();
  int32_t x[3] = {r + 1, 2 * (r + 1), 0};
  TensorView v(x, DataType::kInt32, {3});
  const std::string what = "the allreduce after '" + after + "'";
  if (!ck.ExpectOk(WaitDone(e.Allreduce(after + ".next", v, v, ReduceOp::kSum)), what)) return;
  const int s = n * (n + 1) / 2;
  ck.Expect(x[0] == s && x[1] == 2 * s && x[2] == 0,
            what + " gives " + std::to_string(x[0]) + "," + std::to_string(x[1]) + "," + std::to_string(x[2]));
}

void CheckAcrossRanks(hvd::Engine& e, Checker& ck) {
  const int r = e.rank();
  const bool odd = r != 0;  // rank 0 disagrees with the others
  float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int32_t i32[8] = {1, 2, 3, 4, 5, 6, 7, 8};

  TensorView shape_v(f, DataType::kFloat32, {odd ? 5 : 4});
  ExpectInvalid(ck, e.Allreduce("mm.shape", shape_v, shape_v, ReduceOp::kSum), "mm.shape", "shape");
  ExpectNextWorks(e, ck, "mm.shape");

  TensorView dtype_v = odd ? TensorView(i32, DataType::kInt32, {3}) : TensorView(f, DataType::kFloat32, {3});
  ExpectInvalid(ck, e.Allreduce("mm.dtype", dtype_v, dtype_v, ReduceOp::kSum), "mm.dtype", "dtype");
  ExpectNextWorks(e, ck, "mm.dtype");

  TensorView op_v(f, DataType::kFloat32, {3});
  ExpectInvalid(ck, e.Allreduce("mm.op", op_v, op_v, odd ? ReduceOp::kMax : ReduceOp::kSum), "mm.op", "reduce op");
  ExpectNextWorks(e, ck, "mm.op");

  ExpectInvalid(ck, e.Allreduce("mm.scale", op_v, op_v, ReduceOp::kSum, odd ? 2.0 : 1.0), "mm.scale", "scale");
  ExpectNextWorks(e, ck, "mm.scale");

  TensorView root_v(f, DataType::kFloat32, {2});
  ExpectInvalid(ck, e.Broadcast("mm.root", root_v, root_v, odd ? 1 : 0), "mm.root", "root");
  ExpectNextWorks(e, ck, "mm.root");

  TensorView rows_v(f, DataType::kFloat32, {2, odd ? 3 : 4});
  ExpectInvalid(ck, e.Allgather("mm.allgather", rows_v), "mm.allgather", "shape");
  ExpectNextWorks(e, ck, "mm.allgather");

  hvd::HandlePtr h = odd ? e.Broadcast("mm.optype", op_v, op_v, 0) : e.Allreduce("mm.optype", op_v, op_v, ReduceOp::kSum);
  ExpectInvalid(ck, h, "mm.optype", "");
  ExpectNextWorks(e, ck, "mm.optype");
}

// A name in flight cannot be submitted again. Rank 0 submits 'mm.dup' twice before the others
// submit it at all (they wait for a barrier that rank 0 enters after its second try), so the
// first copy is certainly still in flight.
void CheckDuplicateInFlight(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  float a[2] = {1, 2}, b[2] = {3, 4};
  TensorView av(a, DataType::kFloat32, {2}), bv(b, DataType::kFloat32, {2});
  hvd::HandlePtr first;
  if (r == 0) {
    first = e.Allreduce("mm.dup", av, av, ReduceOp::kSum);
    ExpectInvalid(ck, e.Allreduce("mm.dup", bv, bv, ReduceOp::kSum), "mm.dup", "in flight");
  }
  ck.ExpectOk(WaitDone(e.Barrier()), "barrier around mm.dup");
  if (r != 0) first = e.Allreduce("mm.dup", av, av, ReduceOp::kSum);
  if (ck.ExpectOk(WaitDone(first), "the first 'mm.dup' completes")) {
    ck.Expect(a[0] == n && a[1] == 2 * n, "the first 'mm.dup' gives the sum");
  }
  ck.Expect(b[0] == 3 && b[1] == 4, "the refused 'mm.dup' left its tensor alone");
  ExpectNextWorks(e, ck, "mm.dup");

  // A group with a member in flight is refused whole on that rank, naming the member; its
  // other names are free again at once.
  float c[2] = {5, 6}, d[2] = {7, 8};
  TensorView cv(c, DataType::kFloat32, {2}), dv(d, DataType::kFloat32, {2});
  a[0] = 1, a[1] = 2, b[0] = 3, b[1] = 4;
  if (r == 0) {
    first = e.Allreduce("mm.dup.g1", av, av, ReduceOp::kSum);
    for (const auto& h : e.GroupedAllreduce({"mm.dup.g0", "mm.dup.g1"}, {bv, cv}, {bv, cv},
                                            ReduceOp::kSum)) {
      ExpectInvalid(ck, h, "mm.dup.g1", "in flight");
    }
  }
  ck.ExpectOk(WaitDone(e.Barrier()), "barrier around mm.dup.g1");
  if (r != 0) first = e.Allreduce("mm.dup.g1", av, av, ReduceOp::kSum);
  if (ck.ExpectOk(WaitDone(first), "the first 'mm.dup.g1' completes")) {
    ck.Expect(a[0] == n && a[1] == 2 * n, "the first 'mm.dup.g1' gives the sum");
  }
  ck.Expect(b[0] == 3 && b[1] == 4 && c[0] == 5 && c[1] == 6,
            "the refused group left its tensors alone");
  bool done = true;
  for (const auto& h : e.GroupedAllreduce({"mm.dup.g0", "mm.dup.g2"}, {bv, dv}, {bv, dv},
                                          ReduceOp::kSum)) {
    done = ck.ExpectOk(WaitDone(h), "a group under the refused group's free name") && done;
  }
  ck.Expect(!done || (b[0] == 3 * n && b[1] == 4 * n && d[0] == 7 * n && d[1] == 8 * n),
            "the group under the refused group's free name gives the sums");
}

// A group with one member that differs across ranks fails as a whole, on every rank: each
// member's error names the member, what differed and the ranks; no member is executed (the
// inputs are untouched) and none waits. Grouped allreduce, allgather and reducescatter.
void CheckGroupedMismatch(hvd::Engine& e, Checker& ck) {
  const bool odd = e.rank() != 0;
  auto expect_group_failed = [&](const std::vector<hvd::HandlePtr>& hs, const std::string& member,
                                 const std::string& differs) {
    ck.Expect(hs.size() == 3, "a group of 3 gives 3 handles");
    for (const auto& h : hs) {
      ExpectInvalid(ck, h, member, differs);
      ck.Expect(h->status().message().find("rank 0 vs rank") != std::string::npos,
                "the group's error names the ranks: " + h->status().message());
    }
  };
  float a[12], b[12], c[12];
  auto fill = [&] {
    for (int i = 0; i < 12; ++i) a[i] = b[i] = c[i] = static_cast<float>(i + 1);
  };
  auto untouched = [&](const std::string& what) {
    bool same = true;
    for (int i = 0; i < 12; ++i) same = same && a[i] == i + 1 && b[i] == i + 1 && c[i] == i + 1;
    ck.Expect(same, what + ": the failed group left every member's tensor alone");
  };

  fill();
  TensorView a4(a, DataType::kFloat32, {4}), c4(c, DataType::kFloat32, {4});
  TensorView b_odd(b, DataType::kFloat32, {odd ? 5 : 4});
  expect_group_failed(e.GroupedAllreduce({"mm.gar.0", "mm.gar.1", "mm.gar.2"}, {a4, b_odd, c4},
                                         {a4, b_odd, c4}, ReduceOp::kSum),
                      "mm.gar.1", "shape");
  untouched("grouped allreduce");
  ExpectNextWorks(e, ck, "mm.gar");

  // Allgather: the first dimension may differ, the others may not.
  TensorView a23(a, DataType::kFloat32, {2, 3}), b23(b, DataType::kFloat32, {2, 3});
  TensorView c_odd(c, DataType::kFloat32, {2, odd ? 2 : 3});
  expect_group_failed(e.GroupedAllgather({"mm.gag.0", "mm.gag.1", "mm.gag.2"}, {a23, b23, c_odd}),
                      "mm.gag.2", "shape");
  untouched("grouped allgather");
  ExpectNextWorks(e, ck, "mm.gag");

  TensorView a_odd(a, DataType::kFloat32, {odd ? 6 : 4, 2}), b42(b, DataType::kFloat32, {4, 2});
  TensorView c42(c, DataType::kFloat32, {4, 2});
  expect_group_failed(
      e.GroupedReducescatter({"mm.grs.0", "mm.grs.1", "mm.grs.2"}, {a_odd, b42, c42}, ReduceOp::kSum),
      "mm.grs.0", "shape");
  untouched("grouped reducescatter");
  ExpectNextWorks(e, ck, "mm.grs");

  // Groups of different sizes: rank 0 groups three tensors, the others two of them (and, next,
  // one of them alone); then groups of two whose second members differ. No group can complete
  // as every rank sees it: each fails as a whole at once on every rank, naming the group
  // membership that differs; nothing waits.
  fill();
  TensorView b4(b, DataType::kFloat32, {4});
  for (const char* prefix : {"mm.gsz2.", "mm.gsz1.", "mm.gmem."}) {
    const std::string p = prefix;
    std::vector<std::string> names = {p + "0", p + "1", p + "2"};
    std::vector<TensorView> views = {a4, b4, c4};
    if (p == "mm.gmem.") {
      names = {p + "0", odd ? p + "9" : p + "1"};
      views.resize(2);
    } else if (odd) {
      const size_t others = p == "mm.gsz2." ? 2 : 1;
      names.resize(others);
      views.resize(others);
    }
    std::vector<hvd::HandlePtr> hs;
    if (names.size() == 1) {
      hs.push_back(e.Allreduce(names[0], views[0], views[0], ReduceOp::kSum));
    } else {
      hs = e.GroupedAllreduce(names, views, views, ReduceOp::kSum);
    }
    ck.Expect(hs.size() == names.size(), p + ": a handle per tensor");
    for (size_t i = 0; i < hs.size(); ++i) ExpectInvalid(ck, hs[i], p, "group membership");
    untouched(p + ": groups of different sizes");
    ExpectNextWorks(e, ck, p);
  }
}

// A group on some ranks whose members the others submit alone, one at a time: the others'
// lone requests come to the coordinator before or after the group failed, and each fails with
// the group, naming the membership, instead of waiting for ranks that have moved on. Each rank
// pairs its k-th submission of a name with the others' k-th: a member the group's failure
// answered before this rank submitted it is answered when it does. Then the same names, in
// agreement and with other shapes, give their sums.
void CheckLoneMembers(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  const bool grouping = r % 2 == 0;
  float a[4], b[4];
  auto fill = [&] {
    for (int i = 0; i < 4; ++i) a[i] = b[i] = static_cast<float>(r + i);
  };
  auto sums = [&](const std::string& p) {
    // (Other shapes than the failed requests': a request left over from them cannot pass.)
    fill();
    TensorView a3(a, DataType::kFloat32, {3}), b3(b, DataType::kFloat32, {3});
    bool ok = ck.ExpectOk(WaitDone(e.Allreduce(p + "0", a3, a3, ReduceOp::kSum)), p + "0 again");
    ok = ck.ExpectOk(WaitDone(e.Allreduce(p + "1", b3, b3, ReduceOp::kSum)), p + "1 again") && ok;
    const float ranks = static_cast<float>(n * (n - 1) / 2);
    for (int i = 0; ok && i < 3; ++i) ok = a[i] == ranks + n * i && b[i] == ranks + n * i;
    ck.Expect(ok, p + "0 and " + p + "1 in agreement give their sums");
  };
  fill();
  TensorView a4(a, DataType::kFloat32, {4}), b4(b, DataType::kFloat32, {4});

  // Late: the lone ranks submit the second member only after the first one's error, when the
  // group has failed on every rank.
  if (grouping) {
    for (const auto& h : e.GroupedAllreduce({"lone.late.0", "lone.late.1"}, {a4, b4}, {a4, b4},
                                            ReduceOp::kSum)) {
      ExpectInvalid(ck, h, "lone.late.", "group membership");
    }
  } else {
    ExpectInvalid(ck, e.Allreduce("lone.late.0", a4, a4, ReduceOp::kSum), "lone.late.0",
                  "group membership");
    hvd::Status s = WaitDone(e.Allreduce("lone.late.1", b4, b4, ReduceOp::kSum), 20.0);
    ck.Expect(s.code() == StatusCode::kInvalidArgument &&
                  s.message().find("group membership") != std::string::npos,
              "the lone member submitted after its group failed fails with it: " + s.ToString());
  }
  ck.Expect(a[0] == r && b[0] == r, "lone.late: nothing ran");
  sums("lone.late.");

  // Early: the lone ranks' requests wait at the coordinator before the group comes.
  fill();
  std::vector<hvd::HandlePtr> hs;
  if (!grouping) {
    hs.push_back(e.Allreduce("lone.early.0", a4, a4, ReduceOp::kSum));
    hs.push_back(e.Allreduce("lone.early.1", b4, b4, ReduceOp::kSum));
  }
  ck.ExpectOk(WaitDone(e.Barrier()), "barrier before lone.early");
  if (grouping) {
    hs = e.GroupedAllreduce({"lone.early.0", "lone.early.1"}, {a4, b4}, {a4, b4}, ReduceOp::kSum);
  }
  for (const auto& h : hs) ExpectInvalid(ck, h, "lone.early.", "group membership");
  ck.Expect(a[0] == r && b[0] == r, "lone.early: nothing ran");
  sums("lone.early.");

  // Fewer: the lone ranks group the first two members only, then every rank groups all three:
  // the member left out of the failed step is not owed by the ranks that left it out.
  float c[4];
  auto fill3 = [&] {
    fill();
    for (int i = 0; i < 4; ++i) c[i] = static_cast<float>(r + i);
  };
  TensorView c4(c, DataType::kFloat32, {4});
  std::vector<std::string> names = {"lone.fewer.0", "lone.fewer.1", "lone.fewer.2"};
  std::vector<TensorView> views = {a4, b4, c4};
  fill3();
  if (!grouping) {
    names.pop_back();
    views.pop_back();
  }
  for (const auto& h : e.GroupedAllreduce(names, views, views, ReduceOp::kSum)) {
    ExpectInvalid(ck, h, "lone.fewer.", "group membership");
  }
  fill3();
  bool ok = true;
  for (const auto& h : e.GroupedAllreduce({"lone.fewer.0", "lone.fewer.1", "lone.fewer.2"},
                                          {a4, b4, c4}, {a4, b4, c4}, ReduceOp::kSum)) {
    ok = ck.ExpectOk(WaitDone(h, 20.0), "lone.fewer: the next step's group") && ok;
  }
  const float ranks = static_cast<float>(n * (n - 1) / 2);
  for (int i = 0; ok && i < 4; ++i) {
    ok = a[i] == ranks + n * i && b[i] == ranks + n * i && c[i] == ranks + n * i;
  }
  ck.Expect(ok, "lone.fewer: the next step's group gives its sums");

  // Cached: the second member has run alone on every rank before (the response cache holds it),
  // so the lone ranks' submission of it may travel as a cached bit, which could be agreed on
  // with the grouping ranks' next, identical submission. Late (after the first member's error)
  // or at once with the first (its bit may reach rank 0 before or after the group fails), it
  // fails as the group did; the next one pairs with the next.
  for (const std::string p : {"lone.cached.", "lone.together."}) {
    const bool together = p == "lone.together.";
    auto lone_sum = [&](float base) {
      for (int i = 0; i < 4; ++i) b[i] = base + static_cast<float>(r + i);
      return WaitDone(e.Allreduce(p + "1", b4, b4, ReduceOp::kSum), 20.0);
    };
    auto expect_sum = [&](const std::string& what, float base, const hvd::Status& s) {
      bool right = ck.ExpectOk(s, what);
      for (int i = 0; right && i < 4; ++i) right = b[i] == n * base + ranks + n * i;
      ck.Expect(right, what + " gives the sum of the same step on every rank");
    };
    for (int k = 0; k < 2; ++k) expect_sum(p + "1 before", 0.0f, lone_sum(0.0f));
    fill();
    if (grouping) {
      for (const auto& h : e.GroupedAllreduce({p + "0", p + "1"}, {a4, b4}, {a4, b4},
                                              ReduceOp::kSum)) {
        ExpectInvalid(ck, h, p, "group membership");
      }
    } else {
      hvd::HandlePtr first = e.Allreduce(p + "0", a4, a4, ReduceOp::kSum);
      hvd::HandlePtr second;
      for (int i = 0; together && i < 4; ++i) b[i] = 1000.0f + static_cast<float>(r + i);
      if (together) second = e.Allreduce(p + "1", b4, b4, ReduceOp::kSum);
      ExpectInvalid(ck, first, p + "0", "group membership");
      if (!together) {
        for (int i = 0; i < 4; ++i) b[i] = 1000.0f + static_cast<float>(r + i);
        second = e.Allreduce(p + "1", b4, b4, ReduceOp::kSum);
      }
      const hvd::Status s = WaitDone(second, 20.0);
      ck.Expect(s.code() == StatusCode::kInvalidArgument &&
                    s.message().find("group membership") != std::string::npos,
                p + "1, the cached member submitted alone, fails with its group: " + s.ToString());
    }
    expect_sum(p + "1 after", 0.0f, lone_sum(0.0f));
  }
}

// The same on the response cache's fast path: a group run twice (its members cached with their
// group), then with one member's shape different on every rank but rank 0, fails as a whole on
// every rank, naming the member and the shape, with nothing run and nothing waiting; then the
// same names grouped in another order on every rank but rank 0 (another group) fail naming the
// membership; and the first group, as it was, runs again.
void CheckCachedGroupMismatch(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  float a[6], b[6], c[6];
  auto fill = [&] {
    for (int i = 0; i < 6; ++i) {
      a[i] = static_cast<float>(r + i);
      b[i] = static_cast<float>(2 * r + i);
      c[i] = static_cast<float>(3 * r + i);
    }
  };
  const std::vector<std::string> names = {"cg.0", "cg.1", "cg.2"};
  auto run_whole = [&](const std::string& when) {
    fill();
    TensorView a4(a, DataType::kFloat32, {4}), b5(b, DataType::kFloat32, {5}),
        c6(c, DataType::kFloat32, {6});
    auto hs = e.GroupedAllreduce(names, {a4, b5, c6}, {a4, b5, c6}, ReduceOp::kSum);
    const float ranks = static_cast<float>(n * (n - 1) / 2);
    bool right = hs.size() == 3;
    for (auto& h : hs) right = ck.ExpectOk(WaitDone(h), "cached group " + when) && right;
    for (int i = 0; right && i < 6; ++i) {
      right = (i >= 4 || a[i] == ranks + n * i) && (i >= 5 || b[i] == 2 * ranks + n * i) &&
              c[i] == 3 * ranks + n * i;
    }
    ck.Expect(right, "cached group " + when + ": every member's sum is right");
  };
  run_whole("first");
  run_whole("second");
  fill();
  TensorView a4(a, DataType::kFloat32, {4}), c6(c, DataType::kFloat32, {6});
  TensorView b_odd(b, DataType::kFloat32, {r != 0 ? 4 : 5});
  auto hs = e.GroupedAllreduce(names, {a4, b_odd, c6}, {a4, b_odd, c6}, ReduceOp::kSum);
  for (auto& h : hs) ExpectInvalid(ck, h, "cg.1", "shape");
  bool untouched = true;
  for (int i = 0; i < 6; ++i) untouched = untouched && a[i] == r + i && c[i] == 3 * r + i;
  ck.Expect(untouched, "the cached group that failed left its members alone");
  ExpectNextWorks(e, ck, "cg.shape");

  fill();
  TensorView b5(b, DataType::kFloat32, {5});
  if (r == 0) {
    hs = e.GroupedAllreduce(names, {a4, b5, c6}, {a4, b5, c6}, ReduceOp::kSum);
  } else {
    hs = e.GroupedAllreduce({names[1], names[0], names[2]}, {b5, a4, c6}, {b5, a4, c6},
                            ReduceOp::kSum);
  }
  for (auto& h : hs) ExpectInvalid(ck, h, "cg.", "group membership");
  ExpectNextWorks(e, ck, "cg.membership");
  run_whole("again");
}

// Arguments that one rank alone gets wrong (the last; the others' are right): that rank's
// refusal is negotiated, so every rank fails the operation together with its reason, naming
// it, instead of the others waiting for a rank that gave up. Nothing is executed; the next
// operation works. Checks made at the call (splits past the rows, an output that does not fit,
// a null output) and at enqueue (a root outside the world, splits of the wrong number), on a
// name the response cache holds too, and in a group.
void CheckOneSided(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  const bool bad = r == n - 1;
  const std::string who = "rank " + std::to_string(n - 1);
  auto expect = [&](const hvd::HandlePtr& h, const std::string& name, const std::string& why) {
    ExpectInvalid(ck, h, name, why);
    const std::string m = h->status().message();
    ck.Expect(m.find(who) != std::string::npos && m.find("fails on every rank") != std::string::npos,
              name + ": the error names " + who + " and says every rank fails: " + m);
    ExpectNextWorks(e, ck, name);
  };
  float f[8];
  for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(10 * r + i);
  TensorView v4(f, DataType::kFloat32, {4});
  expect(e.Broadcast("one.root", v4, v4, bad ? n : 0), "one.root",
         "root rank " + std::to_string(n) + " is outside");
  ck.Expect(f[0] == 10.0f * r && f[3] == 10.0f * r + 3, "one.root: nothing was broadcast");

  TensorView rows(f, DataType::kFloat32, {n});
  expect(e.Alltoall("one.splits.count", rows, bad ? std::vector<int64_t>(n + 1, 0)
                                                   : std::vector<int64_t>(n, 1)),
         "one.splits.count", "splits must be");
  std::vector<int64_t> past(n, 1);
  if (bad) past[0] = n + 1;
  expect(e.Alltoall("one.splits.sum", rows, past), "one.splits.sum", "at most the first dimension");

  float out[8];
  TensorView out3(out, DataType::kFloat32, {3}), in4(f, DataType::kFloat32, {4});
  expect(e.Allreduce("one.output", in4, bad ? out3 : TensorView(out, DataType::kFloat32, {4}),
                     ReduceOp::kSum),
         "one.output", "does not match input");

  // A data type or reduce op that is none of hvd's (a cast of a wrong number) on one rank: the
  // request still travels (it was taken for a garbled list and a lost peer).
  TensorView odd(f, bad ? static_cast<DataType>(77) : DataType::kFloat32, {4});
  expect(e.Allgather("one.dtype", odd), "one.dtype", "data type 77 is none of hvd's");
  expect(e.Allreduce("one.op", v4, v4, bad ? static_cast<ReduceOp>(42) : ReduceOp::kSum),
         "one.op", "reduce op 42 is none of hvd's");

  bool flags[4] = {true, false, true, false};
  TensorView bools(flags, DataType::kBool, {4});
  expect(e.Reducescatter("one.bool", bools, bad ? ReduceOp::kAverage : ReduceOp::kSum),
         "one.bool", "average is not defined for bool");

  // A name the response cache holds on every rank, then a null output on one.
  for (int step = 0; step < 2; ++step) {
    TensorView w(f, DataType::kFloat32, {2});
    ck.ExpectOk(WaitDone(e.Allreduce("one.cached", w, w, ReduceOp::kSum)), "one.cached step");
  }
  TensorView w(f, DataType::kFloat32, {2});
  expect(e.Allreduce("one.cached", w, bad ? TensorView(nullptr, DataType::kFloat32, {2}) : w,
                     ReduceOp::kSum),
         "one.cached", "output data is null");
  // The same with a null input, which the request built in its name's node finds.
  for (int step = 0; step < 2; ++step) {
    ck.ExpectOk(WaitDone(e.Allreduce("one.cached", w, w, ReduceOp::kSum)), "one.cached again");
  }
  TensorView null_in(nullptr, DataType::kFloat32, {2});
  expect(e.Allreduce("one.cached", bad ? null_in : w, w, ReduceOp::kSum), "one.cached",
         "input data is null");

  // Two ranks refuse for different reasons: every rank gets the first one's, each refusing
  // rank its own too.
  if (n > 2) {
    const bool first = r == 0, second = r == n - 1;
    TensorView in2(f, DataType::kFloat32, {2});
    auto h = e.Allreduce("one.two", first ? null_in : in2,
                         second ? TensorView(out, DataType::kFloat32, {1}) : in2, ReduceOp::kSum);
    hvd::Status st = WaitDone(h);
    const std::string m = st.message();
    ck.Expect(st.code() == StatusCode::kInvalidArgument &&
                  m.find("on rank 0: input data is null") != std::string::npos &&
                  m.find("ranks [0, " + std::to_string(n - 1) + "] refused it") != std::string::npos,
              "one.two: every rank gets rank 0's reason and both ranks: " + m);
    ck.Expect(!second || m.find("this rank refused it too: allreduce 'one.two' on rank " +
                                std::to_string(n - 1) + ": output") != std::string::npos,
              "one.two: the second refusing rank gets its own reason too: " + m);
    ExpectNextWorks(e, ck, "one.two");
  }

  // In a group: the member's reason fails the whole group on every rank.
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, c[4] = {1, 2, 3, 4}, small[2];
  TensorView a4(a, DataType::kFloat32, {4}), b4(b, DataType::kFloat32, {4});
  TensorView c4(c, DataType::kFloat32, {4});
  TensorView b_out = bad ? TensorView(small, DataType::kFloat32, {2}) : b4;
  auto hs = e.GroupedAllreduce({"one.group.0", "one.group.1", "one.group.2"}, {a4, b4, c4},
                               {a4, b_out, c4}, ReduceOp::kSum);
  ck.Expect(hs.size() == 3, "one.group: a handle per tensor");
  for (const auto& h : hs) {
    ExpectInvalid(ck, h, "one.group.1", "does not match input");
    ck.Expect(h->status().message().find("failed as a whole") != std::string::npos,
              "one.group: the group fails as a whole: " + h->status().message());
  }
  ck.Expect(a[3] == 4 && c[3] == 4, "one.group: no member was reduced");
  ExpectNextWorks(e, ck, "one.group");
}

// The fast path (cached tensors agreed by one AND of every rank's bits): a tensor cached on
// every rank whose shape then changes on one rank fails with the mismatch named, and one that a
// rank submits more than a second late still completes with the right sum.
void CheckCachedTensors(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  float x[6];
  auto sum_of = [&](const std::string& name, int elems) -> hvd::Status {
    for (int i = 0; i < 6; ++i) x[i] = static_cast<float>(r + 1);
    TensorView v(x, DataType::kFloat32, {elems});
    return WaitDone(e.Allreduce(name, v, v, ReduceOp::kSum));
  };
  for (int step = 0; step < 3; ++step) {
    if (ck.ExpectOk(sum_of("mm.cached", 4), "cached step " + std::to_string(step))) {
      ck.Expect(x[0] == n * (n + 1) / 2.0f, "cached step gives the sum");
    }
  }
  float y[6] = {0};
  TensorView changed(y, DataType::kFloat32, {r == 0 ? 5 : 4});
  ExpectInvalid(ck, e.Allreduce("mm.cached", changed, changed, ReduceOp::kSum), "mm.cached",
                "shape");
  ExpectNextWorks(e, ck, "mm.cached");
  for (int step = 0; step < 2; ++step) {
    if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(step ? 1300 : 0));
    if (ck.ExpectOk(sum_of("mm.late", 3), "late step " + std::to_string(step))) {
      ck.Expect(x[0] == n * (n + 1) / 2.0f && x[2] == x[0], "a step with a late rank gives the sum");
    }
  }
}

void CheckDuplicateInGroup(hvd::Engine& e, Checker& ck) {
  float a[2] = {1, 2}, b[2] = {3, 4};
  TensorView av(a, DataType::kFloat32, {2}), bv(b, DataType::kFloat32, {2});
  auto hs = e.GroupedAllreduce({"mm.group", "mm.group"}, {av, bv}, {av, bv}, ReduceOp::kSum);
  for (auto& h : hs) ExpectInvalid(ck, h, "mm.group", "");
  ExpectNextWorks(e, ck, "mm.group");
}

// One name through every way an entry is built (an allreduce built in its name's node, other
// ops and groups moved there) and across shapes, dtypes and factors: each use gives its own
// result, whatever the node held before (a name longer than a string's inline storage, so that
// the node's heap storage is what is kept and written over). A refused use (an unknown process
// set) leaves the name free.
void CheckNameReuse(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  const std::string name = "mm.reuse.a.name.longer.than.inline.storage";
  const double sum = n * (n + 1) / 2.0;
  float f[5];
  for (int i = 0; i < 5; ++i) f[i] = static_cast<float>((r + 1) * (i + 1));
  TensorView fv(f, DataType::kFloat32, {5});
  if (ck.ExpectOk(WaitDone(e.Allreduce(name, fv, fv, ReduceOp::kSum)), "reuse: float32 {5}")) {
    ck.Expect(f[0] == sum && f[4] == 5 * sum, "reuse: float32 {5} gives the sum");
  }
  int64_t g[6], out[6];
  for (int i = 0; i < 6; ++i) g[i] = (r + 1) * (i + 1);
  TensorView gv(g, DataType::kInt64, {2, 3}), ov(out, DataType::kInt64, {2, 3});
  if (ck.ExpectOk(WaitDone(e.Allreduce(name, gv, ov, ReduceOp::kMax, 2.0)), "reuse: int64 {2,3}")) {
    ck.Expect(out[0] == 2 * n && out[5] == 12 * n && g[5] == 6 * (r + 1),
              "reuse: int64 {2,3} max with prescale 2, out of place");
  }
  float b[3] = {static_cast<float>(r), 7, 8};
  TensorView bv(b, DataType::kFloat32, {3});
  if (ck.ExpectOk(WaitDone(e.Broadcast(name, bv, bv, n - 1)), "reuse: broadcast")) {
    ck.Expect(b[0] == n - 1 && b[1] == 7, "reuse: broadcast from the last rank");
  }
  float one = static_cast<float>(r + 1), other = 1;
  TensorView onev(&one, DataType::kFloat32, {1}), otherv(&other, DataType::kFloat32, {1});
  auto hs = e.GroupedAllreduce({name, name + ".2"}, {onev, otherv}, {onev, otherv},
                               ReduceOp::kSum);
  for (auto& h : hs) ck.ExpectOk(WaitDone(h), "reuse: grouped");
  ck.Expect(one == sum && other == n, "reuse: grouped allreduce gives the sums");
  hvd::Status refused = WaitDone(e.Allreduce(name, onev, onev, ReduceOp::kSum, 1.0, 1.0, 12345));
  ck.Expect(refused.code() == StatusCode::kInvalidArgument,
            "reuse: an unknown process set is refused: " + refused.ToString());
  one = static_cast<float>(r + 1);
  if (ck.ExpectOk(WaitDone(e.Allreduce(name, onev, onev, ReduceOp::kAverage)), "reuse: after")) {
    ck.Expect(one == static_cast<float>(sum / n), "reuse: the name works after a refusal");
  }
}

}  // namespace

// Shapes whose size is over the limit or wraps 64 bits: refused on every op, by every rank
// (negotiated as a refusal: the buffer is tiny, nothing may read past it), then the next op
// works.
// A wait with a timeout too long for the clock waits for the operation instead of timing out.
void CheckSizeLimits(hvd::Engine& e, Checker& ck) {
  float x[64] = {0};
  const std::vector<std::vector<int64_t>> shapes = {
      {int64_t{0x4000000000000004}},        // 4 bytes apiece: wraps to 16 bytes
      {int64_t{0x2000000000000002}},        // wraps to 8 bytes
      {int64_t{1} << 40, int64_t{1} << 40},  // 2^80 elements
      {int64_t{1} << 45}};                  // 128 TiB of float32: over the 64 TiB limit
  int k = 0;
  for (const auto& shape : shapes) {
    const std::string name = "size.limit." + std::to_string(k++);
    TensorView v(x, DataType::kFloat32, shape);
    for (auto h : {e.Allreduce(name + ".ar", v, v, ReduceOp::kSum), e.Allgather(name + ".ag", v),
                   e.Broadcast(name + ".bc", v, v, 0), e.Reducescatter(name + ".rs", v)}) {
      hvd::Status s = WaitDone(h);
      ck.Expect(s.code() == StatusCode::kInvalidArgument &&
                    s.message().find("TiB") != std::string::npos,
                name + " " + hvd::ShapeToString(shape) + " refused: " + s.ToString());
    }
  }
  // Splits whose sum wraps are refused as splits past the first dimension.
  TensorView rows(x, DataType::kFloat32, {4});
  std::vector<int64_t> splits(e.size(), 0);
  splits[0] = INT64_MAX;
  hvd::Status s = WaitDone(e.Alltoall("size.limit.splits", rows, splits));
  ck.Expect(s.code() == StatusCode::kInvalidArgument, "alltoall splits of INT64_MAX refused: " +
                                                          s.ToString());
  ExpectNextWorks(e, ck, "size.limit");
  float y[2] = {1, 2};
  TensorView yv(y, DataType::kFloat32, {2});
  s = e.Allreduce("size.limit.wait", yv, yv, ReduceOp::kSum)->WaitFor(std::chrono::milliseconds::max());
  ck.ExpectOk(s, "WaitFor(milliseconds::max()) waits for the operation");
  ck.Expect(y[1] == 2.0f * e.size(), "the allreduce waited for with no limit is done");
}

int RunMismatchChecks(hvd::Engine& e, Checker& ck) {
  ck.Begin("mismatch errors");
  if (e.size() > 1) {
    CheckAcrossRanks(e, ck);
    CheckDuplicateInFlight(e, ck);
    CheckGroupedMismatch(e, ck);
    CheckCachedGroupMismatch(e, ck);
    CheckLoneMembers(e, ck);
    CheckOneSided(e, ck);
    CheckCachedTensors(e, ck);
  }
  CheckDuplicateInGroup(e, ck);
  CheckNameReuse(e, ck);
  CheckSizeLimits(e, ck);
  return ck.End();
}

int RunShutdownChecks(hvd::Engine& e, Checker& ck) {
  ck.Begin("shutdown");
  ck.ExpectOk(WaitDone(e.Barrier()), "the last barrier");
  ck.ExpectOk(e.Shutdown(), "shutdown");
  float x = 1;
  TensorView v(&x, DataType::kFloat32, {1});
  hvd::HandlePtr h = e.Allreduce("after.shutdown", v, v, ReduceOp::kSum);
  hvd::Status s = WaitDone(h, 10.0);
  ck.Expect(h->Finished() && !s.ok(), "an allreduce after shutdown fails at once: " + s.ToString());
  ck.Expect(s.code() == StatusCode::kAborted, "... with Aborted: " + s.ToString());
  s = WaitDone(e.Barrier(), 10.0);
  ck.Expect(!s.ok() && s.code() != StatusCode::kTimeout, "a barrier after shutdown fails: " + s.ToString());
  ck.ExpectOk(e.Shutdown(), "a second shutdown");
  return ck.End();
}

}  // namespace mp
