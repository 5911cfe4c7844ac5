// Random steps of mixed collectives (mp_collectives_worker --random=STEPS[,SEED]): each step is
// a handful of operations drawn from one generator that every rank seeds alike (kind, process
// set, names, dtype, op, shapes, roots, splits, scale factors), which each rank submits in an
// order of its own (some steps from two threads), with pauses of its own between them, before
// it waits for them all. One operation in 25 has one rank give a tensor of the wrong shape: it
// must fail on every member with InvalidArgument, as a whole, leaving the tensors alone. One
// grouped operation in 25 has one rank submit its members alone, one by one: it fails the same
// way, naming the group membership, however late that rank's members come. Now and
// then a process set is removed and added again; halfway, the ranks run out of data one after
// another and join. Names come from a small pool shared by every kind, so the same name is an
// allreduce in one step, a member of a group or an allgather of another dtype in the next (the
// response cache's entries change, groups form and dissolve). Every result is checked against
// values computed here.
//
// A failure names the step, the operation and the seed; the same seed replays the same steps.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "mp_checks.h"

namespace mp {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::TensorView;

namespace {

enum class Kind {
  kAllreduce,
  kGroupedAllreduce,
  kAllgather,
  kGroupedAllgather,
  kBroadcast,
  kAlltoall,
  kReducescatter,
  kGroupedReducescatter,
  kBarrier,
};
constexpr int kKinds = 9;

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllreduce: return "allreduce";
    case Kind::kGroupedAllreduce: return "grouped allreduce";
    case Kind::kAllgather: return "allgather";
    case Kind::kGroupedAllgather: return "grouped allgather";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAlltoall: return "alltoall";
    case Kind::kReducescatter: return "reducescatter";
    case Kind::kGroupedReducescatter: return "grouped reducescatter";
    case Kind::kBarrier: return "barrier";
  }
  return "?";
}

struct Set {
  int32_t id = hvd::kGlobalProcessSet;
  std::vector<int> ranks;  // world ranks, ascending
  int Index(int world_rank) const {
    auto it = std::find(ranks.begin(), ranks.end(), world_rank);
    return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
  }
};

// One tensor of an operation: its name, salt and first dimension's rule, and this rank's
// buffers and handle.
struct Tensor {
  std::string name;
  int64_t salt = 0;
  int64_t rows = 0;  // an allreduce's, reducescatter's or broadcast's (the same on every rank)
  std::unique_ptr<Buffer> in, out;
  hvd::HandlePtr h;
};

struct Op {
  Kind kind;
  const Set* set = nullptr;
  DataType t = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int64_t width = 1;  // the dimensions after the first: {width}, or none when width == 0
  double prescale = 1.0, postscale = 1.0;
  int root = 0;  // broadcast: a world rank of the set
  bool in_place = false;
  // The set index of the rank that gets the first tensor's shape wrong (its dimensions after
  // the first: one more column), or -1: every member's operation then fails with
  // InvalidArgument, the group's other members too, and leaves the tensors alone.
  int bad = -1;
  // A grouped operation's set index of the rank that submits its members alone, one by one,
  // or -1: every member's operation then fails with InvalidArgument naming the group
  // membership, on every member rank, and leaves the tensors alone.
  int lone = -1;
  bool Fails() const { return bad >= 0 || lone >= 0; }
  std::vector<Tensor> tensors;
  std::string Describe(int64_t step, uint64_t seed) const {
    std::string s = std::string(KindName(kind)) + " of";
    for (const auto& x : tensors) s += " '" + x.name + "'";
    return s + " (step " + std::to_string(step) + ", seed " + std::to_string(seed) + ", set " +
           std::to_string(set->id) + ", " + Str(t) + ", " + Str(op) + ", width " +
           std::to_string(width) + ", prescale " + std::to_string(prescale) + ", postscale " +
           std::to_string(postscale) + ")";
  }
  std::vector<int64_t> Shape(int64_t rows) const {
    std::vector<int64_t> s = {rows};
    if (width > 0) s.push_back(width);
    return s;
  }
  int64_t Row() const { return std::max<int64_t>(width, 1); }
};

