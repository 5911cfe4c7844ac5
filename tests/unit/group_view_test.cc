// Group views (transport/group_view.h): every algorithm runs unchanged on a subset of a
// world's ranks, two disjoint views run at the same time, and hierarchical allreduce composes
// a host's local view with its cross view. Expected values come from formulas over the ranks.
#include "transport/group_view.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "inproc_transport.h"

namespace hvd {
namespace {

using test::InProcWorld;
using test::RunRanks;

Deadline Soon() { return DeadlineAfterSeconds(30); }

void ExpectAllOk(const std::vector<Status>& st, const std::string& what) {
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << what << " rank " << r << ": " << st[r].ToString();
}

// World rank w's element i.
double Value(int w, size_t i) { return static_cast<double>(w * 1000 + static_cast<int>(i % 97)); }

TEST(GroupView, RefusesMembersThatCannotFormAView) {
  InProcWorld world(4);
  Transport& t = world.transport(1);
  auto missing = GroupView::Create(t, {0, 2});
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("rank 1 is not a member"), std::string::npos);
  auto twice = GroupView::Create(t, {1, 2, 2});
  EXPECT_NE(twice.status().message().find("rank 2 is listed twice"), std::string::npos);
  auto outside = GroupView::Create(t, {1, 4});
  EXPECT_NE(outside.status().message().find("rank 4 is outside the transport's 4 ranks"),
            std::string::npos);
  auto ok = GroupView::Create(t, {3, 1});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->rank(), 1);
  EXPECT_EQ((*ok)->size(), 2);
  EXPECT_EQ((*ok)->base_rank(0), 3);
  int x = 0;
  Status bad = (*ok)->Wait((*ok)->Isend(2, &x, sizeof(x)), Soon());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad.ToString();
}

