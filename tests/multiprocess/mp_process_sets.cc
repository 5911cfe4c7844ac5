// Process-set checks (mp_collectives_worker --process-sets, under HVD_DYNAMIC_PROCESS_SETS=1):
// collectives inside several sets at once (the even ranks, the odd ranks, all but the last, the
// last alone), values computed from each member's place in its set; the same name in several
// sets at once; a set whose member is late holds back no other set, nor does a collective
// rank 0 is inside hold back a set it is not in; and the errors: an op on a
// set this rank is not in, a root outside the set, ranks that differ across ranks, a set that
// exists already, removing a set that does not exist, and removing a set with an operation in
// flight. Every rank runs the same sequence of collective calls.
//
// --process-sets-static (without the dynamic knob) checks that only the sets given at start
// exist and that adding one later fails.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <deque>
#include <memory>
#include <thread>

#include "mp_checks.h"

namespace mp {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::TensorView;

namespace {

struct Set {
  int32_t id = -1;
  std::vector<int> ranks;
  int place = -1;  // this rank's index in ranks; -1: not a member
};

// The ids Horovod gives (its ProcessSetTable): a removed set's id goes to the next set added,
// the first removed first; with none free, the next unused id. Every addition and removal of
// a test's engine goes through AddSet and RemoveSet, which keep this account of it.
struct IdAccount {
  std::deque<int32_t> freed;
  int32_t next = 1;
};
IdAccount ids_given;

int32_t NextId() {
  if (ids_given.freed.empty()) return ids_given.next++;
  const int32_t id = ids_given.freed.front();
  ids_given.freed.pop_front();
  return id;
}

Set AddSet(hvd::Engine& e, Checker& ck, std::vector<int> ranks) {
  Set s;
  s.ranks = ranks;
  auto it = std::find(ranks.begin(), ranks.end(), e.rank());
  s.place = it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
  auto id = e.AddProcessSet(ranks);
  if (ck.ExpectOk(id.status(), "AddProcessSet " + ShapeStr({ranks.begin(), ranks.end()}))) {
    s.id = *id;
    ck.Expect(e.ProcessSetRanks(s.id) == ranks, "ProcessSetRanks of set " + std::to_string(s.id));
    const int32_t want = NextId();
    ck.Expect(s.id == want, "set " + ShapeStr({ranks.begin(), ranks.end()}) + " gets id " +
                                std::to_string(want) + " (got " + std::to_string(s.id) + ")");
  }
  return s;
}

void RemoveSet(hvd::Engine& e, Checker& ck, int32_t id, const std::string& what) {
  if (ck.ExpectOk(e.RemoveProcessSet(id), what)) ids_given.freed.push_back(id);
}

// Allreduce of every dtype and op at counts 0, 1, 17 and 70000 in set s, submitted together.
void CheckAllreduce(hvd::Engine& e, Checker& ck, const Set& s, int64_t salt) {
  const int n = static_cast<int>(s.ranks.size());
  struct Op {
    DataType t;
    ReduceOp op;
    int64_t count;
    std::unique_ptr<Buffer> buf;
    hvd::HandlePtr h;
  };
  std::vector<Op> ops;
  for (DataType t : AllDataTypes()) {
    for (ReduceOp op : AllReduceOps()) {
      if (t == DataType::kBool && op == ReduceOp::kAverage) continue;
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{70000}}) {
        if (count == 70000 && op != ReduceOp::kSum) continue;
        Op o{t, op, count, std::make_unique<Buffer>(t, count), nullptr};
        for (int64_t i = 0; i < count; ++i) {
          Put(t, o.buf->data(), i, ReduceInput(t, op, s.place, n, i, salt + count));
        }
        TensorView v(o.buf->data(), t, {count});
        o.h = e.Allreduce("ps.ar." + Str(t) + "." + Str(op) + "." + std::to_string(count), v, v,
                          op, 1.0, 1.0, s.id);
        ops.push_back(std::move(o));
      }
    }
  }
  for (auto& o : ops) {
    const std::string what = "set " + std::to_string(s.id) + " allreduce " + Str(o.t) + " " +
                             Str(o.op) + " x" + std::to_string(o.count);
    if (!ck.ExpectOk(WaitDone(o.h), what)) continue;
    ck.ExpectElements(o.t, o.buf->data(), o.count,
                      [&](int64_t i) { return ExpectedReduce(o.t, o.op, n, i, salt + o.count); },
                      what);
  }
}