// Rows a set's rank `q` gives to an allgather, or sends to set rank `to` in an alltoall.
int64_t GatherRows(int q, int64_t salt) { return (q * 2 + salt) % 3; }
int64_t SplitRows(int from, int to, int64_t salt) { return (from + 2 * to + salt) % 3; }

bool ScalesExactly(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat32 ||
         t == DataType::kFloat64;
}

class Random {
 public:
  explicit Random(uint64_t seed) : g_(seed) {}
  int64_t Below(int64_t n) { return static_cast<int64_t>(g_() % static_cast<uint64_t>(n)); }
  bool Chance(int percent) { return Below(100) < percent; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(Below(static_cast<int64_t>(v.size())))];
  }

 private:
  std::mt19937_64 g_;
};

// The first dimension of an allreduce or reducescatter tensor: mostly small, sometimes none or
// one row, now and then large (past a shared-memory chunk, the fusion threshold's buffers).
int64_t RandomRows(Random& g, int n) {
  const int64_t pick = g.Below(20);
  if (pick == 0) return 0;
  if (pick == 1) return 1;
  if (pick == 2) return 70001;
  if (pick == 3) return 2 * n + 1;
  return 1 + g.Below(40);
}

// Draws one operation on `set` (shared generator: every rank draws the same), its tensors
// named from the pool, none twice in the step within a set.
Op Draw(Random& g, const Set& set, int64_t step, std::set<std::string>* used, int64_t* salt) {
  Op o;
  o.kind = static_cast<Kind>(g.Below(kKinds));
  o.set = &set;
  const int n = static_cast<int>(set.ranks.size());
  const std::vector<DataType> types = AllDataTypes();
  o.t = g.Pick(types);
  std::vector<ReduceOp> ops = AllReduceOps();
  if (o.t == DataType::kBool) {
    ops.erase(std::remove(ops.begin(), ops.end(), ReduceOp::kAverage), ops.end());
  }
  o.op = g.Pick(ops);
  o.width = g.Below(3);  // 0: a 1-d tensor
  o.in_place = g.Chance(50);
  // (A set of one rank has nothing to compare a shape with.)
  if (o.kind != Kind::kBarrier && n > 1 && g.Chance(4)) o.bad = static_cast<int>(g.Below(n));
  o.root = set.ranks[static_cast<size_t>(g.Below(n))];
  const bool reduces = o.kind == Kind::kAllreduce || o.kind == Kind::kGroupedAllreduce ||
                       o.kind == Kind::kReducescatter || o.kind == Kind::kGroupedReducescatter;
  // (Not with average: its division by the set's size and the postscale are one factor there.)
  if (reduces && ScalesExactly(o.t) && o.op == ReduceOp::kSum && g.Chance(30)) {
    o.prescale = g.Pick(std::vector<double>{0.5, 1.0, 2.0});
    o.postscale = g.Pick(std::vector<double>{0.25, 1.0, 4.0});
  }
  int members = 1;
  if (o.kind == Kind::kGroupedAllreduce || o.kind == Kind::kGroupedAllgather ||
      o.kind == Kind::kGroupedReducescatter) {
    members = 2 + static_cast<int>(g.Below(3));
  }
  if (o.kind == Kind::kBarrier) members = 0;
  if (members > 1 && o.bad < 0 && n > 1 && g.Chance(4)) o.lone = static_cast<int>(g.Below(n));
  for (int m = 0; m < members; ++m) {
    Tensor x;
    x.name = "t" + std::to_string(g.Below(8));
    if (!used->insert(std::to_string(set.id) + "/" + x.name).second) {
      x.name = "s" + std::to_string(step) + "." + std::to_string(used->size());  // a new name
      used->insert(std::to_string(set.id) + "/" + x.name);
    }
    x.salt = ++*salt;
    x.rows = RandomRows(g, n);
    o.tensors.push_back(std::move(x));
  }
  return o;
}

