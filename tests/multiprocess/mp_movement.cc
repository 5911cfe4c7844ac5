// Data-movement checks: allgather (first dims differ, zero rows, multi-dim, scalar, allocator,
// grouped), broadcast from every root, alltoall (uneven, zero and equal splits) and
// reducescatter (rows not divisible by the world size).
#include <memory>
#include <numeric>

#include "mp_checks.h"

namespace mp {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::TensorView;

namespace {

int64_t Product(const std::vector<int64_t>& v, size_t from) {
  int64_t p = 1;
  for (size_t k = from; k < v.size(); ++k) p *= v[k];
  return p;
}

// ---------------------------------------------------------------- allgather

// Rows that rank r contributes to allgather case `salt`: 0, 1 or 2, so some rank has none
// (salt 3 gives every rank zero rows).
int64_t GatherRows(int r, int64_t salt) { return salt == 3 ? 0 : (r * 2 + salt) % 3; }

struct Gather {
  DataType t;
  std::vector<int64_t> inner;  // the dimensions after the first
  int64_t salt;
  std::string name;
  std::unique_ptr<Buffer> in;
  std::vector<uint8_t> alloc;  // used when `use_allocator`
  bool use_allocator = false;
  hvd::HandlePtr h;
};

void SubmitGather(hvd::Engine& e, Gather& g) {
  const int r = e.rank();
  const int64_t row = Product(g.inner, 0), rows = GatherRows(r, g.salt);
  g.in = std::make_unique<Buffer>(g.t, rows * row);
  for (int64_t i = 0; i < rows * row; ++i) Put(g.t, g.in->data(), i, Pattern(g.t, r, i, g.salt));
  std::vector<int64_t> shape = {rows};
  shape.insert(shape.end(), g.inner.begin(), g.inner.end());
  TensorView v(g.in->data(), g.t, shape);
  hvd::OutputAllocator alloc;
  if (g.use_allocator) {
    alloc = [&g](const std::vector<int64_t>& s) -> void* {
      g.alloc.assign(static_cast<size_t>(Product(s, 0)) * hvd::DataTypeSize(g.t) + 1, 0xEE);
      return g.alloc.data();
    };
  }
  g.h = e.Allgather(g.name, v, alloc);
}

void VerifyGather(Checker& ck, Gather& g) {
  const int n = ck.size();
  const int64_t row = Product(g.inner, 0);
  std::string what = g.name + " dtype=" + Str(g.t) + " inner=" + ShapeStr(g.inner);
  if (!ck.ExpectOk(WaitDone(g.h), what)) return;
  int64_t total = 0;
  std::vector<std::pair<int, int64_t>> origin;  // output row -> (rank, row within that rank)
  for (int q = 0; q < n; ++q) {
    for (int64_t k = 0; k < GatherRows(q, g.salt); ++k) origin.emplace_back(q, k);
    total += GatherRows(q, g.salt);
  }
  std::vector<int64_t> want_shape = {total};
  want_shape.insert(want_shape.end(), g.inner.begin(), g.inner.end());
  ck.Expect(g.h->output_shape() == want_shape,
            what + ": output shape " + ShapeStr(g.h->output_shape()) + ", expected " +
                ShapeStr(want_shape));
  const void* out = g.use_allocator ? static_cast<const void*>(g.alloc.data())
                                    : static_cast<const void*>(g.h->output_bytes().data());
  if (!g.use_allocator) {
    ck.Expect(g.h->output_bytes().size() == static_cast<size_t>(total * row) * hvd::DataTypeSize(g.t),
              what + ": output byte count");
    if (g.h->output_bytes().size() < static_cast<size_t>(total * row) * hvd::DataTypeSize(g.t)) return;
  } else if (total * row > 0) {
    ck.Expect(g.h->output_data() == g.alloc.data(), what + ": output_data() is the allocator's");
  }
  ck.ExpectElements(g.t, out, total * row,
                    [&](int64_t i) {
                      auto [q, k] = origin[static_cast<size_t>(i / row)];
                      return Pattern(g.t, q, k * row + i % row, g.salt);
                    },
                    what);
}

void CheckAllgather(hvd::Engine& e, Checker& ck) {
  std::vector<Gather> gs;
  for (DataType t : AllDataTypes()) {
    for (const std::vector<int64_t>& inner : {std::vector<int64_t>{}, std::vector<int64_t>{3},
                                              std::vector<int64_t>{2, 3}}) {
      for (int64_t s : {0, 1, 2, 3}) {
        Gather g{t, inner, s};
        g.name = "ag." + Str(t) + "." + ShapeStr(inner) + "." + std::to_string(s);
        g.use_allocator = (s == 1 && t == DataType::kFloat64);
        gs.push_back(std::move(g));
      }
    }
  }
  // A large gather: rows of 1024 float32.
  Gather big{DataType::kFloat32, {1024}, 2};
  big.name = "ag.large";
  gs.push_back(std::move(big));
  // Rows of 256 KiB: past the automatic choice of the hierarchical allgather.
  Gather huge{DataType::kFloat32, {65536}, 1};
  huge.name = "ag.huge";
  gs.push_back(std::move(huge));
  for (auto& g : gs) SubmitGather(e, g);
  for (auto& g : gs) VerifyGather(ck, g);

  // A scalar is gathered as one row per rank.
  const int r = e.rank(), n = e.size();
  int32_t scalar = 10 + r;
  auto h = e.Allgather("ag.scalar", TensorView(&scalar, DataType::kInt32, {}));
  if (ck.ExpectOk(WaitDone(h), "ag.scalar dtype=int32")) {
    ck.Expect(h->output_shape() == std::vector<int64_t>{n}, "ag.scalar output shape [size]");
    if (h->output_bytes().size() == 4u * n) {
      ck.ExpectElements(DataType::kInt32, h->output_bytes().data(), n,
                        [](int64_t i) { return 10.0 + i; }, "ag.scalar values");
    }
  }

  // Grouped allgather: three tensors of different dtypes.
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<TensorView> views;
  std::vector<std::string> names;
  const std::vector<DataType> types = {DataType::kInt8, DataType::kFloat16, DataType::kInt64};
  for (size_t k = 0; k < types.size(); ++k) {
    const int64_t rows = GatherRows(r, k);
    bufs.push_back(std::make_unique<Buffer>(types[k], rows * 2));
    for (int64_t i = 0; i < rows * 2; ++i) Put(types[k], bufs[k]->data(), i, Pattern(types[k], r, i, k));
    views.emplace_back(bufs[k]->data(), types[k], std::vector<int64_t>{rows, 2});
    names.push_back("ag.group." + std::to_string(k));
  }
  auto hs = e.GroupedAllgather(names, views);
  ck.Expect(hs.size() == types.size(), "grouped allgather returns one handle per tensor");
  for (size_t k = 0; k < hs.size() && k < types.size(); ++k) {
    std::string what = names[k] + " dtype=" + Str(types[k]);
    if (!ck.ExpectOk(WaitDone(hs[k]), what)) continue;
    std::vector<std::pair<int, int64_t>> origin;
    for (int q = 0; q < n; ++q) {
      for (int64_t j = 0; j < GatherRows(q, k); ++j) origin.emplace_back(q, j);
    }
    const int64_t total = static_cast<int64_t>(origin.size());
    ck.Expect(hs[k]->output_shape() == std::vector<int64_t>{total, 2}, what + ": output shape");
    if (hs[k]->output_bytes().size() < static_cast<size_t>(total * 2) * hvd::DataTypeSize(types[k])) {
      ck.Expect(false, what + ": output too short");
      continue;
    }
    ck.ExpectElements(types[k], hs[k]->output_bytes().data(), total * 2,
                      [&](int64_t i) {
                        auto [q, j] = origin[static_cast<size_t>(i / 2)];
                        return Pattern(types[k], q, j * 2 + i % 2, k);
                      },
                      what);
  }
}

// ---------------------------------------------------------------- broadcast

void CheckBroadcast(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  for (int root = 0; root < n; ++root) {
    struct Bc {
      DataType t;
      int64_t count;
      bool in_place;
      std::unique_ptr<Buffer> in, out;
      hvd::HandlePtr h;
      std::string name;
    };
    std::vector<Bc> cases;
    for (DataType t : AllDataTypes()) {
      std::vector<int64_t> counts = {0, 1, 33, 1001};
      if (t == DataType::kFloat32) counts.push_back((int64_t{1} << 20) + 7);
      for (int64_t count : counts) {
        for (bool in_place : {true, false}) {
          Bc c{t, count, in_place};
          c.name = "bc." + std::to_string(root) + "." + Str(t) + "." + std::to_string(count) +
                   (in_place ? ".inplace" : ".outofplace");
          cases.push_back(std::move(c));
        }
      }
    }
    for (auto& c : cases) {
      c.in = std::make_unique<Buffer>(c.t, c.count);
      c.out = std::make_unique<Buffer>(c.t, c.count);
      for (int64_t i = 0; i < c.count; ++i) {
        // Non-roots hold something else, so a broadcast that did nothing is caught.
        Put(c.t, c.in->data(), i, r == root ? Pattern(c.t, root, i, 7) : Pattern(c.t, root + 1, i + 1, 8));
      }
      TensorView in(c.in->data(), c.t, {c.count});
      TensorView out(c.in_place ? c.in->data() : c.out->data(), c.t, {c.count});
      c.h = e.Broadcast(c.name, in, out, root);
    }
    for (auto& c : cases) {
      std::string what = c.name + " dtype=" + Str(c.t) + " count=" + std::to_string(c.count) +
                         " root=" + std::to_string(root);
      if (!ck.ExpectOk(WaitDone(c.h), what)) continue;
      ck.ExpectElements(c.t, c.in_place ? c.in->data() : c.out->data(), c.count,
                        [&](int64_t i) { return Pattern(c.t, root, i, 7); }, what);
    }
  }
  // A root outside the world is refused up front.
  float x = 0;
  hvd::Status s = WaitDone(e.Broadcast("bc.badroot", TensorView(&x, DataType::kFloat32, {1}),
                                       TensorView(&x, DataType::kFloat32, {1}), n));
  ck.Expect(s.code() == hvd::StatusCode::kInvalidArgument, "broadcast root == size is refused: " + s.ToString());
}

// ---------------------------------------------------------------- alltoall

// Rows rank `from` sends to rank `to` in alltoall case `salt` (salt 0: uneven incl. zero;
// 1: all zero; 2: equal parts passed as empty splits; 3: large).
int64_t Split(int from, int to, int64_t salt) {
  switch (salt) {
    case 0: return (from + 2 * to) % 3;
    case 1: return 0;
    case 2: return 2;
    default: return 1 << 14;
  }
}

void CheckAlltoall(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  const int64_t width = 2;
  for (DataType t : AllDataTypes()) {
    for (int64_t salt : {0, 1, 2, 3}) {
      if (salt == 3 && t != DataType::kFloat32) continue;
      std::vector<int64_t> splits(n);
      for (int j = 0; j < n; ++j) splits[j] = Split(r, j, salt);
      const int64_t rows = std::accumulate(splits.begin(), splits.end(), int64_t{0});
      Buffer in(t, rows * width);
      int64_t at = 0;
      for (int j = 0; j < n; ++j) {
        for (int64_t k = 0; k < splits[j] * width; ++k) Put(t, in.data(), at++, Pattern(t, r * 7 + j, k, salt));
      }
      std::string what = "a2a." + Str(t) + "." + std::to_string(salt) + " dtype=" + Str(t) +
                         " splits=" + ShapeStr(splits);
      auto h = e.Alltoall("a2a." + Str(t) + "." + std::to_string(salt),
                          TensorView(in.data(), t, {rows, width}),
                          salt == 2 ? std::vector<int64_t>{} : splits);
      if (!ck.ExpectOk(WaitDone(h), what)) continue;
      std::vector<int64_t> want_recv(n);
      std::vector<std::pair<int, int64_t>> origin;  // element -> (sender, element in its block)
      for (int j = 0; j < n; ++j) {
        want_recv[j] = Split(j, r, salt);
        for (int64_t k = 0; k < want_recv[j] * width; ++k) origin.emplace_back(j, k);
      }
      const int64_t total = static_cast<int64_t>(origin.size());
      ck.Expect(h->received_splits() == want_recv,
                what + ": received splits " + ShapeStr(h->received_splits()) +
                    ", expected " + ShapeStr(want_recv));
      ck.Expect(h->output_shape() == std::vector<int64_t>{total / width, width}, what + ": output shape " +
                                                                     ShapeStr(h->output_shape()));
      if (h->output_bytes().size() < static_cast<size_t>(total) * hvd::DataTypeSize(t)) {
        ck.Expect(false, what + ": output too short");
        continue;
      }
      ck.ExpectElements(t, h->output_bytes().data(), total,
                        [&](int64_t i) {
                          auto [j, k] = origin[static_cast<size_t>(i)];
                          return Pattern(t, j * 7 + r, k, salt);
                        },
                        what);
    }
  }
  // Splits that add up to less than the first dimension (as Horovod allows): the rows past
  // their sum are not sent. Rank r's row k is 100 r + k; one row to each rank, three left.
  {
    std::vector<float> rows(static_cast<size_t>(n) + 3);
    for (size_t k = 0; k < rows.size(); ++k) rows[k] = static_cast<float>(100 * r + k);
    auto h = e.Alltoall("a2a.short_splits",
                        TensorView(rows.data(), DataType::kFloat32, {n + 3}),
                        std::vector<int64_t>(n, 1));
    if (ck.ExpectOk(WaitDone(h), "alltoall with splits short of the first dimension")) {
      ck.Expect(h->output_shape() == std::vector<int64_t>{n},
                "short splits: output shape " + ShapeStr(h->output_shape()));
      ck.ExpectElements(DataType::kFloat32, h->output_bytes().data(), n,
                        [&](int64_t j) { return static_cast<double>(100 * j + r); },
                        "short splits: rank j's row r");
    }
  }
  // Splits that add up to more than the first dimension are refused up front.
  float x[4] = {0, 0, 0, 0};
  std::vector<int64_t> bad(n, 0);
  bad[0] = 5;
  hvd::Status s = WaitDone(e.Alltoall("a2a.badsplits", TensorView(x, DataType::kFloat32, {4}), bad));
  ck.Expect(s.code() == hvd::StatusCode::kInvalidArgument, "alltoall bad splits refused: " + s.ToString());
}

// ---------------------------------------------------------------- reducescatter

void CheckReducescatter(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  const int64_t width = 3;
  int64_t salt = 7000;
  for (DataType t : AllDataTypes()) {
    std::vector<int64_t> row_counts = {0, 1, 2 * n + 1, 5 * n + 3};
    if (t == DataType::kFloat32) row_counts.push_back((1 << 16) + 5);
    for (ReduceOp op : AllReduceOps()) {
      if (t == DataType::kBool && op == ReduceOp::kAverage) continue;
      for (int64_t rows : row_counts) {
        ++salt;
        Buffer in(t, rows * width);
        for (int64_t i = 0; i < rows * width; ++i) Put(t, in.data(), i, ReduceInput(t, op, r, n, i, salt));
        std::string name = "rs." + Str(t) + "." + Str(op) + "." + std::to_string(rows);
        std::string what = name + " dtype=" + Str(t) + " op=" + Str(op) + " rows=" + std::to_string(rows);
        auto h = e.Reducescatter(name, TensorView(in.data(), t, {rows, width}), op);
        if (!ck.ExpectOk(WaitDone(h), what)) continue;
        const RowShare share = ReducescatterShare(rows, n, r);
        const int64_t first = share.first, part = share.count;
        ck.Expect(h->output_shape() == std::vector<int64_t>{part, width},
                  what + ": output shape " + ShapeStr(h->output_shape()));
        if (h->output_bytes().size() < static_cast<size_t>(part * width) * hvd::DataTypeSize(t)) {
          ck.Expect(false, what + ": output too short");
          continue;
        }
        ck.ExpectElements(t, h->output_bytes().data(), part * width,
                          [&](int64_t i) { return ExpectedReduce(t, op, n, first * width + i, salt); },
                          what);
      }
    }
  }
}

// Grouped: tensors of different dtypes and row counts (0, 1, odd), one group; each handle gets
// its own part.
void CheckGroupedReducescatter(hvd::Engine& e, Checker& ck) {
  const int r = e.rank(), n = e.size();
  const int64_t width = 2;
  const std::vector<std::pair<DataType, int64_t>> members = {
      {DataType::kFloat32, 2 * n + 1}, {DataType::kInt32, 1}, {DataType::kFloat64, 0},
      {DataType::kInt64, 3 * n}};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    const int64_t salt = op == ReduceOp::kSum ? 7900 : 7901;
    std::vector<Buffer> ins;
    std::vector<TensorView> views;
    std::vector<std::string> names;
    for (size_t k = 0; k < members.size(); ++k) {
      const DataType t = members[k].first;
      const int64_t rows = members[k].second;
      ins.emplace_back(t, rows * width);
      for (int64_t i = 0; i < rows * width; ++i) {
        Put(t, ins.back().data(), i, ReduceInput(t, op, r, n, i, salt + k));
      }
      names.push_back("rs.group." + Str(op) + "." + std::to_string(k));
    }
    for (size_t k = 0; k < members.size(); ++k) {
      views.emplace_back(ins[k].data(), members[k].first, std::vector<int64_t>{members[k].second, width});
    }
    auto hs = e.GroupedReducescatter(names, views, op);
    ck.Expect(hs.size() == members.size(), "grouped reducescatter returns one handle per tensor");
    for (size_t k = 0; k < hs.size() && k < members.size(); ++k) {
      const DataType t = members[k].first;
      const int64_t rows = members[k].second;
      const std::string what = names[k] + " dtype=" + Str(t) + " rows=" + std::to_string(rows);
      if (!ck.ExpectOk(WaitDone(hs[k]), what)) continue;
      const RowShare share = ReducescatterShare(rows, n, r);
      const int64_t first = share.first, part = share.count;
      ck.Expect(hs[k]->output_shape() == std::vector<int64_t>{part, width},
                what + ": output shape " + ShapeStr(hs[k]->output_shape()));
      if (hs[k]->output_bytes().size() < static_cast<size_t>(part * width) * hvd::DataTypeSize(t)) {
        ck.Expect(false, what + ": output too short");
        continue;
      }
      ck.ExpectElements(t, hs[k]->output_bytes().data(), part * width,
                        [&](int64_t i) { return ExpectedReduce(t, op, n, first * width + i, salt + k); },
                        what);
    }
  }
}

}  // namespace

int RunMovementChecks(hvd::Engine& e, Checker& ck) {
  int failures = 0;
  ck.Begin("allgather");
  CheckAllgather(e, ck);
  failures += ck.End();
  ck.Begin("broadcast");
  CheckBroadcast(e, ck);
  failures += ck.End();
  ck.Begin("alltoall");
  CheckAlltoall(e, ck);
  failures += ck.End();
  return failures;
}

int RunReducescatterChecks(hvd::Engine& e, Checker& ck) {
  ck.Begin("reducescatter");
  CheckReducescatter(e, ck);
  CheckGroupedReducescatter(e, ck);
  return ck.End();
}

}  // namespace mp