TEST(Topology, LocalAndCrossMembers) {
  Topology two_by_three{{0, 0, 0, 1, 1, 1}};
  EXPECT_EQ(two_by_three.LocalMembers(4), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(two_by_three.CrossMembers(4), (std::vector<int>{1, 4}));
  EXPECT_TRUE(two_by_three.Homogeneous());
  EXPECT_EQ(two_by_three.hosts(), 2);
  Topology interleaved{{7, 3, 7, 3}};  // ranks 0, 2 on one host; 1, 3 on the other
  EXPECT_EQ(interleaved.LocalMembers(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(interleaved.CrossMembers(3), (std::vector<int>{2, 3}));
  EXPECT_TRUE(interleaved.Homogeneous());
  Topology unequal{{0, 0, 0, 1}};
  EXPECT_EQ(unequal.CrossMembers(0), (std::vector<int>{0, 3}));
  EXPECT_EQ(unequal.CrossMembers(2), (std::vector<int>{2}));
  EXPECT_FALSE(unequal.Homogeneous());
  EXPECT_FALSE((Topology{{0, 0, 0}}).Homogeneous());  // one host
  EXPECT_FALSE((Topology{{0, 1, 2}}).Homogeneous());  // one rank per host
}

// The places hvdrun gives (local rank and size, cross rank and size) and each rank's host key,
// gathered: hosts of equal size come from the places; otherwise from the keys, so that a set
// whose members sit evenly on unequal hosts is Homogeneous.
TEST(GatherTopology, HostsFromThePlacesOrElseFromTheMachines) {
  struct Place {
    int local_rank, local_size, cross_rank, cross_size;
    uint64_t key;
  };
  auto gather = [](const std::vector<Place>& places, std::string* why) {
    InProcWorld world(static_cast<int>(places.size()));
    std::vector<Topology> got(places.size());
    ExpectAllOk(RunRanks(world,
                         [&](Transport& t) {
                           const Place& p = places[t.rank()];
                           std::string note;
                           auto topo = GatherTopology(t, p.local_rank, p.local_size, p.cross_rank,
                                                      p.cross_size, p.key, Soon(), &note);
                           if (!topo.ok()) return topo.status();
                           got[t.rank()] = *topo;
                           if (t.rank() == 0) *why = note;
                           return Status::OK();
                         }),
                "GatherTopology");
    for (const auto& t : got) EXPECT_EQ(t.host_of, got[0].host_of);
    return got[0];
  };
  std::string why;
  // -H a:2,b:2 on one machine (one key): the places name the hosts.
  Topology even = gather({{0, 2, 0, 2, 7}, {1, 2, 0, 2, 7}, {0, 2, 1, 2, 7}, {1, 2, 1, 2, 7}}, &why);
  EXPECT_EQ(even.host_of, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_TRUE(why.empty()) << why;
  // -H a:4,b:2 on two machines: the job is not Homogeneous, a set of 0, 1, 4, 5 is.
  Topology uneven = gather({{0, 4, 0, 2, 11},
                            {1, 4, 0, 2, 11},
                            {2, 4, 0, 1, 11},
                            {3, 4, 0, 1, 11},
                            {0, 2, 1, 2, 22},
                            {1, 2, 1, 2, 22}},
                           &why);
  EXPECT_EQ(uneven.host_of, (std::vector<int>{0, 0, 0, 0, 4, 4}));
  EXPECT_NE(why.find("hosts of unequal size"), std::string::npos) << why;
  EXPECT_FALSE(uneven.Homogeneous());
  EXPECT_TRUE((Topology{{0, 0, 4, 4}}).Homogeneous());  // the set's members' hosts
  // Places that make no sense, on one machine: one host, not Homogeneous.
  Topology nonsense = gather({{0, 1, 0, 1, 5}, {0, 1, 0, 1, 5}, {0, 1, 0, 1, 5}}, &why);
  EXPECT_EQ(nonsense.host_of, (std::vector<int>{0, 0, 0}));
  EXPECT_FALSE(why.empty());
  EXPECT_FALSE(nonsense.Homogeneous());
}

// Every collective on a view, values from the members' world ranks.
Status RunEveryCollective(Transport& world_t, const std::vector<int>& members, size_t count) {
  auto v = GroupView::Create(world_t, members);
  if (!v.ok()) return v.status();
  Transport& t = **v;
  const int g = t.rank(), n = t.size(), w = world_t.rank();
  ScratchBuffer scratch;
  auto fail = [&](const std::string& what) {
    return Status::Internal(what + " wrong on world rank " + std::to_string(w));
  };
  for (auto algo : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kRecursiveDoubling}) {
    std::vector<double> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = Value(w, i);
    HVD_RETURN_IF_ERROR(Allreduce(t, buf.data(), count, DataType::kFloat64, ReduceOp::kSum,
                                  scratch, Soon(), algo));
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int m : members) want += Value(m, i);
      if (buf[i] != want) return fail("allreduce");
    }
  }
  // Allgatherv: group rank q contributes q + 1 int32 values q * 100 + k.
  std::vector<size_t> bytes(n);
  for (int q = 0; q < n; ++q) bytes[q] = (q + 1) * sizeof(int32_t);
  std::vector<int32_t> mine(g + 1), all(static_cast<size_t>(n) * (n + 1) / 2);
  for (int k = 0; k <= g; ++k) mine[k] = g * 100 + k;
  HVD_RETURN_IF_ERROR(Allgatherv(t, mine.data(), all.data(), bytes, Soon()));
  for (int q = 0, at = 0; q < n; ++q) {
    for (int k = 0; k <= q; ++k, ++at) {
      if (all[at] != q * 100 + k) return fail("allgatherv");
    }
  }
  // Broadcast from the last group rank: its world rank's values.
  std::vector<double> b(count, -1);
  if (g == n - 1) {
    for (size_t i = 0; i < count; ++i) b[i] = Value(w, i);
  }
  HVD_RETURN_IF_ERROR(Broadcast(t, b.data(), count * sizeof(double), n - 1, Soon()));
  for (size_t i = 0; i < count; ++i) {
    if (b[i] != Value(members.back(), i)) return fail("broadcast");
  }
  // Alltoallv: g sends q + 1 int32 values g * 10 + q to group rank q.
  std::vector<size_t> send(n), recv(n);
  std::vector<int32_t> out_vals;
  for (int q = 0; q < n; ++q) {
    send[q] = (q + 1) * sizeof(int32_t);
    recv[q] = (g + 1) * sizeof(int32_t);
    for (int k = 0; k <= q; ++k) out_vals.push_back(g * 10 + q);
  }
  std::vector<int32_t> in_vals(static_cast<size_t>(n) * (g + 1));
  HVD_RETURN_IF_ERROR(Alltoallv(t, out_vals.data(), send, in_vals.data(), recv, Soon()));
  for (int q = 0; q < n; ++q) {
    for (int k = 0; k <= g; ++k) {
      if (in_vals[q * (g + 1) + k] != q * 10 + g) return fail("alltoallv");
    }
  }
  // ReduceScatter of the same inputs: part q has q + 1 elements.
  std::vector<size_t> counts(n);
  for (int q = 0; q < n; ++q) counts[q] = q + 1;
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<double> rin(total), rout(counts[g]);
  for (size_t i = 0; i < total; ++i) rin[i] = Value(w, i);
  HVD_RETURN_IF_ERROR(ReduceScatter(t, rin.data(), rout.data(), counts, DataType::kFloat64,
                                    ReduceOp::kSum, scratch, Soon()));
  const size_t off = static_cast<size_t>(g) * (g + 1) / 2;
  for (size_t k = 0; k < counts[g]; ++k) {
    double want = 0;
    for (int m : members) want += Value(m, off + k);
    if (rout[k] != want) return fail("reducescatter");
  }
  return Barrier(t, Soon());
}

TEST(GroupView, TwoDisjointViewsRunEveryCollectiveAtOnce) {
  const std::vector<int> evens = {0, 2, 4, 6}, odds = {5, 3, 1};  // odds in reverse order
  for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{300000}}) {
    InProcWorld world(7);
    ExpectAllOk(RunRanks(world,
                         [&](Transport& t) {
                           return RunEveryCollective(t, t.rank() % 2 ? odds : evens, count);
                         }),
                "count " + std::to_string(count));
  }
}