// This rank's inputs (q: its index in the set) and the operation's submission.
void Submit(hvd::Engine& e, Op& o, int q) {
  const int n = static_cast<int>(o.set->ranks.size());
  const int32_t ps = o.set->id;
  std::vector<std::string> names;
  std::vector<TensorView> ins, outs;
  for (Tensor& x : o.tensors) {
    // The rank that gets it wrong gives its first tensor a column more.
    const bool wrong = q == o.bad && &x == &o.tensors[0];
    const int64_t row = wrong ? o.Row() + 1 : o.Row();
    auto shape = [&](int64_t rows) {
      return wrong ? std::vector<int64_t>{rows, row} : o.Shape(rows);
    };
    switch (o.kind) {
      case Kind::kAllreduce:
      case Kind::kGroupedAllreduce:
      case Kind::kReducescatter:
      case Kind::kGroupedReducescatter: {
        const int64_t count = x.rows * row;
        x.in = std::make_unique<Buffer>(o.t, count);
        for (int64_t i = 0; i < count; ++i) {
          Put(o.t, x.in->data(), i, ReduceInput(o.t, o.op, q, n, i, x.salt));
        }
        if (!o.in_place) x.out = std::make_unique<Buffer>(o.t, count);
        const TensorView in(x.in->data(), o.t, shape(x.rows));
        names.push_back(x.name);
        ins.push_back(in);
        outs.push_back(o.in_place ? in : TensorView(x.out->data(), o.t, shape(x.rows)));
        break;
      }
      case Kind::kAllgather:
      case Kind::kGroupedAllgather: {
        const int64_t rows = GatherRows(q, x.salt), count = rows * row;
        x.in = std::make_unique<Buffer>(o.t, count);
        for (int64_t i = 0; i < count; ++i) Put(o.t, x.in->data(), i, Pattern(o.t, q, i, x.salt));
        names.push_back(x.name);
        ins.emplace_back(x.in->data(), o.t, shape(rows));
        break;
      }
      case Kind::kBroadcast: {
        const int64_t count = x.rows * row;
        x.in = std::make_unique<Buffer>(o.t, count);
        const bool root = e.rank() == o.root;
        for (int64_t i = 0; i < count; ++i) {
          Put(o.t, x.in->data(), i, root ? Pattern(o.t, q, i, x.salt) : 99);
        }
        if (!o.in_place) {
          x.out = std::make_unique<Buffer>(o.t, count);
          for (int64_t i = 0; i < count; ++i) Put(o.t, x.out->data(), i, 98);
        }
        const TensorView in(x.in->data(), o.t, shape(x.rows));
        x.h =
            e.Broadcast(x.name, in, o.in_place ? in : TensorView(x.out->data(), o.t, shape(x.rows)),
                        o.root, ps);
        break;
      }
      case Kind::kAlltoall: {
        std::vector<int64_t> splits(n);
        for (int j = 0; j < n; ++j) splits[j] = SplitRows(q, j, x.salt);
        const int64_t rows = std::accumulate(splits.begin(), splits.end(), int64_t{0});
        x.in = std::make_unique<Buffer>(o.t, rows * row);
        int64_t at = 0;
        for (int j = 0; j < n; ++j) {
          for (int64_t k = 0; k < splits[j] * row; ++k) {
            Put(o.t, x.in->data(), at++, Pattern(o.t, q * 7 + j, k, x.salt));
          }
        }
        x.h = e.Alltoall(x.name, TensorView(x.in->data(), o.t, shape(rows)), splits, nullptr, ps);
        break;
      }
      case Kind::kBarrier: break;
    }
  }
  std::vector<hvd::HandlePtr> hs;
  if (q == o.lone) {
    // Each member alone, with pauses between them that differ by the member (0-300 µs): some
    // come after the others' group has failed.
    for (size_t i = 0; i < names.size(); ++i) {
      const int64_t pause_us = o.tensors[i].salt % 4 * 100;
      if (i > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      if (o.kind == Kind::kGroupedAllreduce) {
        hs.push_back(e.Allreduce(names[i], ins[i], outs[i], o.op, o.prescale, o.postscale, ps));
      } else if (o.kind == Kind::kGroupedReducescatter) {
        hs.push_back(e.Reducescatter(names[i], ins[i], o.op, o.prescale, o.postscale, nullptr, ps));
      } else {
        hs.push_back(e.Allgather(names[i], ins[i], nullptr, ps));
      }
    }
  } else {
    switch (o.kind) {
      case Kind::kAllreduce:
        hs.push_back(e.Allreduce(names[0], ins[0], outs[0], o.op, o.prescale, o.postscale, ps));
        break;
      case Kind::kGroupedAllreduce:
        hs = e.GroupedAllreduce(names, ins, outs, o.op, o.prescale, o.postscale, ps);
        break;
      case Kind::kReducescatter:
        hs.push_back(e.Reducescatter(names[0], ins[0], o.op, o.prescale, o.postscale, nullptr, ps));
        break;
      case Kind::kGroupedReducescatter:
        hs = e.GroupedReducescatter(names, ins, o.op, o.prescale, o.postscale, ps);
        break;
      case Kind::kAllgather: hs.push_back(e.Allgather(names[0], ins[0], nullptr, ps)); break;
      case Kind::kGroupedAllgather: hs = e.GroupedAllgather(names, ins, ps); break;
      case Kind::kBarrier:
        o.tensors.emplace_back();
        o.tensors.back().h = e.Barrier(ps);
        return;
      default: break;  // submitted above
    }
  }
  for (size_t i = 0; i < hs.size() && i < o.tensors.size(); ++i) o.tensors[i].h = hs[i];
}

// A reduction's expected element i for the set's size n, with the scale factors applied as the
// library does for floating types (exact: powers of two on small integers).
double Expected(const Op& o, int n, int64_t i, int64_t salt) {
  double v = ExpectedReduce(o.t, o.op, n, i, salt);
  if (o.prescale != 1.0 || o.postscale != 1.0) v *= o.prescale * o.postscale;
  return v;
}

void Verify(Checker& ck, const Op& o, int q, const std::string& what) {
  const int n = static_cast<int>(o.set->ranks.size());
  const int64_t row = o.Row();
  const size_t es = hvd::DataTypeSize(o.t);
  for (const Tensor& x : o.tensors) {
    const std::string w = what + " '" + x.name + "'";
    if (o.Fails()) {
      const hvd::Status s = WaitDone(x.h, 120.0);
      if (o.bad >= 0) {  // rank o.set->ranks[o.bad] gave the first tensor a column more
        const std::string who = "rank " + std::to_string(o.set->ranks[static_cast<size_t>(o.bad)]);
        ck.Expect(s.code() == hvd::StatusCode::kInvalidArgument &&
                      s.message().find(o.tensors[0].name) != std::string::npos,
                  w + ", with the first tensor's shape wrong on " + who +
                      ": fails with InvalidArgument naming '" + o.tensors[0].name +
                      "': " + s.ToString());
      } else {
        const std::string who = "rank " + std::to_string(o.set->ranks[static_cast<size_t>(o.lone)]);
        ck.Expect(s.code() == hvd::StatusCode::kInvalidArgument &&
                      s.message().find("group membership") != std::string::npos,
                  w + ", with its members submitted alone on " + who +
                      ": fails with InvalidArgument naming the group membership: " + s.ToString());
      }
      const bool wrong = q == o.bad && &x == &o.tensors[0];
      if (o.in_place && !wrong && x.rows > 0 && o.kind != Kind::kAllgather &&
          o.kind != Kind::kGroupedAllgather && o.kind != Kind::kAlltoall) {
        const bool root =
            o.kind == Kind::kBroadcast && o.set->ranks[static_cast<size_t>(q)] == o.root;
        ck.ExpectElements(
            o.t, x.in->data(), x.rows * row,
            [&](int64_t i) {
              if (o.kind != Kind::kBroadcast) return ReduceInput(o.t, o.op, q, n, i, x.salt);
              // (99 as the dtype holds it: a bool stores true)
              return root ? Pattern(o.t, q, i, x.salt) : o.t == DataType::kBool ? 1.0 : 99.0;
            },
            w + ": a failed operation leaves its tensor alone");
      }
      continue;
    }
    if (!ck.ExpectOk(WaitDone(x.h, 120.0), w)) continue;
    // An output the engine made: `rows` rows of the operation's shape.
    auto output_is = [&](int64_t rows) {
      return ck.Expect(x.h->output_shape() == o.Shape(rows),
                       w + ": output shape " + ShapeStr(x.h->output_shape()) + ", expected " +
                           ShapeStr(o.Shape(rows))) &&
             ck.Expect(x.h->output_bytes().size() >= static_cast<size_t>(rows * row) * es,
                       w + ": output bytes");
    };
    switch (o.kind) {
      case Kind::kAllreduce:
      case Kind::kGroupedAllreduce: {
        const void* got = o.in_place ? x.in->data() : x.out->data();
        ck.ExpectElements(
            o.t, got, x.rows * row, [&](int64_t i) { return Expected(o, n, i, x.salt); }, w);
        break;
      }
      case Kind::kReducescatter:
      case Kind::kGroupedReducescatter: {
        const RowShare share = ReducescatterShare(x.rows, n, q);
        const int64_t first = share.first, part = share.count;
        if (!output_is(part)) break;
        ck.ExpectElements(
            o.t, x.h->output_bytes().data(), part * row,
            [&](int64_t i) { return Expected(o, n, first * row + i, x.salt); }, w);
        break;
      }
      case Kind::kAllgather:
      case Kind::kGroupedAllgather: {
        std::vector<std::pair<int, int64_t>> origin;  // output row -> (set rank, its row)
        for (int p = 0; p < n; ++p) {
          for (int64_t k = 0; k < GatherRows(p, x.salt); ++k) origin.emplace_back(p, k);
        }
        const auto total = static_cast<int64_t>(origin.size());
        if (!output_is(total)) break;
        ck.ExpectElements(
            o.t, x.h->output_bytes().data(), total * row,
            [&](int64_t i) {
              auto [p, k] = origin[static_cast<size_t>(i / row)];
              return Pattern(o.t, p, k * row + i % row, x.salt);
            },
            w);
        break;
      }
      case Kind::kBroadcast: {
        const int root = o.set->Index(o.root);
        ck.ExpectElements(
            o.t, o.in_place ? x.in->data() : x.out->data(), x.rows * row,
            [&](int64_t i) { return Pattern(o.t, root, i, x.salt); }, w);
        break;
      }
      case Kind::kAlltoall: {
        std::vector<int64_t> recv(n);
        for (int j = 0; j < n; ++j) recv[j] = SplitRows(j, q, x.salt);
        const int64_t rows = std::accumulate(recv.begin(), recv.end(), int64_t{0});
        if (!ck.Expect(x.h->received_splits() == recv, w + ": received splits " +
                                                           ShapeStr(x.h->received_splits()) +
                                                           ", expected " + ShapeStr(recv)) ||
            !output_is(rows)) {
          break;
        }
        std::vector<std::pair<int, int64_t>> origin;  // output element -> (source, its index)
        for (int j = 0; j < n; ++j) {
          for (int64_t k = 0; k < recv[j] * row; ++k) origin.emplace_back(j, k);
        }
        ck.ExpectElements(
            o.t, x.h->output_bytes().data(), rows * row,
            [&](int64_t i) {
              auto [j, k] = origin[static_cast<size_t>(i)];
              return Pattern(o.t, j * 7 + q, k, x.salt);
            },
            w);
        break;
      }
      case Kind::kBarrier: break;
    }
  }
}

// An operation still in flight past its wait would write into buffers about to be freed: the
// job ends here, failed (hvdrun stops the other ranks).
void EndIfInFlight(const hvd::HandlePtr& h, const std::string& what, int rank) {
  if (!h || h->Finished()) return;
  std::printf("FAIL [random steps] %s: still in flight after its wait (rank %d)\n", what.c_str(),
              rank);
  std::fflush(stdout);
  std::_Exit(1);
}

// Ranks run out of data one after another: rank q takes part in extra[q] more steps of
// allreduces (sums of float32 on the world, under the same names each step, so cached) and then
// joins; the others' sums count zeros for it. Every rank draws every step, run or not.
void JoinPhase(hvd::Engine& e, Checker& ck, Random& shared, Random& own, int64_t* salt,
               const std::string& where) {
  const int r = e.rank(), n = e.size();
  const DataType t = DataType::kFloat32;
  std::vector<int64_t> extra(n);
  for (auto& x : extra) x = shared.Below(4);
  const int64_t most = *std::max_element(extra.begin(), extra.end());
  struct Step {
    std::vector<int64_t> rows, salts;
  };
  std::vector<Step> steps(static_cast<size_t>(most));
  for (Step& st : steps) {
    const int64_t tensors = 1 + shared.Below(3);
    for (int64_t m = 0; m < tensors; ++m) {
      st.rows.push_back(RandomRows(shared, n));
      st.salts.push_back(++*salt);
    }
  }
  for (int64_t k = 0; k < extra[r]; ++k) {
    const Step& st = steps[static_cast<size_t>(k)];
    std::vector<Buffer> bufs;
    std::vector<hvd::HandlePtr> hs(st.rows.size());
    for (size_t m = 0; m < st.rows.size(); ++m) {
      bufs.emplace_back(t, st.rows[m]);
      for (int64_t i = 0; i < st.rows[m]; ++i) {
        Put(t, bufs[m].data(), i, ReduceInput(t, ReduceOp::kSum, r, n, i, st.salts[m]));
      }
    }
    std::vector<size_t> order(st.rows.size());
    std::iota(order.begin(), order.end(), size_t{0});
    if (order.size() > 1 && own.Chance(50)) std::reverse(order.begin(), order.end());
    for (size_t m : order) {
      const TensorView v(bufs[m].data(), t, {st.rows[m]});
      hs[m] = e.Allreduce("j" + std::to_string(m), v, v, ReduceOp::kSum);
    }
    for (size_t m = 0; m < hs.size(); ++m) {
      const std::string what = where + ": allreduce 'j" + std::to_string(m) + "' of join step " +
                               std::to_string(k) +
                               " (ranks' steps before they join: " + ShapeStr(extra) + ")";
      if (!ck.ExpectOk(WaitDone(hs[m], 120.0), what)) continue;
      ck.ExpectElements(
          t, bufs[m].data(), st.rows[m],
          [&](int64_t i) {
            double sum = 0;
            for (int q = 0; q < n; ++q) {
              if (extra[q] > k) sum += ReduceInput(t, ReduceOp::kSum, q, n, i, st.salts[m]);
            }
            return sum;
          },
          what);
    }
    for (const auto& h : hs) EndIfInFlight(h, where + ": join step " + std::to_string(k), r);
  }
  auto h = e.Join();
  if (ck.ExpectOk(WaitDone(h, 120.0), where + ": join")) {
    const int last = h->join_last_rank();
    ck.Expect(last >= 0 && last < n && extra[last] == most,
              where + ": the last rank to join is " + std::to_string(last) +
                  ", one of those with the most steps (" + ShapeStr(extra) + ")");
  }
}

}  // namespace