// Allgather (member q gives q + 1 rows of 3), broadcast from every member, alltoall (member q
// sends j + q rows to member j), reducescatter of 2n + 1 rows, a grouped allreduce and a barrier.
void CheckMovement(hvd::Engine& e, Checker& ck, const Set& s) {
  const int n = static_cast<int>(s.ranks.size()), q = s.place, me = e.rank();
  const DataType t = DataType::kInt32;
  const std::string tag = "set " + std::to_string(s.id) + " ";
  {
    Buffer in(t, (q + 1) * 3);
    for (int64_t i = 0; i < (q + 1) * 3; ++i) Put(t, in.data(), i, Pattern(t, me, i, 1));
    auto h = e.Allgather("ps.gather", TensorView(in.data(), t, {q + 1, 3}), nullptr, s.id);
    if (ck.ExpectOk(WaitDone(h), tag + "allgather")) {
      std::vector<int64_t> want_shape = {n * (n + 1) / 2, 3};
      ck.Expect(h->output_shape() == want_shape, tag + "allgather shape " + ShapeStr(h->output_shape()));
      std::vector<double> want;
      for (int m = 0; m < n; ++m) {
        for (int64_t i = 0; i < (m + 1) * 3; ++i) want.push_back(Pattern(t, s.ranks[m], i, 1));
      }
      if (h->output_bytes().size() >= want.size() * 4) {
        ck.ExpectElements(t, h->output_bytes().data(), static_cast<int64_t>(want.size()),
                          [&](int64_t i) { return want[i]; }, tag + "allgather values");
      }
    }
  }
  for (int root : s.ranks) {
    Buffer buf(t, 5);
    for (int64_t i = 0; i < 5; ++i) Put(t, buf.data(), i, Pattern(t, me, i, 2));
    TensorView v(buf.data(), t, {5});
    auto h = e.Broadcast("ps.bcast." + std::to_string(root), v, v, root, s.id);
    const std::string what = tag + "broadcast from rank " + std::to_string(root);
    if (ck.ExpectOk(WaitDone(h), what)) {
      ck.ExpectElements(t, buf.data(), 5, [&](int64_t i) { return Pattern(t, root, i, 2); }, what);
    }
  }
  if (n > 1) {
    // The set's last member alone names a root outside the set (a rank of the world that is
    // not a member, else one past the world): every member fails together with its reason.
    int outside = e.size();
    for (int w = 0; w < e.size(); ++w) {
      if (std::find(s.ranks.begin(), s.ranks.end(), w) == s.ranks.end()) outside = w;
    }
    const int last = s.ranks[n - 1];
    Buffer buf(t, 5);
    TensorView v(buf.data(), t, {5});
    hvd::Status st =
        WaitDone(e.Broadcast("ps.bcast.one", v, v, me == last ? outside : s.ranks[0], s.id));
    const std::string m = st.message();
    ck.Expect(st.code() == hvd::StatusCode::kInvalidArgument &&
                  m.find("on rank " + std::to_string(last) + ": root rank " +
                         std::to_string(outside)) != std::string::npos &&
                  m.find("fails on every rank of process set " + std::to_string(s.id)) !=
                      std::string::npos,
              tag + "a root outside the set on rank " + std::to_string(last) +
                  " alone fails every member: got " + st.ToString());
  }
  {
    std::vector<int64_t> splits;
    int64_t rows = 0;
    for (int j = 0; j < n; ++j) {
      splits.push_back(j + q);
      rows += j + q;
    }
    Buffer in(t, rows * 2);
    int64_t at = 0;
    for (int j = 0; j < n; ++j) {
      for (int64_t k = 0; k < (j + q) * 2; ++k) Put(t, in.data(), at++, Pattern(t, me, j, k));
    }
    auto h = e.Alltoall("ps.a2a", TensorView(in.data(), t, {rows, 2}), splits, nullptr, s.id);
    if (ck.ExpectOk(WaitDone(h), tag + "alltoall")) {
      std::vector<double> want;
      std::vector<int64_t> got_splits;
      for (int m = 0; m < n; ++m) {
        got_splits.push_back(q + m);
        for (int64_t k = 0; k < (q + m) * 2; ++k) want.push_back(Pattern(t, s.ranks[m], q, k));
      }
      ck.Expect(h->received_splits() == got_splits, tag + "alltoall received splits");
      if (h->output_bytes().size() >= want.size() * 4) {
        ck.ExpectElements(t, h->output_bytes().data(), static_cast<int64_t>(want.size()),
                          [&](int64_t i) { return want[i]; }, tag + "alltoall values");
      }
    }
  }
  {
    const int64_t rows = 2 * n + 1, cols = 3;
    Buffer in(t, rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      Put(t, in.data(), i, ReduceInput(t, ReduceOp::kSum, q, n, i, 9));
    }
    auto h = e.Reducescatter("ps.rs", TensorView(in.data(), t, {rows, cols}), ReduceOp::kSum, 1.0,
                             1.0, nullptr, s.id);
    if (ck.ExpectOk(WaitDone(h), tag + "reducescatter")) {
      const RowShare share = ReducescatterShare(rows, n, q);
      const int64_t first = share.first, mine = share.count;
      ck.Expect(h->output_shape() == std::vector<int64_t>({mine, cols}), tag + "reducescatter shape");
      if (h->output_bytes().size() >= static_cast<size_t>(mine * cols * 4)) {
        ck.ExpectElements(t, h->output_bytes().data(), mine * cols,
                          [&](int64_t i) { return ExpectedReduce(t, ReduceOp::kSum, n, first * cols + i, 9); },
                          tag + "reducescatter values");
      }
    }
  }
  {
    Buffer a(DataType::kFloat64, 4), b(DataType::kFloat64, 7);
    for (int64_t i = 0; i < 4; ++i) Put(DataType::kFloat64, a.data(), i, q + i);
    for (int64_t i = 0; i < 7; ++i) Put(DataType::kFloat64, b.data(), i, 2 * q - i);
    TensorView va(a.data(), DataType::kFloat64, {4}), vb(b.data(), DataType::kFloat64, {7});
    auto hs = e.GroupedAllreduce({"ps.ga", "ps.gb"}, {va, vb}, {va, vb}, ReduceOp::kAverage, 1.0,
                                 1.0, s.id);
    const double mean_q = (n - 1) / 2.0;
    if (ck.ExpectOk(WaitDone(hs[0]), tag + "grouped allreduce") && ck.ExpectOk(WaitDone(hs[1]), tag + "grouped allreduce")) {
      ck.ExpectElements(DataType::kFloat64, a.data(), 4, [&](int64_t i) { return mean_q + i; },
                        tag + "grouped allreduce a");
      ck.ExpectElements(DataType::kFloat64, b.data(), 7, [&](int64_t i) { return 2 * mean_q - i; },
                        tag + "grouped allreduce b");
    }
  }
  ck.ExpectOk(WaitDone(e.Barrier(s.id)), tag + "barrier");
}