// The local and cross views of `t` in `topo`.
Status MakeViews(Transport& t, const Topology& topo, std::unique_ptr<GroupView>* local,
                 std::unique_ptr<GroupView>* cross) {
  auto l = GroupView::Create(t, topo.LocalMembers(t.rank()));
  if (!l.ok()) return l.status();
  auto c = GroupView::Create(t, topo.CrossMembers(t.rank()));
  if (!c.ok()) return c.status();
  *local = std::move(*l);
  *cross = std::move(*c);
  return Status::OK();
}

// Hierarchical allreduce over the local and cross views of each topology, against the formula.
TEST(HierarchicalAllreduce, MatchesTheFlatSumOnEveryHomogeneousTopology) {
  const std::vector<std::vector<int>> hosts = {
      {0, 0, 1, 1}, {0, 0, 0, 1, 1, 1}, {0, 1, 0, 1, 0, 1}, {0, 0, 1, 1, 2, 2}};
  for (const auto& host_of : hosts) {
    Topology topo{host_of};
    ASSERT_TRUE(topo.Homogeneous());
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{4099}, size_t{1} << 18}) {
      InProcWorld world(topo.size());
      ExpectAllOk(
          RunRanks(world,
                   [&](Transport& t) -> Status {
                     std::unique_ptr<GroupView> local, cross;
                     HVD_RETURN_IF_ERROR(MakeViews(t, topo, &local, &cross));
                     std::vector<double> buf(count);
                     for (size_t i = 0; i < count; ++i) buf[i] = Value(t.rank(), i);
                     ScratchBuffer scratch;
                     scratch.Get(HierarchicalAllreduceScratchBytes(
                         count, DataType::kFloat64, local->size(), cross->size()));
                     const size_t reserved = scratch.capacity();
                     HVD_RETURN_IF_ERROR(HierarchicalAllreduce(*local, *cross, buf.data(), count,
                                                               DataType::kFloat64, ReduceOp::kSum,
                                                               scratch, Soon()));
                     for (size_t i = 0; i < count; ++i) {
                       double want = 0;
                       for (int r = 0; r < topo.size(); ++r) want += Value(r, i);
                       if (buf[i] != want) {
                         return Status::Internal("element " + std::to_string(i) + " is " +
                                                 std::to_string(buf[i]) + ", expected " +
                                                 std::to_string(want));
                       }
                     }
                     if (scratch.capacity() != reserved) {
                       return Status::Internal("scratch grew past what was reserved");
                     }
                     return Status::OK();
                   }),
          "hosts " + std::to_string(topo.hosts()) + " count " + std::to_string(count));
    }
  }
}