int RunRandomSteps(hvd::Engine& e, Checker& ck, int64_t steps, uint64_t seed) {
  const int r = e.rank(), n = e.size();
  ck.Begin("random steps");
  // The sets: the world, and where the job allows it, the even ranks, every rank but the
  // first, and the last rank alone (distinct sets from three ranks on).
  std::vector<Set> sets(1);
  for (int q = 0; q < n; ++q) sets[0].ranks.push_back(q);
  if (n >= 3 && e.options().dynamic_process_sets) {
    std::vector<std::vector<int>> lists(3);
    for (int q = 0; q < n; ++q) {
      if (q % 2 == 0) lists[0].push_back(q);
      if (q > 0) lists[1].push_back(q);
    }
    lists[2].push_back(n - 1);
    for (auto& l : lists) {
      auto id = e.AddProcessSet(l);
      if (!ck.Expect(id.ok(), "adding the set " +
                                  ShapeStr(std::vector<int64_t>(l.begin(), l.end())) + ": " +
                                  id.status().ToString())) {
        return ck.End();
      }
      Set s;
      s.id = *id;
      s.ranks = l;
      sets.push_back(std::move(s));
    }
  }
  Random shared(seed);
  Random own(seed * 1000003u + static_cast<uint64_t>(r) + 1);
  int64_t salt = 0;
  const auto t0 = Clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    if (step == steps / 2) {  // the ranks join halfway; the steps after work as before
      JoinPhase(
          e, ck, shared, own, &salt,
          "join phase (step " + std::to_string(step) + ", seed " + std::to_string(seed) + ")");
    }
    std::vector<Op> ops;
    std::set<std::string> used;
    const int64_t count = 1 + shared.Below(10);
    for (int64_t k = 0; k < count; ++k) {
      ops.push_back(Draw(shared, shared.Pick(sets), step, &used, &salt));
    }
    // This rank's order, and its pauses (up to 300 µs before a third of its operations).
    std::vector<size_t> order(ops.size());
    std::iota(order.begin(), order.end(), size_t{0});
    for (size_t i = order.size(); i > 1; --i) {
      std::swap(order[i - 1], order[static_cast<size_t>(own.Below(static_cast<int64_t>(i)))]);
    }
    // A step in three of ten is submitted by two threads, each its share in this order.
    const int threads = own.Chance(30) ? 2 : 1;
    auto submit = [&](int k, uint64_t pause_seed) {
      Random pauses(pause_seed);
      for (size_t at = static_cast<size_t>(k); at < order.size(); at += threads) {
        const size_t i = order[at];
        const int q = ops[i].set->Index(r);
        if (q < 0) continue;  // not a member: the set's members run it
        if (pauses.Chance(33)) {
          std::this_thread::sleep_for(std::chrono::microseconds(pauses.Below(300)));
        }
        Submit(e, ops[i], q);
      }
    };
    if (threads == 1) {
      submit(0, static_cast<uint64_t>(own.Below(1 << 30)));
    } else {
      std::thread other(submit, 1, static_cast<uint64_t>(own.Below(1 << 30)));
      submit(0, static_cast<uint64_t>(own.Below(1 << 30)));
      other.join();
    }
    for (size_t i : order) {
      const int q = ops[i].set->Index(r);
      if (q >= 0) Verify(ck, ops[i], q, ops[i].Describe(step, seed));
    }
    // A failure does not end the loop: every rank goes through the same steps, as the others
    // wait for it in each.
    for (const Op& o : ops) {
      for (const Tensor& x : o.tensors) EndIfInFlight(x.h, o.Describe(step, seed), r);
    }
    // Now and then (every rank alike) a set is removed and added again: its id may change, and
    // its names start from nothing.
    if (sets.size() > 1 && shared.Chance(3)) {
      Set& s = sets[static_cast<size_t>(1 + shared.Below(static_cast<int64_t>(sets.size()) - 1))];
      const std::string what = "set " + std::to_string(s.id) + " removed and added again";
      ck.ExpectOk(e.RemoveProcessSet(s.id), what);
      auto id = e.AddProcessSet(s.ranks);
      if (ck.Expect(id.ok(), what + ": " + id.status().ToString())) s.id = *id;
    }
  }
  // Every rank has its last step's answers before any shuts down: a rank that submits a group's
  // members alone is answered as each comes, after the others have theirs.
  ck.ExpectOk(WaitDone(e.Barrier(), 120.0), "the barrier after the last step");
  for (size_t s = 1; s < sets.size(); ++s) {
    ck.ExpectOk(e.RemoveProcessSet(sets[s].id), "removing set " + std::to_string(sets[s].id));
  }
  std::printf("[mp] rank %d: %lld random steps (seed %llu) in %.1f s\n", r,
              static_cast<long long>(steps), static_cast<unsigned long long>(seed),
              SecondsSince(t0));
  return ck.End();
}

}  // namespace mp