// One name in flight in the global set and in every set this rank is in, at once: each
// reduces over its own members.
void CheckSameName(hvd::Engine& e, Checker& ck, const std::vector<Set>& sets) {
  std::vector<const Set*> mine;
  for (const auto& s : sets) {
    if (s.place >= 0) mine.push_back(&s);
  }
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<hvd::HandlePtr> hs;
  for (size_t k = 0; k <= mine.size(); ++k) {
    bufs.push_back(std::make_unique<Buffer>(DataType::kFloat64, 3));
    for (int64_t i = 0; i < 3; ++i) Put(DataType::kFloat64, bufs.back()->data(), i, e.rank() + i);
    TensorView v(bufs.back()->data(), DataType::kFloat64, {3});
    hs.push_back(e.Allreduce("ps.same", v, v, ReduceOp::kSum, 1.0, 1.0,
                             k == 0 ? hvd::kGlobalProcessSet : mine[k - 1]->id));
  }
  for (size_t k = 0; k <= mine.size(); ++k) {
    std::vector<int> ranks;
    if (k == 0) {
      for (int r = 0; r < e.size(); ++r) ranks.push_back(r);
    } else {
      ranks = mine[k - 1]->ranks;
    }
    double sum = 0;
    for (int r : ranks) sum += r;
    const std::string what = "name 'ps.same' in set " + std::to_string(k == 0 ? 0 : mine[k - 1]->id);
    if (ck.ExpectOk(WaitDone(hs[k]), what)) {
      ck.ExpectElements(DataType::kFloat64, bufs[k]->data(), 3,
                        [&](int64_t i) { return sum + static_cast<double>(ranks.size()) * i; }, what);
    }
  }
}