// Hierarchical allgatherv over the same topologies (hosts contiguous and interleaved), with
// parts of different sizes per rank (zero included), against the byte formula.
TEST(HierarchicalAllgather, MatchesTheFlatGatherOnEveryHomogeneousTopology) {
  const std::vector<std::vector<int>> hosts = {
      {0, 0, 1, 1}, {0, 0, 0, 1, 1, 1}, {0, 1, 0, 1, 0, 1}, {0, 0, 1, 1, 2, 2}};
  // Byte b of world rank w's part.
  auto byte = [](int w, size_t b) { return static_cast<uint8_t>(w * 31 + b * 7 + b / 251); };
  for (const auto& host_of : hosts) {
    Topology topo{host_of};
    ASSERT_TRUE(topo.Homogeneous());
    for (size_t unit : {size_t{0}, size_t{1}, size_t{3}, size_t{4099}, size_t{1} << 16}) {
      // Rank w sends unit * ((w % 3) + (w == 1 ? 0 : 1)) bytes: rank 1 sends none.
      std::vector<size_t> bytes(topo.size());
      for (int w = 0; w < topo.size(); ++w) bytes[w] = unit * ((w % 3) + (w == 1 ? 0 : 1));
      const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
      InProcWorld world(topo.size());
      ExpectAllOk(
          RunRanks(world,
                   [&](Transport& t) -> Status {
                     std::unique_ptr<GroupView> local, cross;
                     HVD_RETURN_IF_ERROR(MakeViews(t, topo, &local, &cross));
                     std::vector<std::vector<int>> layout;
                     for (int first : topo.CrossMembers(t.rank())) {
                       layout.push_back(topo.LocalMembers(first));
                     }
                     std::vector<uint8_t> in(bytes[t.rank()]), out(total, 0xEE);
                     for (size_t b = 0; b < in.size(); ++b) in[b] = byte(t.rank(), b);
                     ScratchBuffer scratch;
                     scratch.Get(HierarchicalAllgatherScratchBytes(layout, bytes));
                     const size_t reserved = scratch.capacity();
                     HVD_RETURN_IF_ERROR(HierarchicalAllgatherv(*local, *cross, layout,
                                                                in.data(), out.data(), bytes,
                                                                scratch, Soon()));
                     size_t at = 0;
                     for (int w = 0; w < topo.size(); ++w) {
                       for (size_t b = 0; b < bytes[w]; ++b, ++at) {
                         if (out[at] != byte(w, b)) {
                           return Status::Internal("byte " + std::to_string(b) + " of rank " +
                                                   std::to_string(w) + "'s part is wrong");
                         }
                       }
                     }
                     if (scratch.capacity() != reserved) {
                       return Status::Internal("scratch grew past what was reserved");
                     }
                     return Status::OK();
                   }),
          "hosts " + std::to_string(topo.hosts()) + " unit " + std::to_string(unit));
    }
  }
}

}  // namespace
}  // namespace hvd