// Set a = {0, 1} waits for rank 1, which submits only after a global barrier that ranks 0 and
// 2 reach once set b = {0, 2} has run ten allreduces one after another: each of them finishes
// while a's is still pending (no timing involved).
void CheckIndependence(hvd::Engine& e, Checker& ck) {
  if (e.size() < 3) return;
  Set a = AddSet(e, ck, {0, 1});
  Set b = AddSet(e, ck, {0, 2});
  Buffer buf(DataType::kFloat32, 4);
  TensorView v(buf.data(), DataType::kFloat32, {4});
  hvd::HandlePtr slow;
  if (e.rank() == 0) slow = e.Allreduce("ps.slow", v, v, ReduceOp::kSum, 1.0, 1.0, a.id);
  if (e.rank() == 0 || e.rank() == 2) {
    for (int k = 0; k < 10; ++k) {
      Buffer x(DataType::kFloat32, 2);
      TensorView vx(x.data(), DataType::kFloat32, {2});
      ck.ExpectOk(WaitDone(e.Allreduce("ps.fast." + std::to_string(k), vx, vx, ReduceOp::kSum, 1.0,
                                       1.0, b.id), 10.0),
                  "set b allreduce while set a waits");
    }
    if (e.rank() == 0) ck.Expect(!slow->Finished(), "set a's allreduce still waits for rank 1");
  }
  ck.ExpectOk(WaitDone(e.Barrier(), 60.0), "the barrier after set b");
  if (e.rank() == 1) slow = e.Allreduce("ps.slow", v, v, ReduceOp::kSum, 1.0, 1.0, a.id);
  if (slow) ck.ExpectOk(WaitDone(slow), "set a's allreduce once rank 1 submits");
  RemoveSet(e, ck, a.id, "remove set a");
  RemoveSet(e, ck, b.id, "remove set b");
}

// Whether `path` exists within `seconds` (polled each millisecond).
bool WaitForFile(const std::string& path, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void Touch(const std::string& path) {
  if (FILE* f = std::fopen(path.c_str(), "w")) std::fclose(f);
}

// A token of this job that rank 0 draws and broadcasts (under `name`), for the names of the
// files in /tmp through which a check's ranks signal each other.
std::string JobToken(hvd::Engine& e, Checker& ck, const std::string& name) {
  int64_t token = e.rank() == 0 ? static_cast<int64_t>(getpid()) * 1000003 + std::time(nullptr) : 0;
  TensorView tv(&token, DataType::kInt64, {1});
  ck.ExpectOk(WaitDone(e.Broadcast(name, tv, tv, 0), 30.0), "broadcast of the token");
  return std::to_string(token);
}

// Rank 0 coordinates every set, but a set it is not a member of does not wait for its
// collectives, nor for a framework's code that runs inside one. Rank 0 stays inside an
// allgather of set a = {0, 1} while the output allocator of `holder` holds it until set
// b = {2, 3} is done:
//   - holder 1: rank 1's allocator, on its background thread once the allgather runs; rank 0
//     waits in the data plane for rank 1's part, and answers set b from that wait;
//   - holder 0: rank 0's own allocator; its thread is in the framework's code, and the
//     control keeper (engine/control_keeper.h) answers set b on its behalf.
// Set b starts only once the allocator has been called, and runs ten allreduces one after
// another, each negotiated by rank 0 meanwhile (no timing involved: without that each would
// wait for the allocator's 20 s, and fail after 15). Files in /tmp, named by a token rank 0
// broadcasts, pass the two signals.
void CheckSetsAsideOfACollective(hvd::Engine& e, Checker& ck, int holder) {
  if (e.size() < 4) return;
  const std::string tag = "ps.aside" + std::to_string(holder);
  const std::string token = JobToken(e, ck, tag + ".token");
  const std::string held = "/tmp/hvd-test-aside-held-" + token;
  const std::string done = "/tmp/hvd-test-aside-done-" + token;
  const std::string whose = "rank " + std::to_string(holder) + "'s allocator";
  Set a = AddSet(e, ck, {0, 1});
  Set b = AddSet(e, ck, {2, 3});
  if (e.rank() <= 1) {
    Buffer in(DataType::kFloat32, 3);
    for (int64_t i = 0; i < 3; ++i) Put(DataType::kFloat32, in.data(), i, e.rank() * 10 + i);
    std::vector<float> out;
    bool b_was_done = false;
    hvd::OutputAllocator alloc = [&](const std::vector<int64_t>& shape) -> void* {
      if (e.rank() == holder) {
        Touch(held);
        b_was_done = WaitForFile(done, 20.0);
      }
      out.assign(static_cast<size_t>(shape[0]), -1.0f);
      return out.data();
    };
    hvd::HandlePtr h = e.Allgather(tag + ".held", TensorView(in.data(), DataType::kFloat32, {3}),
                                   alloc, a.id);
    if (ck.ExpectOk(WaitDone(h, 60.0), "set a's allgather (" + whose + " held)")) {
      bool right = out.size() == 6;
      for (size_t i = 0; right && i < 6; ++i) {
        right = out[i] == static_cast<float>((i / 3) * 10 + i % 3);
      }
      ck.Expect(right, "set a's allgather values");
    }
    if (e.rank() == holder) {
      ck.Expect(b_was_done, "set b finished its allreduces while " + whose +
                                " held set a's allgather");
    }
  } else if (e.rank() <= 3) {
    ck.Expect(WaitForFile(held, 30.0), whose + " was called (rank 0 is in the allgather)");
    for (int k = 0; k < 10; ++k) {
      Buffer x(DataType::kInt32, 2);
      for (int64_t i = 0; i < 2; ++i) Put(DataType::kInt32, x.data(), i, e.rank() + k);
      TensorView vx(x.data(), DataType::kInt32, {2});
      const std::string what =
          "set b allreduce " + std::to_string(k) + " while " + whose + " holds set a's allgather";
      if (!ck.ExpectOk(WaitDone(e.Allreduce(tag + "." + std::to_string(k), vx, vx, ReduceOp::kSum,
                                            1.0, 1.0, b.id), 15.0),
                       what)) {
        break;
      }
      ck.ExpectElements(DataType::kInt32, x.data(), 2, [&](int64_t) { return 5 + 2 * k; },
                        "set b allreduce values");
    }
    if (e.rank() == 2) Touch(done);
  }
  ck.ExpectOk(WaitDone(e.Barrier(), 90.0), "the barrier after sets a and b");
  if (e.rank() == 0) {
    std::remove(held.c_str());
    std::remove(done.c_str());
  }
  RemoveSet(e, ck, a.id, "remove set a");
  RemoveSet(e, ck, b.id, "remove set b");
}

// Ids given again at once, twenty times, with no other id free: set a = {0, n-1} runs an
// allreduce and is removed while each of its members has another one in flight that the other
// never submits (rank n-1's request has gone to rank 0 over their link); set b = {0, 1} then
// gets a's id and runs an allreduce under the same name as a's. Every value is checked: b's
// must be b's members' sum, with nothing of a's in it.
void CheckIdsGivenAgain(hvd::Engine& e, Checker& ck) {
  const int n = e.size(), me = e.rank();
  if (n < 3) return;
  for (int k = 0; k < 20; ++k) {
    const std::string round = " (round " + std::to_string(k) + ")";
    Set a = AddSet(e, ck, {0, n - 1});
    Buffer x(DataType::kInt64, 3), orphan(DataType::kInt64, 1);
    TensorView vx(x.data(), DataType::kInt64, {3}), vo(orphan.data(), DataType::kInt64, {1});
    for (int64_t i = 0; i < 3; ++i) Put(DataType::kInt64, x.data(), i, 1000 * (me + 1) + i);
    hvd::HandlePtr left;
    if (a.place >= 0) {
      left = e.Allreduce("ids.orphan." + std::to_string(me), vo, vo, ReduceOp::kSum, 1.0, 1.0,
                         a.id);
      if (ck.ExpectOk(WaitDone(e.Allreduce("ids.same", vx, vx, ReduceOp::kSum, 1.0, 1.0, a.id)),
                      "set a's allreduce" + round)) {
        ck.ExpectElements(DataType::kInt64, x.data(), 3,
                          [&](int64_t i) { return 1000 * (1 + n) + 2 * i; }, "set a's sum" + round);
      }
    }
    RemoveSet(e, ck, a.id, "remove set a" + round);
    if (left) {
      ck.Expect(WaitDone(left).code() == hvd::StatusCode::kFailedPrecondition,
                "set a's unmatched allreduce fails with the removal" + round);
    }
    Set b = AddSet(e, ck, {0, 1});
    ck.Expect(b.id == a.id, "set b gets set a's id" + round);
    if (b.place >= 0) {
      for (int64_t i = 0; i < 3; ++i) Put(DataType::kInt64, x.data(), i, 1000 * (me + 1) + i);
      if (ck.ExpectOk(WaitDone(e.Allreduce("ids.same", vx, vx, ReduceOp::kSum, 1.0, 1.0, b.id)),
                      "set b's allreduce" + round)) {
        ck.ExpectElements(DataType::kInt64, x.data(), 3,
                          [&](int64_t i) { return 1000 * 3 + 2 * i; }, "set b's sum" + round);
      }
    }
    RemoveSet(e, ck, b.id, "remove set b" + round);
  }
}

// A rank's additions and removals run one at a time. On rank 0 a second thread adds set {0}
// and waits: the other ranks add it only once rank 0 has tried a second addition from its main
// thread (a file in /tmp tells them; they go ahead after 10 s without it). Exactly one of rank
// 0's two calls is refused, saying another is in flight (the second, unless the thread had not
// submitted within 200 ms); the other gets the set, with the same id as on the other ranks.
void CheckOneAtATime(hvd::Engine& e, Checker& ck) {
  if (e.size() < 2) return;  // {0} is the world's set there
  const std::string tried = "/tmp/hvd-test-one-at-a-time-" + JobToken(e, ck, "ps.one.token");
  hvd::StatusOr<int32_t> got = hvd::Status::Internal("not run");
  if (e.rank() == 0) {
    hvd::StatusOr<int32_t> other = hvd::Status::Internal("not run");
    std::thread t([&] { other = e.AddProcessSet({0}); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    got = e.AddProcessSet({0});
    Touch(tried);
    t.join();
    const hvd::Status refused = got.ok() ? other.status() : got.status();
    if (!got.ok()) got = other;
    ck.Expect(refused.code() == hvd::StatusCode::kFailedPrecondition &&
                  refused.message().find("in flight") != std::string::npos,
              "of two additions at once, one is refused: got " + refused.ToString());
  } else {
    WaitForFile(tried, 10.0);
    got = e.AddProcessSet({0});
  }
  if (ck.ExpectOk(got.status(), "of two additions at once, one adds the set")) {
    ck.Expect(*got == NextId(), "its id, as Horovod gives it");
    RemoveSet(e, ck, *got, "remove it");
  }
  if (e.rank() == 0) std::remove(tried.c_str());
}

void CheckErrors(hvd::Engine& e, Checker& ck) {
  const int n = e.size(), me = e.rank();
  Buffer buf(DataType::kFloat32, 4);
  TensorView v(buf.data(), DataType::kFloat32, {4});
  auto refused = [&](const hvd::HandlePtr& h, hvd::StatusCode code, const std::string& text,
                     const std::string& what) {
    hvd::Status s = WaitDone(h);
    ck.Expect(h->refused() && s.code() == code && s.message().find(text) != std::string::npos,
              what + ": got " + s.ToString());
  };
  // Ranks that differ across ranks: every rank fails, naming both lists; the next add works.
  if (n > 1) {
    std::vector<int> ranks = {0};
    if (me == n - 1) ranks.push_back(n - 1);
    auto id = e.AddProcessSet(ranks);
    ck.Expect(!id.ok() && id.status().code() == hvd::StatusCode::kInvalidArgument &&
                  id.status().message().find("process set ranks") != std::string::npos,
              "ranks that differ across ranks: got " + id.status().ToString());
  }
  // The set of rank 0 alone; a rank outside it may not use it.
  Set zero = AddSet(e, ck, {0});
  if (me != 0) {
    refused(e.Allreduce("ps.outside", v, v, ReduceOp::kSum, 1.0, 1.0, zero.id),
            hvd::StatusCode::kInvalidArgument, "not a member of process set", "op outside the set");
  } else {
    ck.ExpectOk(WaitDone(e.Allreduce("ps.alone", v, v, ReduceOp::kSum, 1.0, 1.0, zero.id)),
                "allreduce in a set of one");
  }
  // A set with these ranks exists already (the global set too).
  {
    auto id = e.AddProcessSet({0});
    ck.Expect(!id.ok() && id.status().message().find("exists already (id " + std::to_string(zero.id)) != std::string::npos,
              "a set that exists: got " + id.status().ToString());
    std::vector<int> all(n);
    for (int r = 0; r < n; ++r) all[r] = r;
    auto global = e.AddProcessSet(all);
    ck.Expect(!global.ok() && global.status().message().find("exists already (id 0)") != std::string::npos,
              "the global set's ranks: got " + global.status().ToString());
    auto bad = e.AddProcessSet({0, n});
    ck.Expect(!bad.ok() && bad.status().code() == hvd::StatusCode::kInvalidArgument,
              "a rank out of range: got " + bad.status().ToString());
    // The last rank alone passes a rank out of range: every rank's call fails with its reason.
    auto one = e.AddProcessSet(me == n - 1 ? std::vector<int>{0, n} : std::vector<int>{0, n - 1});
    ck.Expect(!one.ok() && one.status().code() == hvd::StatusCode::kInvalidArgument &&
                  one.status().message().find("process set rank " + std::to_string(n) +
                                              " is outside [0, " + std::to_string(n) +
                                              ") (on rank " + std::to_string(n - 1) + ")") !=
                      std::string::npos,
              "a rank out of range on the last rank alone: got " + one.status().ToString());
  }
  // A root outside the set: negotiated with the refusal, it fails on every member together.
  if (n > 1 && me == 0) {
    auto h = e.Broadcast("ps.root", v, v, n - 1, zero.id);
    hvd::Status s = WaitDone(h);
    ck.Expect(!h->refused() && s.code() == hvd::StatusCode::kInvalidArgument &&
                  s.message().find("is not a member of process set") != std::string::npos &&
                  s.message().find("fails on every rank of process set") != std::string::npos,
              "broadcast root outside the set: got " + s.ToString());
  }
  // Removal with an operation in flight: a set of rank 0 and the last rank (not the whole
  // world) where only rank 0 submits.
  if (n > 2) {
    Set pair = AddSet(e, ck, {0, n - 1});
    hvd::HandlePtr h;
    if (me == 0) h = e.Allreduce("ps.orphan", v, v, ReduceOp::kSum, 1.0, 1.0, pair.id);
    RemoveSet(e, ck, pair.id, "remove a set with an operation in flight");
    if (h) {
      hvd::Status s = WaitDone(h);
      ck.Expect(s.code() == hvd::StatusCode::kFailedPrecondition &&
                    s.message().find("was removed while this operation was in flight") != std::string::npos,
                "the operation in flight fails: got " + s.ToString());
    }
    if (pair.place >= 0) {
      refused(e.Allreduce("ps.after", v, v, ReduceOp::kSum, 1.0, 1.0, pair.id),
              hvd::StatusCode::kInvalidArgument, "does not exist", "op on a removed set");
    }
  }
  hvd::Status gone = e.RemoveProcessSet(9999);
  ck.Expect(!gone.ok() && gone.message().find("no process set 9999") != std::string::npos,
            "removing a set that does not exist: got " + gone.ToString());
  ck.Expect(!e.RemoveProcessSet(hvd::kGlobalProcessSet).ok(), "the global set cannot be removed");
  RemoveSet(e, ck, zero.id, "remove the set of rank 0");
  // A removed set's id goes to the next set added (AddSet checks every id against IdAccount):
  // sets have been removed, so this one gets one of their ids, not a new one.
  Set again = AddSet(e, ck, {0});
  ck.Expect(again.id > 0 && again.id < ids_given.next, "a removed set's id is given again: got " +
                                                           std::to_string(again.id));
  RemoveSet(e, ck, again.id, "remove it");
  // The engine goes on: a global allreduce.
  Buffer x(DataType::kInt64, 1);
  Put(DataType::kInt64, x.data(), 0, 1);
  TensorView vx(x.data(), DataType::kInt64, {1});
  if (ck.ExpectOk(WaitDone(e.Allreduce("ps.global", vx, vx, ReduceOp::kSum)), "global allreduce after")) {
    ck.ExpectElements(DataType::kInt64, x.data(), 1, [&](int64_t) { return n; }, "global allreduce after");
  }
}

}  // namespace

int RunProcessSetChecks(hvd::Engine& e, Checker& ck) {
  const int n = e.size();
  ck.Begin("process sets");
  CheckIdsGivenAgain(e, ck);  // first: no id is free before it
  CheckOneAtATime(e, ck);
  std::vector<std::vector<int>> layouts;
  std::vector<int> evens, odds, most;
  for (int r = 0; r < n; ++r) (r % 2 ? odds : evens).push_back(r);
  for (int r = 0; r + 1 < n; ++r) most.push_back(r);
  for (const auto& l : {evens, odds, most, std::vector<int>{n - 1}}) {
    if (!l.empty() && static_cast<int>(l.size()) < n &&
        std::find(layouts.begin(), layouts.end(), l) == layouts.end()) {
      layouts.push_back(l);
    }
  }
  std::vector<Set> sets;
  for (const auto& l : layouts) sets.push_back(AddSet(e, ck, l));
  std::vector<int32_t> ids = e.ProcessSetIds();
  ck.Expect(ids.size() == sets.size() + 1 && ids[0] == hvd::kGlobalProcessSet,
            "ProcessSetIds lists the global set and " + std::to_string(sets.size()) + " more");
  int64_t salt = 0;
  for (const auto& s : sets) {
    if (s.place >= 0 && s.id >= 0) {
      CheckAllreduce(e, ck, s, salt += 100);
      CheckMovement(e, ck, s);
    }
  }
  CheckSameName(e, ck, sets);
  for (const auto& s : sets) RemoveSet(e, ck, s.id, "remove set " + std::to_string(s.id));
  ck.Expect(e.ProcessSetIds() == std::vector<int32_t>{hvd::kGlobalProcessSet}, "only the global set is left");
  CheckIndependence(e, ck);
  CheckSetsAsideOfACollective(e, ck, /*holder=*/1);
  CheckSetsAsideOfACollective(e, ck, /*holder=*/0);
  CheckErrors(e, ck);
  return ck.End();
}

int RunStaticProcessSetChecks(hvd::Engine& e, Checker& ck) {
  ck.Begin("process sets given at start");
  const int n = e.size();
  ck.Expect(e.ProcessSetIds() == std::vector<int32_t>({0, 1}),
            "the set given at start has id 1; the same ranks again and the world's add none");
  std::vector<int> want = {0};
  if (n > 1) want.push_back(n - 1);
  ck.Expect(e.ProcessSetRanks(1) == want, "its ranks");
  if (e.rank() == 0 || e.rank() == n - 1) {
    Buffer x(DataType::kInt32, 2);
    Put(DataType::kInt32, x.data(), 0, e.rank());
    TensorView v(x.data(), DataType::kInt32, {2});
    if (ck.ExpectOk(WaitDone(e.Allreduce("static", v, v, ReduceOp::kSum, 1.0, 1.0, 1)), "allreduce in it")) {
      ck.ExpectElements(DataType::kInt32, x.data(), 1, [&](int64_t) { return n > 1 ? n - 1 : 0; }, "allreduce in it");
    }
  }
  auto id = e.AddProcessSet({0});
  ck.Expect(!id.ok() && id.status().code() == hvd::StatusCode::kFailedPrecondition &&
                id.status().message().find("HVD_DYNAMIC_PROCESS_SETS") != std::string::npos,
            "adding later needs HVD_DYNAMIC_PROCESS_SETS: got " + id.status().ToString());
  ck.Expect(!e.RemoveProcessSet(1).ok(), "removing needs it too");
  // Every rank gets here before any shuts the job down (rank 1 is in no set but the world).
  ck.ExpectOk(WaitDone(e.Barrier(), 60.0), "the last barrier");
  return ck.End();
}

}  // namespace mp
