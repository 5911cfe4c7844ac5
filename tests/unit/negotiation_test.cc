// Unit tests of the negotiation layer: wire format, coordinator, fusion, response cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <list>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "coordinator/coordinator.h"
#include "coordinator/messages.h"
#include "coordinator/response_cache.h"
#include "engine/name_table.h"
#include "hvd/engine.h"
#include "planner/autotune.h"
#include "planner/fusion.h"
#include "planner/plan.h"

namespace hvd {
namespace {

Request Join() {
  Request r;
  r.type = OpType::kJoin;
  r.name = kJoinName;
  return r;
}

Request Allreduce(const std::string& name, std::vector<int64_t> shape,
                  DataType dtype = DataType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.type = OpType::kAllreduce;
  r.name = name;
  r.shape = std::move(shape);
  r.dtype = dtype;
  r.op = op;
  return r;
}

TEST(Messages, RequestListRoundTrip) {
  RequestList l;
  l.requests.push_back(Allreduce("a", {2, 3}, DataType::kBFloat16, ReduceOp::kMax));
  Request b;
  b.type = OpType::kAlltoall;
  b.name = std::string("b\0c", 3);
  b.splits = {1, 0, 2};
  b.shape = {3};
  b.group = "g";
  b.group_size = 2;
  b.prescale = 0.5;
  b.error = "alltoall 'b' on rank 1: splits must be 2 row counts";
  b.error_code = StatusCode::kFailedPrecondition;
  l.requests.push_back(b);
  l.cache_epoch = 77;
  l.cached_bits = {0x5, 1ull << 63};
  auto bytes = Encode(l);
  RequestList out;
  ASSERT_TRUE(Decode(bytes.data(), bytes.size(), &out).ok());
  ASSERT_EQ(out.requests.size(), 2u);
  EXPECT_TRUE(SameRequest(out.requests[0], l.requests[0]));
  EXPECT_TRUE(SameRequest(out.requests[1], l.requests[1]));
  EXPECT_EQ(out.requests[1].error, b.error);
  EXPECT_EQ(out.requests[1].error_code, StatusCode::kFailedPrecondition);
  EXPECT_TRUE(out.requests[0].error.empty());
  EXPECT_EQ(out.cache_epoch, 77u);
  EXPECT_EQ(out.cached_bits, l.cached_bits);
}

TEST(Messages, ResponseListRoundTripWithCompactEntries) {
  ResponseList l;
  Response full;
  full.type = OpType::kAllgather;
  full.names = {"x", "y"};
  full.shapes = {{4, 2}, {1}};
  full.sizes = {1, 2, 3};
  full.joined = {2};
  full.error = "";
  l.responses.push_back(full);
  Response compact;
  compact.cache_bits = {3, 9};
  l.responses.push_back(compact);
  l.ready_bits = {0x5, 0, uint64_t{1} << 63};
  l.fusion_threshold = 4096;
  l.knobs.hierarchical_allreduce = 2;
  l.knobs.small_allreduce_bytes = 12345;
  l.knobs.staging_piece_bytes = 777;
  l.after_round = 77;
  auto bytes = Encode(l);
  ResponseList out;
  ASSERT_TRUE(Decode(bytes.data(), bytes.size(), &out).ok());
  ASSERT_EQ(out.responses.size(), 2u);
  EXPECT_EQ(out.responses[0].names, full.names);
  EXPECT_EQ(out.responses[0].shapes, full.shapes);
  EXPECT_EQ(out.responses[0].sizes, full.sizes);
  EXPECT_EQ(out.responses[0].joined, full.joined);
  EXPECT_EQ(out.responses[1].cache_bits, compact.cache_bits);
  EXPECT_EQ(out.ready_bits, l.ready_bits);
  EXPECT_EQ(out.fusion_threshold, 4096u);
  EXPECT_EQ(out.knobs.hierarchical_allreduce, 2);
  EXPECT_EQ(out.knobs.small_allreduce_bytes, 12345u);
  EXPECT_EQ(out.responses[0].knobs.small_allreduce_bytes, 12345u);  // every response has them
  EXPECT_EQ(out.responses[1].knobs.staging_piece_bytes, 777u);
  EXPECT_EQ(out.after_round, 77u);
  // A toggle out of range is refused.
  l.knobs.hierarchical_allreduce = 3;
  bytes = Encode(l);
  EXPECT_FALSE(Decode(bytes.data(), bytes.size(), &out).ok());
}

// A part of a round of the symmetric fast path (engine/rounds.cc).
TEST(Messages, RoundPartRoundTripAndRefusals) {
  RoundContribution c;
  c.round = 1ull << 40;
  c.rank = 5;
  c.cache_epoch = 9;
  c.ready = {0x5, 0, uint64_t{1} << 63};
  c.withdraw = {0x4};
  c.fusion_threshold = 1 << 20;
  c.knobs.hierarchical_allreduce = 1;
  c.knobs.small_allreduce_bytes = 999;
  c.knobs.staging_piece_bytes = 0;
  c.hold_uneven = true;
  auto bytes = Encode(c);
  RoundContribution out;
  ASSERT_TRUE(Decode(bytes.data(), bytes.size(), &out).ok());
  EXPECT_EQ(out.round, c.round);
  EXPECT_EQ(out.rank, 5);
  EXPECT_EQ(out.cache_epoch, 9u);
  EXPECT_EQ(out.ready, c.ready);
  EXPECT_EQ(out.withdraw, c.withdraw);
  EXPECT_EQ(out.fusion_threshold, c.fusion_threshold);
  EXPECT_EQ(out.knobs.hierarchical_allreduce, 1);
  EXPECT_EQ(out.knobs.small_allreduce_bytes, 999u);
  EXPECT_EQ(out.knobs.staging_piece_bytes, 0u);
  EXPECT_TRUE(out.hold_uneven);
  // Every truncation is refused, and so are a negative rank, a toggle out of range, a hold
  // other than 0 or 1, and trailing bytes.
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(Decode(bytes.data(), n, &out).ok()) << n << " bytes";
  }
  RoundContribution bad = c;
  bad.rank = -1;
  auto b = Encode(bad);
  EXPECT_FALSE(Decode(b.data(), b.size(), &out).ok());
  bad = c;
  bad.knobs.hierarchical_allreduce = 3;
  b = Encode(bad);
  EXPECT_FALSE(Decode(b.data(), b.size(), &out).ok());
  b = bytes;
  b.back() = 2;  // the hold
  EXPECT_FALSE(Decode(b.data(), b.size(), &out).ok());
  b = bytes;
  b.push_back(0);
  Status s = Decode(b.data(), b.size(), &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("trailing"), std::string::npos) << s.message();
}

TEST(Messages, GarbageIsRefusedNotCrashed) {
  RequestList l;
  for (int i = 0; i < 5; ++i) l.requests.push_back(Allreduce("t" + std::to_string(i), {i, 7}));
  auto good = Encode(l);
  std::mt19937 rng(1);
  int refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto bytes = good;
    if (iter % 3 == 0) {
      bytes.resize(rng() % bytes.size());  // truncated
    } else {
      for (int k = 0; k < 4; ++k) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    }
    RequestList out;
    ResponseList out2;
    refused += Decode(bytes.data(), bytes.size(), &out).ok() ? 0 : 1;
    (void)Decode(bytes.data(), bytes.size(), &out2);
  }
  EXPECT_GT(refused, 1000);  // truncations alone are a third of the cases
  RequestList out;
  EXPECT_FALSE(Decode(nullptr, 0, &out).ok());
}

TEST(Coordinator, ReadyOnlyWhenEveryRankAnnounced) {
  Coordinator c(3, 0, 0);
  c.AddRequests(2, {Allreduce("a", {4})});
  c.AddRequests(0, {Allreduce("a", {4})});
  EXPECT_TRUE(c.ComputeResponses().empty());
  c.AddRequests(1, {Allreduce("a", {4})});
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].type, OpType::kAllreduce);
  EXPECT_EQ(rs[0].names, std::vector<std::string>{"a"});
  EXPECT_TRUE(c.idle());
}

TEST(Coordinator, MismatchNamesTensorWhatAndRanks) {
  Coordinator c(3, 0, 0);
  c.AddRequests(0, {Allreduce("w", {4})});
  c.AddRequests(1, {Allreduce("w", {4})});
  c.AddRequests(2, {Allreduce("w", {5})});
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].type, OpType::kError);
  EXPECT_NE(rs[0].error.find("'w'"), std::string::npos) << rs[0].error;
  EXPECT_NE(rs[0].error.find("shape [4] vs [5]"), std::string::npos) << rs[0].error;
  EXPECT_NE(rs[0].error.find("rank 2"), std::string::npos) << rs[0].error;

  for (int r = 0; r < 3; ++r) {
    c.AddRequests(r, {Allreduce("d", {4}, r == 1 ? DataType::kFloat64 : DataType::kFloat32)});
    c.AddRequests(r, {Allreduce("o", {4}, DataType::kFloat32, r == 0 ? ReduceOp::kMax : ReduceOp::kSum)});
  }
  rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_NE(rs[0].error.find("dtype float32 vs float64"), std::string::npos) << rs[0].error;
  EXPECT_NE(rs[1].error.find("reduce op max vs sum"), std::string::npos) << rs[1].error;
}

TEST(Coordinator, BroadcastRootMismatch) {
  Coordinator c(2, 0, 0);
  for (int r = 0; r < 2; ++r) {
    Request q = Allreduce("b", {3});
    q.type = OpType::kBroadcast;
    q.root = r;
    c.AddRequests(r, {q});
  }
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_NE(rs[0].error.find("root rank 0 vs 1"), std::string::npos) << rs[0].error;
}

Response ResponseFor(const Request& q) {
  Response r;
  r.type = q.type;
  r.names = {q.name};
  r.shapes = {q.shape};
  r.dtype = q.dtype;
  r.op = q.op;
  return r;
}

// A rank that refused its own arguments (Request::error) fails the tensor on every rank with
// its reason and code, before any comparison of the other fields; where several refused, the
// first one's reason names them all. A refusal is never looked up in the response cache.
TEST(Coordinator, RefusedArgumentsFailEveryRankWithTheReason) {
  Coordinator c(4, 0, 0);
  for (int r = 0; r < 4; ++r) {
    Request q = Allreduce("b", {3});
    q.type = OpType::kBroadcast;
    q.root = r == 2 ? 9 : 0;
    if (r >= 2) {
      q.error = "broadcast 'b' on rank " + std::to_string(r) + ": root rank 9 is outside [0, 4)";
      q.error_code = r == 2 ? StatusCode::kFailedPrecondition : StatusCode::kInvalidArgument;
    }
    c.AddRequests(r, {q});
  }
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].type, OpType::kError);
  EXPECT_EQ(rs[0].names, std::vector<std::string>{"b"});
  EXPECT_EQ(rs[0].error_code, StatusCode::kFailedPrecondition);
  EXPECT_EQ(rs[0].error, "broadcast 'b' on rank 2: root rank 9 is outside [0, 4) (ranks [2, 3] "
                         "refused it); the operation fails on every rank");
  ResponseCache cache(8, false);
  Request q = Allreduce("b", {3});
  cache.Apply({ResponseFor(q)});
  ASSERT_EQ(cache.Lookup(q), 0);
  q.error = "allreduce 'b' on rank 1: output data is null";
  EXPECT_EQ(cache.Lookup(q), -1);  // the refusal goes to the coordinator
}

TEST(Coordinator, AllgatherSizesPerRank) {
  Coordinator c(3, 0, 0);
  for (int r = 0; r < 3; ++r) {
    Request q = Allreduce("g", {r * 2, 5});
    q.type = OpType::kAllgather;
    c.AddRequests(r, {q});
  }
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].sizes, (std::vector<int64_t>{0, 2, 4}));
}

TEST(Coordinator, JoinCountsJoinedRanksAsReady) {
  Coordinator c(3, 0, 0);
  const Request join = Join();
  c.AddRequests(1, {join});
  c.AddRequests(0, {Allreduce("a", {2})});
  EXPECT_TRUE(c.ComputeResponses().empty());
  c.AddRequests(2, {Allreduce("a", {2})});
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].joined, std::vector<int32_t>{1});
  c.AddRequests(2, {join});
  c.AddRequests(0, {join});
  rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].type, OpType::kJoin);
  EXPECT_EQ(rs[0].last_joined, 0);
}

// While a rank has joined, an allgather (or broadcast, alltoall, reducescatter) fails at once on
// the rank that submitted it, without waiting for the others: unnamed calls on different ranks
// may carry different names once one rank has had a call refused.
TEST(Coordinator, RefusedWhileJoinedFailsAtOnce) {
  Coordinator c(3, 0, 0);
  const Request join = Join();
  c.AddRequests(1, {join});
  for (OpType t : {OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                   OpType::kReducescatter}) {
    Request q = Allreduce(std::string("x.") + OpTypeName(t), {3, 2});
    q.type = t;
    c.AddRequests(0, {q});
    auto rs = c.ComputeResponses();
    ASSERT_EQ(rs.size(), 1u) << OpTypeName(t);
    EXPECT_EQ(rs[0].type, OpType::kError);
    EXPECT_EQ(rs[0].names, std::vector<std::string>{q.name});
    EXPECT_NE(rs[0].error.find("is not supported with Join at this time"), std::string::npos)
        << rs[0].error;
    EXPECT_NE(rs[0].error.find("(ranks 1 have joined)"), std::string::npos) << rs[0].error;
  }
  // An allreduce still waits for every rank that has not joined.
  c.AddRequests(0, {Allreduce("a", {2})});
  EXPECT_TRUE(c.ComputeResponses().empty());
  c.AddRequests(2, {Allreduce("a", {2})});
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].type, OpType::kAllreduce);
}

TEST(Coordinator, GroupRefusedWhileJoinedFailsOnlyTheRanksThatSubmittedIt) {
  // A grouped allgather refused while rank 1 has joined: the group's error is for rank 0, which
  // submitted it; rank 2's submission, on its way, is answered on its own when it comes.
  Coordinator c(3, 0, 0);
  auto grouped = [](const std::string& n, std::vector<int64_t> shape = {2}) {
    Request q = Allreduce(n, std::move(shape));
    q.type = OpType::kAllgather;
    q.group = "g";
    q.group_size = 2;
    return q;
  };
  // Before any rank joins: a member that mismatches fails the group on every rank (the other
  // member's rows, which its response carried in `sizes`, are no list of ranks).
  c.AddRequests(0, {grouped("p", {3, 2}), grouped("q", {1, 2})});
  c.AddRequests(1, {grouped("p", {1, 2}), grouped("q", {1, 2})});
  c.AddRequests(2, {grouped("p", {2, 2}), grouped("q", {1, 3})});
  auto whole = c.ComputeResponses();
  ASSERT_EQ(whole.size(), 2u);
  for (const auto& r : whole) {
    EXPECT_EQ(r.type, OpType::kError) << r.names[0];
    EXPECT_TRUE(r.sizes.empty()) << r.names[0] << ": for every rank";
  }
  c.AddRequests(1, {Join()});
  for (int rank : {0, 2}) {
    c.AddRequests(rank, {grouped("a"), grouped("b")});
    auto rs = c.ComputeResponses();
    ASSERT_EQ(rs.size(), 2u) << "rank " << rank;
    std::set<std::string> names;
    for (const auto& r : rs) {
      EXPECT_EQ(r.type, OpType::kError);
      EXPECT_EQ(r.sizes, std::vector<int64_t>{rank}) << r.names[0];
      EXPECT_NE(r.error.find("failed as a whole"), std::string::npos) << r.error;
      EXPECT_NE(r.error.find("is not supported with Join at this time"), std::string::npos)
          << r.error;
      names.insert(r.names.begin(), r.names.end());
    }
    EXPECT_EQ(names, (std::set<std::string>{"a", "b"}));
  }
}

TEST(Coordinator, GroupIsReleasedWhole) {
  Coordinator c(2, 0, 0);
  auto grouped = [](const std::string& n) {
    Request q = Allreduce(n, {1});
    q.group = "g1";
    q.group_size = 2;
    return q;
  };
  c.AddRequests(0, {grouped("x"), grouped("y")});
  c.AddRequests(1, {grouped("x")});
  EXPECT_TRUE(c.ComputeResponses().empty());  // x is ready, y is not: the group waits
  c.AddRequests(1, {grouped("y")});
  auto rs = c.ComputeResponses();
  EXPECT_EQ(rs.size(), 2u);
}

Request Grouped(const std::string& name, std::vector<int64_t> shape, int size,
                const std::string& group = "g") {
  Request q = Allreduce(name, std::move(shape));
  q.group = group;
  q.group_size = size;
  return q;
}

TEST(Coordinator, GroupWithOneMismatchingMemberFailsAsAWhole) {
  Coordinator c(2, 0, 0);
  c.AddRequests(0, {Grouped("x", {1}, 3), Grouped("y", {1}, 3), Grouped("z", {1}, 3)});
  c.AddRequests(1, {Grouped("x", {1}, 3), Grouped("y", {2}, 3), Grouped("z", {1}, 3)});
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 3u);
  std::vector<std::string> names;
  for (const auto& r : rs) {
    EXPECT_EQ(r.type, OpType::kError);
    EXPECT_EQ(r.error_code, StatusCode::kInvalidArgument);
    ASSERT_EQ(r.names.size(), 1u);
    names.push_back(r.names[0]);
    EXPECT_NE(r.error.find("'y'"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("shape [1] vs [2]"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("rank 0 vs rank 1"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("grouped allreduce of 3 tensors"), std::string::npos) << r.error;
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_TRUE(c.idle());
  // The next operation is not affected.
  c.AddRequests(0, {Allreduce("next", {1})});
  c.AddRequests(1, {Allreduce("next", {1})});
  rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].type, OpType::kAllreduce);
}

// Ranks that put a tensor in groups of different sizes (a group of 3 on rank 0, of 2 on rank 1,
// or one tensor alone): no group can complete as every rank sees it, so every member of every
// group involved fails at once, in whichever order the ranks' requests come; nothing is held.
TEST(Coordinator, GroupsOfDifferentSizesFailWholeAtOnce) {
  auto alone = [](const std::string& n) { return Allreduce(n, {1}); };
  struct Case {
    std::vector<Request> zero, one;
    std::vector<std::string> failed;
  };
  const std::vector<Case> cases = {
      {{Grouped("x", {1}, 3), Grouped("y", {1}, 3), Grouped("z", {1}, 3)},
       {Grouped("x", {1}, 2), Grouped("y", {1}, 2)},
       {"x", "y", "z"}},
      {{Grouped("x", {1}, 2), Grouped("y", {1}, 2)}, {alone("x")}, {"x", "y"}},
      {{Grouped("x", {1}, 2), Grouped("y", {1}, 2)}, {alone("y")}, {"x", "y"}},
      // The same size, another member: the engine's keys differ (they digest every name).
      {{Grouped("x", {1}, 2, "g/xy"), Grouped("y", {1}, 2, "g/xy")},
       {Grouped("x", {1}, 2, "g/xz"), Grouped("z", {1}, 2, "g/xz")},
       {"x", "y", "z"}},
  };
  for (const Case& k : cases) {
    for (bool zero_first : {true, false}) {
      Coordinator c(2, 0, 0);
      c.AddRequests(zero_first ? 0 : 1, zero_first ? k.zero : k.one);
      c.AddRequests(zero_first ? 1 : 0, zero_first ? k.one : k.zero);
      std::set<std::string> names;
      for (const auto& r : c.ComputeResponses()) {
        EXPECT_EQ(r.type, OpType::kError);
        EXPECT_EQ(r.error_code, StatusCode::kInvalidArgument);
        EXPECT_NE(r.error.find("group membership"), std::string::npos) << r.error;
        if (k.one.size() == 1) {
          EXPECT_NE(r.error.find("a group of 2 tensors"), std::string::npos) << r.error;
          EXPECT_NE(r.error.find("the tensor alone (no group, or a group of one)"),
                    std::string::npos)
              << r.error;
        }
        for (const auto& n : r.names) names.insert(n);
      }
      EXPECT_EQ(names, std::set<std::string>(k.failed.begin(), k.failed.end()))
          << "rank 0 first: " << zero_first;
      EXPECT_TRUE(c.idle()) << "rank 0 first: " << zero_first;
      c.AddRequests(0, {Allreduce("next", {1})});
      c.AddRequests(1, {Allreduce("next", {1})});
      auto rs = c.ComputeResponses();
      ASSERT_EQ(rs.size(), 1u);
      EXPECT_EQ(rs[0].type, OpType::kAllreduce);
    }
  }
}

// A member that fails with its group before some rank announced it (that rank submits the
// group's names alone, one by one) is owed by that rank: its announcement, whenever it comes,
// pairs with the failed one and gets the error, for that rank only, instead of waiting for
// ranks that have moved on. The failure itself is only for the ranks that had announced the
// name: another's announcement may be on its way. Requests the failure came after (waiting at
// the coordinator) leave nothing behind.
TEST(Coordinator, MemberFailedBeforeARankAnnouncedItAnswersItWhenItComes) {
  auto ranks_of = [](const Response& r) { return std::vector<int64_t>(r.sizes); };
  auto by_name = [](std::vector<Response> rs) {
    std::map<std::string, Response> out;
    for (auto& r : rs) {
      EXPECT_EQ(r.type, OpType::kError);
      EXPECT_NE(r.error.find("group membership"), std::string::npos) << r.error;
      out[r.names.at(0)] = std::move(r);
    }
    return out;
  };
  auto agreed = [](Coordinator& c, int size, const std::string& name, int64_t rows) {
    for (int r = 0; r < size; ++r) c.AddRequests(r, {Allreduce(name, {rows})});
    auto rs = c.ComputeResponses();
    ASSERT_EQ(rs.size(), 1u) << name;
    EXPECT_EQ(rs[0].type, OpType::kAllreduce) << rs[0].error;
    EXPECT_EQ(rs[0].shapes.at(0), std::vector<int64_t>{rows});
  };
  {  // Late: rank 1 sends y after the group failed.
    Coordinator c(2, 0, 0);
    c.AddRequests(1, {Allreduce("x", {1})});
    c.AddRequests(0, {Grouped("x", {1}, 2), Grouped("y", {1}, 2)});
    auto rs = by_name(c.ComputeResponses());
    ASSERT_EQ(rs.size(), 2u);
    EXPECT_EQ(ranks_of(rs["x"]), std::vector<int64_t>{});   // every rank announced it
    EXPECT_EQ(ranks_of(rs["y"]), std::vector<int64_t>{0});  // rank 1 has not yet
    EXPECT_TRUE(c.idle());
    c.AddRequests(1, {Allreduce("y", {1})});
    rs = by_name(c.ComputeResponses());
    ASSERT_EQ(rs.count("y"), 1u);
    EXPECT_EQ(ranks_of(rs["y"]), std::vector<int64_t>{1});
    EXPECT_TRUE(c.idle());
    agreed(c, 2, "y", 3);  // the next step's y is its own
  }
  {  // Early: rank 1's x and y wait at the coordinator when rank 0's group comes.
    Coordinator c(2, 0, 0);
    c.AddRequests(1, {Allreduce("x", {1})});
    c.AddRequests(1, {Allreduce("y", {1})});
    c.AddRequests(0, {Grouped("x", {1}, 2), Grouped("y", {1}, 2)});
    auto rs = by_name(c.ComputeResponses());
    ASSERT_EQ(rs.size(), 2u);
    EXPECT_EQ(ranks_of(rs["y"]), std::vector<int64_t>{});
    EXPECT_TRUE(c.idle());
    agreed(c, 2, "y", 3);  // nothing of rank 1's y is left to pair with rank 0's next
    agreed(c, 2, "x", 3);
  }
  {  // Three ranks: 0 and 2 group x and y, 1 sends x alone first, y after.
    Coordinator c(3, 0, 0);
    c.AddRequests(0, {Grouped("x", {1}, 2), Grouped("y", {1}, 2)});
    c.AddRequests(1, {Allreduce("x", {1})});
    EXPECT_TRUE(c.ComputeResponses().empty());  // x waits on rank 2
    c.AddRequests(2, {Grouped("x", {1}, 2), Grouped("y", {1}, 2)});
    const auto rs = c.ComputeResponses();
    // x for every rank; y for rank 0, then for rank 2 (its y came after x's failure).
    ASSERT_EQ(rs.size(), 3u);
    std::map<std::string, std::vector<std::vector<int64_t>>> ranks;
    for (const auto& [name, r] : by_name({rs[0]})) ranks[name].push_back(ranks_of(r));
    for (const auto& [name, r] : by_name({rs[1]})) ranks[name].push_back(ranks_of(r));
    for (const auto& [name, r] : by_name({rs[2]})) ranks[name].push_back(ranks_of(r));
    EXPECT_EQ(ranks["x"], (std::vector<std::vector<int64_t>>{{}}));
    EXPECT_EQ(ranks["y"], (std::vector<std::vector<int64_t>>{{0}, {2}}));
    c.AddRequests(1, {Allreduce("y", {1})});
    const auto ys = by_name(c.ComputeResponses());
    ASSERT_EQ(ys.size(), 1u);
    EXPECT_EQ(ranks_of(ys.at("y")), std::vector<int64_t>{1});
    EXPECT_TRUE(c.idle());
    agreed(c, 3, "y", 2);
    agreed(c, 3, "x", 2);
  }
  {  // A group of fewer tensors on rank 1 (it left z out); the next step's groups agree.
    Coordinator c(2, 0, 0);
    c.AddRequests(0, {Grouped("x", {1}, 3, "g/xyz"), Grouped("y", {1}, 3, "g/xyz"),
                      Grouped("z", {1}, 3, "g/xyz")});
    c.AddRequests(1, {Grouped("x", {1}, 2, "g/xy"), Grouped("y", {1}, 2, "g/xy")});
    auto rs = by_name(c.ComputeResponses());
    ASSERT_EQ(rs.size(), 3u);
    EXPECT_EQ(ranks_of(rs["z"]), std::vector<int64_t>{0});
    for (int r = 0; r < 2; ++r) {
      c.AddRequests(r, {Grouped("x", {2}, 3, "g/xyz"), Grouped("y", {2}, 3, "g/xyz"),
                        Grouped("z", {2}, 3, "g/xyz")});
    }
    const auto next = c.ComputeResponses();
    ASSERT_EQ(next.size(), 3u);
    for (const auto& r : next) EXPECT_EQ(r.type, OpType::kAllreduce) << r.error;
    EXPECT_TRUE(c.idle());
  }
  {  // Rank 1 never sends the y it owes; the next step groups y with another tensor.
    Coordinator c(2, 0, 0);
    c.AddRequests(1, {Allreduce("x", {1})});
    c.AddRequests(0, {Grouped("x", {1}, 2, "g/xy"), Grouped("y", {1}, 2, "g/xy")});
    EXPECT_EQ(c.ComputeResponses().size(), 2u);
    for (int r = 0; r < 2; ++r) {
      c.AddRequests(r, {Grouped("y", {2}, 2, "g/yz"), Grouped("z", {2}, 2, "g/yz")});
    }
    const auto next = c.ComputeResponses();
    ASSERT_EQ(next.size(), 2u);
    for (const auto& r : next) EXPECT_EQ(r.type, OpType::kAllreduce) << r.error;
    EXPECT_TRUE(c.idle());
    agreed(c, 2, "y", 3);  // and nothing is owed any more
  }
  {  // A rank that joins owes nothing more.
    Coordinator c(2, 0, 0);
    c.AddRequests(1, {Allreduce("x", {1})});
    c.AddRequests(0, {Grouped("x", {1}, 2), Grouped("y", {1}, 2)});
    EXPECT_EQ(c.ComputeResponses().size(), 2u);
    c.AddRequests(1, {Join()});
    c.AddRequests(0, {Join()});
    auto rs = c.ComputeResponses();
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_EQ(rs[0].type, OpType::kJoin);
    agreed(c, 2, "y", 2);
  }
}

// Past the stall shutdown time a name some ranks never announced shuts the job down, as
// Horovod's stall shutdown does (the engine fails every rank with the reason): failing it on the
// ranks that announced it alone would let the late ranks' announcement pair with the next
// step's. A group member that stalls does the same.
TEST(Coordinator, GroupMemberStalledPastTheShutdownTimeShutsTheJobDown) {
  Coordinator c(2, 0, /*stall_seconds=*/0, /*stall_shutdown_seconds=*/0.001);
  c.AddRequests(0, {Grouped("x", {1}, 2), Grouped("y", {1}, 2)});
  c.AddRequests(1, {Grouped("x", {1}, 2)});  // y never comes from rank 1
  EXPECT_TRUE(c.ComputeResponses().empty());
  EXPECT_FALSE(c.idle());  // x is held back with its group
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  c.CheckStalls(Clock::now());
  const std::string& why = c.stall_shutdown();
  EXPECT_NE(why.find("'y'"), std::string::npos) << why;
  EXPECT_NE(why.find("ranks [1], which never submitted it"), std::string::npos) << why;
  EXPECT_NE(why.find("ready on ranks [0]"), std::string::npos) << why;
  EXPECT_TRUE(c.ComputeResponses().empty());  // nothing fails alone
}

TEST(Coordinator, StalledNameShutsTheJobDownAfterTheShutdownTime) {
  Coordinator c(3, 0, /*stall_seconds=*/0, /*stall_shutdown_seconds=*/0.001);
  c.AddRequests(0, {Allreduce("late", {2})});
  c.AddRequests(2, {Allreduce("late", {2})});
  c.CheckStalls(Clock::now());
  EXPECT_EQ(c.stall_shutdown(), "");  // checks run once a second
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  c.CheckStalls(Clock::now());
  const std::string why = c.stall_shutdown();
  EXPECT_NE(why.find("allreduce 'late'"), std::string::npos) << why;
  EXPECT_NE(why.find("ranks [1], which never submitted it"), std::string::npos) << why;
  EXPECT_NE(why.find("ready on ranks [0, 2]"), std::string::npos) << why;
  EXPECT_TRUE(c.ComputeResponses().empty());
  // The reason stays the first one.
  c.AddRequests(0, {Allreduce("later", {2})});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  c.CheckStalls(Clock::now());
  EXPECT_EQ(c.stall_shutdown(), why);
}

// A name's stall clock starts at its earliest announcement: a cached tensor's bit waited on the
// fast path before it came to the table.
TEST(Coordinator, StallClockStartsAtTheEarliestAnnouncement) {
  Coordinator c(2, 0, /*stall_seconds=*/0, /*stall_shutdown_seconds=*/2.5);
  c.AddRequests(0, {Allreduce("cached", {2})}, Clock::now() - std::chrono::seconds(3));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  c.CheckStalls(Clock::now());
  EXPECT_NE(c.stall_shutdown().find("'cached' waited 4 s"), std::string::npos)
      << c.stall_shutdown();
}

// The stall warnings: one line per set of missing ranks, naming the first names (oldest first)
// and how many more, not a line per tensor (a late rank's step of hundreds of gradients).
TEST(Coordinator, StallWarningsAreOneLinePerSetOfMissingRanks) {
  Coordinator c(3, 0, /*stall_seconds=*/0.001, /*stall_shutdown_seconds=*/0);
  for (int i = 0; i < 150; ++i) {  // rank 2 is late for 150 tensors
    const std::string name = "grad." + std::to_string(i);
    c.AddRequests(0, {Allreduce(name, {2})});
    c.AddRequests(1, {Allreduce(name, {2})});
  }
  c.AddRequests(2, {Allreduce("metric", {1})});  // and ranks 0, 1 for one
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(c.CheckStalls(Clock::now()), 151);
  const auto& lines = c.stall_warnings();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("stall: 150 tensors have waited up to 0 s ('grad.0', 'grad.1', "
                           "'grad.2', 'grad.3', 'grad.4' and 145 more); ready on ranks [0, 1], "
                           "missing on ranks [2]", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("stall: 'metric' has waited 0 s; ready on ranks [2], missing on "
                           "ranks [0, 1]", 0), 0u) << lines[1];
}

Request SetOp(const std::string& name, std::vector<int64_t> ranks, int32_t remove) {
  Request r;
  r.type = OpType::kProcessSet;
  r.name = name;
  r.splits = std::move(ranks);
  r.root = remove;
  return r;
}

// A process set added or removed by some ranks only: the stall messages say which call waits
// (its internal name's number counts such calls and reads like a set's id).
TEST(Coordinator, StallMessagesSayWhichProcessSetCallWaits) {
  auto set_op = SetOp;
  Coordinator c(4, 0, /*stall_seconds=*/0.001, /*stall_shutdown_seconds=*/0.002);
  c.AddRequests(3, {set_op("__hvd.process_set.0", {2, 3}, -1)});
  c.AddRequests(1, {set_op("__hvd.process_set.1", {}, 2)});
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(c.CheckStalls(Clock::now()), 2);
  const auto& lines = c.stall_warnings();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("stall: add_process_set([2, 3]) ('__hvd.process_set.0') has waited 0 "
                           "s; ready on ranks [3], missing on ranks [0, 1, 2]", 0),
            0u)
      << lines[0];
  EXPECT_EQ(lines[1].rfind("stall: remove_process_set(2) ('__hvd.process_set.1') has waited", 0),
            0u)
      << lines[1];
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  c.CheckStalls(Clock::now());
  EXPECT_EQ(c.stall_shutdown().rfind("hvd shut down: add_process_set([2, 3]) "
                                     "('__hvd.process_set.0') waited",
                                     0),
            0u)
      << c.stall_shutdown();
}

// Ranks that add different sets: every rank's error lists each rank's call, so that a rank
// whose list is not one of the first two that differ reads its own.
TEST(Coordinator, DifferentProcessSetsNameEveryRanksCall) {
  Coordinator c(4, 0, 0);
  const std::string n = "__hvd.process_set.0";
  c.AddRequests(0, {SetOp(n, {0, 1}, -1)});
  c.AddRequests(1, {SetOp(n, {0, 1}, -1)});
  c.AddRequests(2, {SetOp(n, {0, 2}, -1)});
  c.AddRequests(3, {SetOp(n, {1, 2, 3}, -1)});
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].type, OpType::kError);
  EXPECT_NE(rs[0].error.find("process set ranks [0, 1] vs [0, 2] (rank 0 vs rank 2); each "
                             "rank's call: [0, 1] on ranks [0, 1], [0, 2] on rank [2], "
                             "[1, 2, 3] on rank [3]"),
            std::string::npos)
      << rs[0].error;
  Coordinator d(2, 0, 0);
  d.AddRequests(0, {SetOp(n, {}, 1)});
  d.AddRequests(1, {SetOp(n, {}, 2)});
  rs = d.ComputeResponses();
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_NE(rs[0].error.find("each rank's call: remove set 1 on rank [0], remove set 2 on rank "
                             "[1]"),
            std::string::npos)
      << rs[0].error;
}

// As Horovod: a shutdown time below the stall check time shuts nothing down.
TEST(Coordinator, ShutdownTimeBelowTheCheckTimeIsOff) {
  EXPECT_EQ(StallShutdownSeconds(10, 3), 0);
  EXPECT_EQ(StallShutdownSeconds(2, 5), 5);
  EXPECT_EQ(StallShutdownSeconds(5, 5), 5);
  EXPECT_EQ(StallShutdownSeconds(0, 3), 3);
  EXPECT_EQ(StallShutdownSeconds(60, 0), 0);
  Coordinator c(2, 0, /*stall_seconds=*/30, /*stall_shutdown_seconds=*/0.001);
  c.AddRequests(0, {Allreduce("late", {2})});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  c.CheckStalls(Clock::now());
  EXPECT_EQ(c.stall_shutdown(), "");
}

// Device tensors: host against device memory is a mismatch; different GPUs on different ranks
// are not. The response carries the device kind (of the lowest rank) on the wire and in the
// cache, and never fuses host with device tensors.
TEST(Devices, MismatchFusionWireAndCache) {
  Coordinator c(3, 1 << 20, 0);
  for (int r = 0; r < 3; ++r) {
    Request g = Allreduce("g", {4});
    g.device = r;  // rank r on cuda:r
    Request h = Allreduce("h", {4});
    h.device = r == 2 ? kCpuDevice : 0;
    Request cpu = Allreduce("cpu", {4});
    c.AddRequests(r, {g, h, cpu});
  }
  auto rs = c.ComputeResponses();
  ASSERT_EQ(rs.size(), 3u);  // g and cpu do not fuse; h failed
  EXPECT_EQ(rs[0].type, OpType::kAllreduce);
  EXPECT_EQ(rs[0].names, std::vector<std::string>{"g"});
  EXPECT_EQ(rs[0].device, 0);
  EXPECT_EQ(rs[1].type, OpType::kError);
  EXPECT_NE(rs[1].error.find("device cuda:0 vs cpu (rank 0 vs rank 2)"), std::string::npos)
      << rs[1].error;
  EXPECT_EQ(rs[2].names, std::vector<std::string>{"cpu"});
  EXPECT_EQ(rs[2].device, kCpuDevice);

  ResponseList l;
  l.responses = {rs[0]};
  auto bytes = Encode(l);
  ResponseList out;
  ASSERT_TRUE(Decode(bytes.data(), bytes.size(), &out).ok());
  EXPECT_EQ(out.responses[0].device, 0);
  Response bad = rs[0];
  bad.device = -7;
  EXPECT_FALSE(CheckResponse(bad, 3).ok());

  // The cache keeps the kind: a rebuilt response stays on the device path, and a rank whose
  // own request is on another GPU still hits it.
  ResponseCache cache(8, true);
  cache.Apply({rs[0]});
  std::vector<uint32_t> bits;
  ASSERT_TRUE(cache.Encodable(rs[0], &bits));
  Response back;
  ASSERT_TRUE(cache.Rebuild(bits, &back));
  EXPECT_EQ(back.device, 0);
  Request mine = Allreduce("g", {4});
  mine.device = 2;
  EXPECT_EQ(cache.Lookup(mine), static_cast<int>(bits[0]));
  mine.device = kCpuDevice;
  EXPECT_EQ(cache.Lookup(mine), -1);
}

TEST(Fusion, RespectsThresholdAndCompatibility) {
  auto resp = [](const std::string& n, int64_t count, DataType t) {
    Response r;
    r.type = OpType::kAllreduce;
    r.names = {n};
    r.shapes = {{count}};
    r.dtype = t;
    return r;
  };
  std::vector<Response> in = {resp("a", 10, DataType::kFloat32), resp("b", 10, DataType::kFloat32),
                              resp("c", 10, DataType::kFloat64), resp("d", 20, DataType::kFloat32)};
  auto out = FuseResponses(in, 80);  // a+b = 80 bytes; d would exceed
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(out[1].names, std::vector<std::string>{"c"});
  EXPECT_EQ(out[2].names, std::vector<std::string>{"d"});
  EXPECT_EQ(FuseResponses(in, 0).size(), 4u);
  EXPECT_EQ(FuseResponses(in, 1 << 20).size(), 2u);
}

TEST(ResponseCache, InsertLookupEvictAndHistory) {
  ResponseCache c(2, /*keep_history=*/true);
  Request a = Allreduce("a", {1}), b = Allreduce("b", {2}), d = Allreduce("d", {3});
  EXPECT_EQ(c.Lookup(a), -1);
  c.Apply({ResponseFor(a), ResponseFor(b)});  // epoch 1
  EXPECT_EQ(c.epoch(), 1u);
  int bit_a = c.Lookup(a);
  ASSERT_GE(bit_a, 0);
  ASSERT_GE(c.Lookup(b), 0);
  EXPECT_EQ(c.Lookup(Allreduce("a", {7})), -1);  // same name, other shape: no hit
  c.Apply({ResponseFor(b)});                      // epoch 2: b used, a is least recent
  c.Apply({ResponseFor(d)});                      // epoch 3: d evicts a
  EXPECT_EQ(c.Lookup(a), -1);
  EXPECT_EQ(c.Lookup(d), bit_a);
  Request old;
  ASSERT_TRUE(c.Decode(static_cast<uint32_t>(bit_a), 2, &old));  // as a sender at epoch 2 meant it
  EXPECT_TRUE(SameRequest(old, a));
  ASSERT_TRUE(c.Decode(static_cast<uint32_t>(bit_a), 3, &old));
  EXPECT_TRUE(SameRequest(old, d));
  c.PruneHistory(3);
  ASSERT_TRUE(c.Decode(static_cast<uint32_t>(bit_a), 2, &old));
  EXPECT_TRUE(SameRequest(old, d));  // history gone: the current meaning
  EXPECT_FALSE(c.Decode(99, 3, &old));
}

// FirstEmpty judges bits a word at a time, without the slots (rank 0's word-at-a-time offer of
// a list's bits, MarkUsed): checked here against At() bit by bit, over inserts, a changed
// request and evictions, with single bits and whole words.
TEST(ResponseCache, FirstEmptyAgreesWithTheSlots) {
  ResponseCache c(70, /*keep_history=*/true);  // two words of bits
  auto check = [&c](uint32_t held) {
    for (uint32_t bit = 0; bit < 140; ++bit) {
      std::vector<uint64_t> one(bit / 64 + 1, 0);
      one[bit / 64] = uint64_t{1} << (bit % 64);
      EXPECT_EQ(c.At(bit) != nullptr, bit < held) << "bit " << bit;
      EXPECT_EQ(c.FirstEmpty(one), bit < held ? -1 : static_cast<int64_t>(bit)) << "bit " << bit;
    }
    const std::vector<uint64_t> all(3, ~uint64_t{0});
    EXPECT_EQ(c.FirstEmpty(all), static_cast<int64_t>(held));
    EXPECT_EQ(c.FirstEmpty({}), -1);
  };
  check(0);
  uint32_t n = 0;
  for (int round = 0; round < 7; ++round) {  // 10 new names a list: 70, every bit, in all
    std::vector<Response> list;
    for (int i = 0; i < 10; ++i, ++n) {
      list.push_back(ResponseFor(Allreduce("t" + std::to_string(n), {1})));
    }
    c.Apply(list);
    check(std::min<uint32_t>(n, 70));
  }
  c.Apply({ResponseFor(Allreduce("t3", {5}))});  // a changed request keeps its bit held
  check(70);
  for (int i = 0; i < 100; ++i) {
    c.Apply({ResponseFor(Allreduce("late" + std::to_string(i), {1}))});
  }
  check(70);  // evictions give bits other requests, never empty them
}

// A large capacity costs memory only as names come: the slots are made as bits are first
// taken. The largest capacity HVD_CACHE_CAPACITY allows, 4 Mi, with a few names.
TEST(ResponseCache, CapacityCostsNothingUntilNamesCome) {
  auto rss_kib = [] {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return 0L;
  };
  const long before = rss_kib();
  ResponseCache c(1 << 22, /*keep_history=*/true);
  std::vector<Response> list;
  for (int i = 0; i < 100; ++i) list.push_back(ResponseFor(Allreduce("n" + std::to_string(i), {1})));
  c.Apply(list);
  EXPECT_TRUE(c.enabled());
  EXPECT_GE(c.Lookup(Allreduce("n99", {1})), 0);
  EXPECT_EQ(c.At(100), nullptr);
  EXPECT_FALSE(c.UnchangedSince(1u << 21, c.epoch()));
  Request none;
  EXPECT_FALSE(c.Decode((1u << 22) - 1, c.epoch(), &none));
  EXPECT_LT(rss_kib() - before, 16 * 1024) << "KiB taken by a cache of 100 names";
}

TEST(ResponseCache, EncodeRebuildAndDisabled) {
  ResponseCache c(8, true);
  Request a = Allreduce("a", {4}), b = Allreduce("b", {5});
  Response fused = ResponseFor(a);
  fused.names.push_back("b");
  fused.shapes.push_back({5});
  std::vector<uint32_t> bits;
  EXPECT_FALSE(c.Encodable(fused, &bits));
  c.Apply({fused});
  ASSERT_TRUE(c.Encodable(fused, &bits));
  Response back;
  ASSERT_TRUE(c.Rebuild(bits, &back));
  EXPECT_EQ(back.names, fused.names);
  EXPECT_EQ(back.shapes, fused.shapes);
  Response with_joined = fused;
  with_joined.joined = {1};
  EXPECT_FALSE(c.Encodable(with_joined, &bits));

  // The fast path: every set bit's response, in bit order, fused within the threshold.
  std::vector<uint64_t> ready(1, 0);
  for (uint32_t bit : bits) ready[0] |= uint64_t{1} << bit;
  std::vector<Response> rebuilt;
  ASSERT_TRUE(c.RebuildAll(ready, 1 << 20, &rebuilt));
  ASSERT_EQ(rebuilt.size(), 1u);  // a and b fuse
  EXPECT_EQ(rebuilt[0].shapes, (std::vector<std::vector<int64_t>>{{4}, {5}}));
  EXPECT_EQ(c.SlotOf("a"), static_cast<int>(bits[0]));
  ASSERT_TRUE(c.RebuildAll(ready, 0, &rebuilt));  // fusion off: one response per bit
  EXPECT_EQ(rebuilt.size(), 2u);
  EXPECT_FALSE(c.RebuildAll({uint64_t{1} << 7}, 0, &rebuilt));  // an empty entry
  EXPECT_EQ(c.SlotOf("nothing"), -1);

  ResponseCache off(0, true);
  off.Apply({fused});
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.Lookup(a), -1);
  EXPECT_FALSE(off.Encodable(fused, &bits));
}

// A group's members are cached with their group (the coordinator's responses carry it, fused
// or not, on the wire and rebuilt from bits), so that the same grouped request is a hit and the
// member of another group, or of none, is not; and a set of bits keeps a group only whole.
TEST(ResponseCache, GroupsAreCachedWithTheirGroupAndKeptWhole) {
  Coordinator co(2, 0, 0);
  for (int r = 0; r < 2; ++r) {
    co.AddRequests(r, {Grouped("a", {2}, 3, "G"), Grouped("b", {3}, 3, "G"),
                       Grouped("c", {1}, 3, "G"), Allreduce("d", {4})});
  }
  std::vector<Response> rs = FuseResponses(co.ComputeResponses(), 1 << 20);
  ASSERT_EQ(rs.size(), 1u);  // a, b, c and d fuse; the groups stay parallel to the names
  EXPECT_EQ(rs[0].names, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(rs[0].groups, (std::vector<std::string>{"G", "G", "G", ""}));
  EXPECT_EQ(rs[0].group_sizes, (std::vector<int32_t>{3, 3, 3, 0}));
  ASSERT_TRUE(CheckResponse(rs[0], 2).ok());
  ResponseList l;
  l.responses = rs;
  auto bytes = Encode(l);
  ResponseList out;
  ASSERT_TRUE(Decode(bytes.data(), bytes.size(), &out).ok());
  EXPECT_EQ(out.responses[0].groups, rs[0].groups);
  EXPECT_EQ(out.responses[0].group_sizes, rs[0].group_sizes);

  ResponseCache cache(8, true);
  cache.Apply(rs);
  const int a = cache.Lookup(Grouped("a", {2}, 3, "G"));
  const int b = cache.Lookup(Grouped("b", {3}, 3, "G"));
  const int c = cache.Lookup(Grouped("c", {1}, 3, "G"));
  const int d = cache.Lookup(Allreduce("d", {4}));
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_GE(c, 0);
  ASSERT_GE(d, 0);
  EXPECT_EQ(cache.Lookup(Allreduce("a", {2})), -1);              // not grouped
  EXPECT_EQ(cache.Lookup(Grouped("a", {2}, 3, "H")), -1);       // another group
  EXPECT_EQ(cache.Lookup(Grouped("a", {2}, 2, "G")), -1);       // another size
  auto bits_of = [](std::initializer_list<int> set) {
    std::vector<uint64_t> v(1, 0);
    for (int bit : set) v[0] |= uint64_t{1} << bit;
    return v;
  };
  std::vector<uint64_t> some = bits_of({a, b, d});
  cache.CloseGroups(&some);
  EXPECT_EQ(some, bits_of({d}));  // c is missing: a and b wait with it
  std::vector<uint64_t> all = bits_of({a, b, c, d});
  cache.CloseGroups(&all);
  EXPECT_EQ(all, bits_of({a, b, c, d}));

  // Sent as bits and rebuilt, the response is the same, groups included: applying it changes
  // nothing.
  std::vector<uint32_t> bits;
  ASSERT_TRUE(cache.Encodable(rs[0], &bits));
  Response back;
  ASSERT_TRUE(cache.Rebuild(bits, &back));
  EXPECT_EQ(back.groups, rs[0].groups);
  EXPECT_EQ(back.group_sizes, rs[0].group_sizes);
  const uint64_t contents = cache.contents();
  cache.Apply({back});
  EXPECT_EQ(cache.contents(), contents);

  // The same names in no group: the entries change and the old grouped requests miss.
  cache.Apply({ResponseFor(Allreduce("a", {2}))});
  EXPECT_EQ(cache.Lookup(Grouped("a", {2}, 3, "G")), -1);
  EXPECT_GE(cache.Lookup(Allreduce("a", {2})), 0);

  // Groups must be parallel to the names, and a size goes with a key.
  Response bad = rs[0];
  bad.groups.pop_back();
  EXPECT_FALSE(CheckResponse(bad, 2).ok());
  bad = rs[0];
  bad.group_sizes[3] = 2;
  EXPECT_FALSE(CheckResponse(bad, 2).ok());
}

void ExpectRebuiltAs(const std::vector<Response>& got, const std::vector<Response>& want,
                     int trial) {
  ASSERT_EQ(got.size(), want.size()) << "trial " << trial;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].type, want[i].type);
    EXPECT_EQ(got[i].root, want[i].root);
    EXPECT_EQ(got[i].names, want[i].names);
    EXPECT_EQ(got[i].shapes, want[i].shapes);
    EXPECT_EQ(got[i].dtype, want[i].dtype);
    EXPECT_EQ(got[i].op, want[i].op);
    EXPECT_TRUE(got[i].error.empty());
    EXPECT_TRUE(got[i].from_cache);
  }
}

// The fast path builds its fused responses without one per tensor: they must be what fusing
// one response per bit gives, over mixed dtypes, ops, broadcasts, thresholds and bit sets.
TEST(ResponseCache, RebuildAllFusesAsFuseResponsesDoes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    ResponseCache c(64, true);
    std::vector<Response> applied;
    for (int i = 0; i < 40; ++i) {
      Request q = Allreduce("t" + std::to_string(i), {static_cast<int64_t>(rng() % 9)},
                            rng() % 3 ? DataType::kFloat32 : DataType::kFloat64);
      if (rng() % 5 == 0) q.op = ReduceOp::kMax;
      if (rng() % 7 == 0) {
        q.type = OpType::kBroadcast;
        q.root = 0;
      }
      applied.push_back(ResponseFor(q));
      applied.back().root = q.root;
    }
    c.Apply(applied);
    std::vector<uint64_t> ready(1, 0);
    std::vector<Response> one_per_bit;
    for (uint32_t bit = 0; bit < 40; ++bit) {
      if (rng() % 2) continue;
      ready[0] |= uint64_t{1} << bit;
      Response r;
      ASSERT_TRUE(c.Rebuild({bit}, &r));
      one_per_bit.push_back(r);
    }
    const size_t threshold = std::vector<size_t>{0, 16, 40, 100, 1 << 20}[trial % 5];
    std::vector<Response> rebuilt;
    ASSERT_TRUE(c.RebuildAll(ready, threshold, &rebuilt));
    const std::vector<Response> want = FuseResponses(one_per_bit, threshold);
    ExpectRebuiltAs(rebuilt, want, trial);
    // The same written over spare responses (executed ones: other tensors' names and shapes,
    // more or fewer than this step's): their storage is reused and nothing of theirs is left.
    std::vector<Response> spare(rng() % 4);
    for (auto& old : spare) {
      for (size_t k = rng() % 60; k > 0; --k) {
        old.names.push_back("an executed tensor's name, long enough to allocate " +
                            std::to_string(k));
        old.shapes.push_back({7, 7, static_cast<int64_t>(k)});
      }
      old.type = OpType::kBroadcast;
      old.root = 5;
      old.error = "stale";
    }
    std::set<const char*> stock;  // the spare names' storage
    for (const auto& old : spare) {
      for (const auto& name : old.names) stock.insert(name.data());
    }
    std::vector<Response> over;
    ASSERT_TRUE(c.RebuildAll(ready, threshold, &over, &spare));
    ExpectRebuiltAs(over, want, trial);
    size_t tensors = 0, reused = 0, left = 0;
    for (const auto& r : over) {
      tensors += r.names.size();
      for (const auto& name : r.names) reused += stock.count(name.data());
    }
    for (const auto& old : spare) left += old.names.size();
    EXPECT_EQ(reused, std::min(stock.size(), tensors)) << "trial " << trial;
    EXPECT_EQ(left, stock.size() - reused) << "trial " << trial;
  }
}

// RebuildAll marks its tensors used (Apply then leaves them alone): the entry it rebuilt is not
// the one a new name evicts, and applying its responses changes nothing but the epoch.
TEST(ResponseCache, RebuildAllMarksItsTensorsUsed) {
  ResponseCache c(2, true);
  Request a = Allreduce("a", {4}), b = Allreduce("b", {4});
  c.Apply({ResponseFor(a)});
  c.Apply({ResponseFor(b)});  // a is now the least recently used
  const int bit_a = c.Lookup(a);
  ASSERT_GE(bit_a, 0);
  std::vector<Response> rebuilt;
  ASSERT_TRUE(c.RebuildAll({uint64_t{1} << bit_a}, 1 << 20, &rebuilt));
  const uint64_t epoch = c.epoch();
  c.Apply(rebuilt);
  EXPECT_EQ(c.epoch(), epoch + 1);
  c.Apply({ResponseFor(Allreduce("new", {4}))});  // evicts b, the least recently used now
  EXPECT_EQ(c.Lookup(a), bit_a);
  EXPECT_EQ(c.Lookup(b), -1);
  EXPECT_GE(c.SlotOf("new"), 0);
}

// MarkUsed leaves the least-recently-used order as RebuildAll of the same bits does: the next
// insertion evicts the same tensor from both caches.
TEST(ResponseCache, MarkUsedOrdersEvictionsAsRebuildAllDoes) {
  for (int which = 0; which < 2; ++which) {
    ResponseCache rebuilt(3, false), marked(3, false);
    std::vector<Request> q = {Allreduce("a", {4}), Allreduce("b", {4}), Allreduce("c", {4})};
    for (auto* c : {&rebuilt, &marked}) {
      for (const auto& r : q) c->Apply({ResponseFor(r)});  // a is the least recently used
    }
    // Use a and c (b is then the oldest), or c alone (a is).
    const int a = rebuilt.Lookup(q[0]), c = rebuilt.Lookup(q[2]);
    std::vector<uint64_t> bits = {uint64_t{1} << c};
    if (which == 0) bits[0] |= uint64_t{1} << a;
    std::vector<Response> out;
    ASSERT_TRUE(rebuilt.RebuildAll(bits, 1 << 20, &out));
    ASSERT_TRUE(marked.MarkUsed(bits));
    const uint64_t contents = marked.contents();
    for (auto* cache : {&rebuilt, &marked}) cache->Apply({ResponseFor(Allreduce("new", {4}))});
    EXPECT_NE(marked.contents(), contents);  // a bit was given to "new"
    for (const auto& r : q) EXPECT_EQ(rebuilt.Lookup(r), marked.Lookup(r)) << r.name;
    EXPECT_EQ(marked.Lookup(q[which == 0 ? 1 : 0]), -1);
    EXPECT_GE(marked.Lookup(q[which == 0 ? 0 : 1]), 0);
    EXPECT_GE(marked.Lookup(q[2]), 0);
  }
  ResponseCache c(2, false);
  c.Apply({ResponseFor(Allreduce("a", {4}))});
  EXPECT_FALSE(c.MarkUsed({uint64_t{1} << 1}));  // an empty bit
  EXPECT_FALSE(c.MarkUsed({0, 1}));              // beyond the cache
}

// Eviction takes the least recently used entry, as a list kept in order of use says (a
// reference written here: a name moves to the back when used or inserted, the front one
// goes), over random steps of uses (Apply of cached names, RebuildAll, MarkUsed), changed
// shapes and new names, at capacities 1, 2, 7 and 64.
TEST(ResponseCache, EvictsTheLeastRecentlyUsedAsAListInOrderOfUseDoes) {
  for (uint32_t capacity : {1u, 2u, 7u, 64u}) {
    ResponseCache c(static_cast<int>(capacity), true);
    std::list<std::string> order;  // least recently used first
    auto use = [&order](const std::string& name) {
      order.remove(name);
      order.push_back(name);
    };
    std::mt19937 rng(capacity);
    int fresh = 0;
    for (int step = 0; step < 2000; ++step) {
      const int what = static_cast<int>(rng() % 4);
      if (what == 0 || order.empty()) {  // a new name
        const std::string name = "n" + std::to_string(fresh++);
        std::string gone;
        if (order.size() == capacity) {
          gone = order.front();
          order.pop_front();
        }
        use(name);
        c.Apply({ResponseFor(Allreduce(name, {4}))});
        ASSERT_GE(c.SlotOf(name), 0);
        if (!gone.empty()) ASSERT_EQ(c.SlotOf(gone), -1) << gone << " stayed at step " << step;
        continue;
      }
      auto it = order.begin();
      std::advance(it, rng() % order.size());
      const std::string name = *it;
      const int bit = c.SlotOf(name);
      ASSERT_GE(bit, 0) << name << " at step " << step;
      const Request* held = c.At(static_cast<uint32_t>(bit));
      ASSERT_NE(held, nullptr);
      const Request now = *held;
      use(name);
      std::vector<uint64_t> bits(bit / 64 + 1, 0);
      bits[bit / 64] = uint64_t{1} << (bit % 64);
      if (what == 1) {
        c.Apply({ResponseFor(now)});
      } else if (what == 2) {
        std::vector<Response> out;
        ASSERT_TRUE(c.RebuildAll(bits, 1 << 20, &out));
        c.Apply(out);
      } else if (rng() % 2) {
        ASSERT_TRUE(c.MarkUsed(bits));
      } else {  // the same name, another shape: its bit, used
        c.Apply({ResponseFor(Allreduce(name, {static_cast<int64_t>(5 + step)}))});
      }
    }
    for (const auto& name : order) EXPECT_GE(c.SlotOf(name), 0) << name;
    EXPECT_EQ(order.size(), std::min<size_t>(capacity, static_cast<size_t>(fresh)));
    EXPECT_EQ(c.slots(), order.size());
  }
}

// contents() changes exactly when a bit is given a request, to a number no cache had before;
// using, rebuilding and applying what is cached already leaves it.
TEST(ResponseCache, ContentsChangeOnlyWhenABitIsGivenARequest) {
  ResponseCache c(2, true), other(2, true);
  EXPECT_NE(c.contents(), 0u);
  EXPECT_NE(c.contents(), other.contents());
  std::vector<uint64_t> seen = {c.contents(), other.contents()};
  auto fresh = [&seen](uint64_t v) {
    const bool is_new = std::find(seen.begin(), seen.end(), v) == seen.end();
    seen.push_back(v);
    return is_new;
  };
  Request a = Allreduce("a", {4}), b = Allreduce("b", {4});
  c.Apply({ResponseFor(a)});  // a new name
  EXPECT_TRUE(fresh(c.contents()));
  uint64_t now = c.contents();
  c.Apply({ResponseFor(a)});  // the same request again: only used
  EXPECT_EQ(c.contents(), now);
  std::vector<Response> out;
  ASSERT_TRUE(c.RebuildAll({uint64_t{1} << c.Lookup(a)}, 1 << 20, &out));
  c.Apply(out);
  ASSERT_TRUE(c.MarkUsed({uint64_t{1} << c.Lookup(a)}));
  EXPECT_EQ(c.contents(), now);
  c.Apply({ResponseFor(Allreduce("a", {5}))});  // the tensor changed under its name
  EXPECT_TRUE(fresh(c.contents()));
  c.Apply({ResponseFor(b)});
  EXPECT_TRUE(fresh(c.contents()));
  c.Apply({ResponseFor(Allreduce("c", {4}))});  // full: evicts
  EXPECT_TRUE(fresh(c.contents()));
  other.Apply({ResponseFor(a)});  // another cache's change is new too
  EXPECT_TRUE(fresh(other.contents()));
}

// A lookup with a hint (where the name was found last time) gives what a lookup by name gives,
// whatever happened to the hinted bit since: still the name's, its shape changed, evicted and
// given to another name, or a hint out of range.
TEST(ResponseCache, HintedLookupAgreesWithLookupByName) {
  ResponseCache c(2, true);
  Request a = Allreduce("a", {4}), b = Allreduce("b", {4});
  c.Apply({ResponseFor(a), ResponseFor(b)});
  const int bit_a = c.Lookup(a), bit_b = c.Lookup(b);
  uint32_t hint = 0;  // unknown: found by name, and remembered
  EXPECT_EQ(c.Lookup(a, &hint), bit_a);
  EXPECT_EQ(hint, static_cast<uint32_t>(bit_a) + 1);
  EXPECT_EQ(c.Lookup(a, &hint), bit_a);  // through the hint
  hint = static_cast<uint32_t>(bit_b) + 1;  // a wrong hint: b's bit
  EXPECT_EQ(c.Lookup(a, &hint), bit_a);
  EXPECT_EQ(hint, static_cast<uint32_t>(bit_a) + 1);
  hint = 1000;  // beyond the cache
  EXPECT_EQ(c.Lookup(a, &hint), bit_a);
  Request a5 = Allreduce("a", {5});  // same name, another shape: no hit, though the bit is a's
  hint = static_cast<uint32_t>(bit_a) + 1;
  EXPECT_EQ(c.Lookup(a5, &hint), -1);
  EXPECT_EQ(hint, 0u);
  hint = static_cast<uint32_t>(bit_a) + 1;
  c.Apply({ResponseFor(b)});
  c.Apply({ResponseFor(Allreduce("d", {4}))});  // d evicts a and takes its bit
  EXPECT_EQ(c.SlotOf("d"), bit_a);
  EXPECT_EQ(c.Lookup(a, &hint), -1);
  EXPECT_EQ(hint, 0u);
  Request d = Allreduce("d", {4});
  hint = static_cast<uint32_t>(bit_b) + 1;
  EXPECT_EQ(c.Lookup(d, &hint), bit_a);
}

// Each response RebuildAll builds names the bit of each of its tensors, over spare responses
// too (whose bits of another step must not stay).
TEST(ResponseCache, RebuildAllGivesEachTensorsBit) {
  ResponseCache c(16, true);
  std::vector<Response> applied;
  for (int i = 0; i < 10; ++i) {
    applied.push_back(ResponseFor(Allreduce("t" + std::to_string(i), {i + 1},
                                            i % 3 ? DataType::kFloat32 : DataType::kFloat64)));
  }
  c.Apply(applied);
  const std::vector<uint64_t> ready{0b1011011110};
  for (int with_spare = 0; with_spare < 2; ++with_spare) {
    std::vector<Response> spare(2), rebuilt;
    for (auto& s : spare) {
      s.names = {"x", "y", "z"};
      s.shapes = {{1}, {1}, {1}};
      s.bits = {9, 9, 9};
    }
    ASSERT_TRUE(c.RebuildAll(ready, 1 << 20, &rebuilt, with_spare ? &spare : nullptr));
    ASSERT_GE(rebuilt.size(), 2u);  // float32 and float64 do not fuse
    size_t tensors = 0;
    for (const auto& r : rebuilt) {
      ASSERT_EQ(r.bits.size(), r.names.size());
      for (size_t i = 0; i < r.names.size(); ++i) {
        EXPECT_EQ(c.SlotOf(r.names[i]), static_cast<int>(r.bits[i])) << r.names[i];
        EXPECT_TRUE(ready[0] >> r.bits[i] & 1);
      }
      tensors += r.names.size();
    }
    EXPECT_EQ(tensors, 7u);
  }
}

// What rank 0 needs of a list it applies: which bits changed meaning, with what they meant, and
// whether a bit announced at an older epoch still means the same.
TEST(ResponseCache, ReportsChangedBitsAndWhatIsUnchangedSinceAnEpoch) {
  ResponseCache c(2, true);
  Request a = Allreduce("a", {4}), b = Allreduce("b", {4});
  std::vector<std::pair<uint32_t, Request>> changed;
  c.Apply({ResponseFor(a), ResponseFor(b)}, &changed);  // epoch 1: inserts only
  EXPECT_TRUE(changed.empty());
  const uint32_t bit_a = static_cast<uint32_t>(c.Lookup(a));
  const uint32_t bit_b = static_cast<uint32_t>(c.Lookup(b));
  EXPECT_FALSE(c.UnchangedSince(bit_a, 0));  // empty at epoch 0
  EXPECT_TRUE(c.UnchangedSince(bit_a, 1));
  c.Apply({ResponseFor(b)}, &changed);  // epoch 2: b used, nothing changes
  EXPECT_TRUE(changed.empty());
  EXPECT_TRUE(c.UnchangedSince(bit_a, 1));
  Request a5 = Allreduce("a", {5});
  c.Apply({ResponseFor(a5)}, &changed);  // epoch 3: a's shape changes in place
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].first, bit_a);
  EXPECT_EQ(changed[0].second.shape, (std::vector<int64_t>{4}));
  EXPECT_FALSE(c.UnchangedSince(bit_a, 2));
  EXPECT_TRUE(c.UnchangedSince(bit_a, 3));
  EXPECT_TRUE(c.UnchangedSince(bit_b, 2));
  changed.clear();
  c.Apply({ResponseFor(Allreduce("d", {1}))}, &changed);  // epoch 4: d evicts b
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].first, bit_b);
  EXPECT_EQ(changed[0].second.name, "b");
  EXPECT_FALSE(c.UnchangedSince(bit_b, 3));
}

// Many names negotiated for the first time come out in announcement order, each once.
TEST(Coordinator, ManyFirstTimeNamesKeepTheirOrder) {
  Coordinator c(2, 0, 0, 0);
  const int n = 20000;
  std::vector<Request> all;
  for (int i = 0; i < n; ++i) all.push_back(Allreduce("t" + std::to_string(i), {1}));
  c.AddRequests(1, all);
  EXPECT_EQ(c.PendingNames().size(), static_cast<size_t>(n));
  std::vector<Request> reversed(all.rbegin(), all.rend());
  c.AddRequests(0, reversed);  // each completes as rank 0 announces it
  std::vector<Response> out = c.ComputeResponses();
  ASSERT_EQ(out.size(), static_cast<size_t>(n));  // fusion off
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i].names[0], "t" + std::to_string(n - 1 - i));
  EXPECT_TRUE(c.PendingNames().empty());
}

// The engine's tables of in-flight names: nodes are reused when a name recurs, a live name is
// not inserted twice, and free nodes of names that never recur are swept.
TEST(NameTable, ReusesNodesRefusesLiveDuplicatesAndSweeps) {
  NameTable<std::string> t;
  std::string key = "grad.0";
  auto* n = t.Insert(key, std::string("first"));
  ASSERT_NE(n, nullptr);
  key = "changed";  // the table keeps its own copy of the name
  EXPECT_EQ(t.Find("grad.0"), n);
  EXPECT_EQ(t.Insert("grad.0", std::string("second")), nullptr);
  EXPECT_EQ(n->value, "first");
  t.Release(n);
  EXPECT_EQ(t.Find("grad.0"), nullptr);
  auto* again = t.Insert("grad.0", std::string("third"));
  EXPECT_EQ(again, n);  // the same node
  EXPECT_EQ(again->value, "third");
  EXPECT_EQ(t.live(), 1u);
  // 100,000 names that never recur: the table stays bounded, the live one stays.
  for (int i = 0; i < 100000; ++i) {
    const std::string name = "once." + std::to_string(i);
    auto* m = t.Insert(name, std::string("x"));
    ASSERT_NE(m, nullptr);
    t.Release(name);
  }
  EXPECT_EQ(t.live(), 1u);
  EXPECT_EQ(t.Find("grad.0"), again);
  EXPECT_EQ(again->value, "third");
  EXPECT_GT(t.erasures(), 0u);  // sweeps happened: pointers to free nodes may dangle
  // A node's hint outlives its value: it is the owner's, across the name's uses.
  again->hint = 42;
  t.Release(again);
  EXPECT_EQ(t.Insert("grad.0", std::string("fourth")), again);
  EXPECT_EQ(again->hint, 42u);
  const uint64_t erasures = t.erasures();
  t.Release(again);
  EXPECT_EQ(t.erasures(), erasures);  // one free node is not swept
  again = t.Insert("grad.0", std::string("third"));
  // A step of 10,000 names, all ending before the next step starts them again: every step
  // reuses the same nodes (none swept, so no key is built and no pointer to a node dangles).
  std::vector<NameTable<std::string>::Node*> first;
  for (int step = 0; step < 3; ++step) {
    std::vector<NameTable<std::string>::Node*> nodes;
    for (int i = 0; i < 10000; ++i) {
      nodes.push_back(t.Insert("step." + std::to_string(i), std::string("v")));
      ASSERT_NE(nodes.back(), nullptr);
    }
    const uint64_t erasures = t.erasures();
    for (auto* node : nodes) t.Release(node);
    EXPECT_EQ(t.erasures(), erasures) << "step " << step;
    if (step == 0) first = nodes;
    EXPECT_EQ(nodes, first) << "step " << step;
  }
  // Then names that never recur: a sweep comes, and takes the step's free nodes too.
  const uint64_t before = t.erasures();
  for (int i = 0; i < 30000; ++i) {
    const std::string name = "later." + std::to_string(i);
    ASSERT_NE(t.Insert(name, std::string("x")), nullptr);
    t.Release(name);
  }
  EXPECT_GT(t.erasures(), before);
  EXPECT_EQ(t.Find("grad.0"), again);
  int live = 0;
  t.ReleaseIf([&](std::string& v) {
    ++live;
    return v == "third";
  });
  EXPECT_EQ(live, 1);
  EXPECT_EQ(t.live(), 0u);
}

// Insert predicts the step's order: once a sequence of names has been inserted, the same
// sequence again finds each node without hashing the key (hashes() does not move); any other
// order, a live duplicate met through the prediction, and predictions into swept nodes still
// give the right node or null.
TEST(NameTable, PredictsTheStepOrderWithoutHashing) {
  NameTable<int> t;
  const int n = 50;
  std::vector<NameTable<int>::Node*> first(n);
  for (int step = 0; step < 3; ++step) {
    const uint64_t hashes_before = t.hashes();
    for (int i = 0; i < n; ++i) {
      auto* node = t.Insert("g." + std::to_string(i), step * 100 + i);
      ASSERT_NE(node, nullptr);
      if (step == 0) first[i] = node;
      EXPECT_EQ(node, first[i]) << "step " << step << " tensor " << i;
      EXPECT_EQ(node->value, step * 100 + i);
    }
    const uint64_t hashed = t.hashes() - hashes_before;
    // The first step hashes every name. In the second the first name is hashed (the first
    // step's last name had no successor yet), and it learns that successor; from the third
    // step on no name is.
    if (step == 0) EXPECT_EQ(hashed, static_cast<uint64_t>(n));
    if (step == 1) EXPECT_EQ(hashed, 1u);
    if (step == 2) EXPECT_EQ(hashed, 0u);
    for (auto* node : first) t.Release(node);
  }
  // A live name met through the prediction is refused, as through the index.
  ASSERT_NE(t.Insert("g.0", 0), nullptr);
  ASSERT_NE(t.Insert("g.1", 1), nullptr);
  t.Release("g.1");
  t.Release("g.0");
  ASSERT_NE(t.Insert("g.0", 0), nullptr);
  ASSERT_NE(t.Insert("g.1", 1), nullptr);  // live now
  EXPECT_EQ(t.Insert("g.0", 7), nullptr);
  EXPECT_EQ(t.Insert("g.1", 7), nullptr);
  EXPECT_EQ(t.Find("g.1")->value, 1);
  // Reversed order: every prediction misses, every node is still the name's.
  t.Release("g.0");
  t.Release("g.1");
  for (int i = n - 1; i >= 0; --i) {
    const uint64_t hashes_before = t.hashes();
    auto* node = t.Insert("g." + std::to_string(i), int{i});
    EXPECT_EQ(node, first[i]);
    EXPECT_EQ(t.hashes(), hashes_before + 1);
  }
  for (auto* node : first) t.Release(node);
  // Names that never recur sweep the free nodes: the predictions into them are dropped.
  for (int i = 0; i < 20000; ++i) {
    const std::string name = "once." + std::to_string(i);
    ASSERT_NE(t.Insert(name, 1), nullptr);
    t.Release(name);
  }
  for (int i = 0; i < n; ++i) {
    auto* node = t.Insert("g." + std::to_string(i), int{i});
    ASSERT_NE(node, nullptr);
    EXPECT_EQ(t.Find("g." + std::to_string(i)), node);
    EXPECT_EQ(node->value, i);
  }
  EXPECT_EQ(t.live(), static_cast<size_t>(n));
}

// Autotune: warm-up samples keep the starting setting; then the cycle times are sampled twice
// each at the starting threshold, then the thresholds twice each at the best cycle (a sample's
// score: the bytes after its first list over its time); the best stays. The log has a line per
// scored sample and the choice.
TEST(Autotune, SearchesCycleThenThresholdAndKeepsTheBest) {
  const std::string log = ::testing::TempDir() + "/hvd_autotune_test.csv";
  const Autotuner::Setting start{64u << 20, 0.0};
  Autotuner tuner(start, /*warmup_samples=*/2, /*steps_per_sample=*/4, log);
  ASSERT_EQ(3u, tuner.candidates().size());  // cycles 0 (the start's), 1 and 5 ms
  EXPECT_EQ(tuner.candidates()[0].fusion_bytes, start.fusion_bytes);
  // The throughput the "job" gives each setting: best at 16 MiB with a 1 ms cycle.
  auto speed = [](const Autotuner::Setting& s) {
    double v = 100.0;
    if (s.fusion_bytes == (16u << 20)) v += 50;
    if (s.cycle_ms == 1.0) v += 20;
    return v;
  };
  Clock::time_point now = Clock::now();
  int scored_samples = 0;
  for (int list = 0; list < 1000 && !tuner.done(); ++list) {
    const Autotuner::Setting s = tuner.current();
    if (list >= 2 * 4 && list % 4 == 0) ++scored_samples;
    if (list < 2 * 4) EXPECT_EQ(s.fusion_bytes, start.fusion_bytes);
    if (tuner.phase() == 0) EXPECT_EQ(s.fusion_bytes, start.fusion_bytes) << list;
    if (tuner.phase() == 1) EXPECT_EQ(s.cycle_ms, 1.0) << list;  // phase 1's winner
    // 1000 bytes per list; a list takes 1000 / speed seconds.
    now += std::chrono::microseconds(static_cast<int64_t>(1e6 * 1000 / speed(s)));
    tuner.Record(1000, now);
  }
  ASSERT_TRUE(tuner.done());
  EXPECT_EQ(5u, tuner.candidates().size());  // 64 MiB (the start's), 1, 4, 16, 128 MiB
  EXPECT_EQ(scored_samples, 2 * (3 + 5));
  EXPECT_EQ(tuner.current().fusion_bytes, 16u << 20);
  EXPECT_EQ(tuner.current().cycle_ms, 1.0);
  std::FILE* f = std::fopen(log.c_str(), "r");
  ASSERT_NE(f, nullptr);
  int lines = 0;
  char buf[256];
  std::string last;
  while (std::fgets(buf, sizeof(buf), f)) {
    ++lines;
    last = buf;
  }
  std::fclose(f);
  EXPECT_EQ(lines, 2 * (3 + 5) + 2);  // header, samples, choice
  EXPECT_EQ(last.rfind("best,16777216,1,", 0), 0u) << last;
}

// Where the job allows them, the hierarchical choice and then the flat algorithms' threshold
// are tuned after the cycle and the fusion threshold, each from the best so far.
TEST(Autotune, ThenTunesTheHierarchicalChoiceAndTheAlgorithmThreshold) {
  const std::string log = ::testing::TempDir() + "/hvd_autotune_plan_test.csv";
  Autotuner::Setting start;
  start.fusion_bytes = 64u << 20;
  Autotuner::Scope scope;
  scope.hierarchical = true;
  scope.algorithm = true;
  Autotuner tuner(start, /*warmup_samples=*/0, /*steps_per_sample=*/2, log, scope);
  // Best: 4 MiB, no cycle, hierarchical off, recursive doubling up to 256 KiB.
  auto speed = [](const Autotuner::Setting& s) {
    double v = 100.0;
    if (s.fusion_bytes == (4u << 20)) v += 40;
    if (s.cycle_ms == 0.0) v += 10;
    if (s.knobs.hierarchical_allreduce == 2) v += 30;
    if (s.knobs.small_allreduce_bytes == (256u << 10)) v += 20;
    return v;
  };
  Clock::time_point now = Clock::now();
  std::vector<int> phases_seen;
  for (int list = 0; list < 2000 && !tuner.done(); ++list) {
    const Autotuner::Setting s = tuner.current();
    if (phases_seen.empty() || phases_seen.back() != tuner.phase()) {
      phases_seen.push_back(tuner.phase());
    }
    if (tuner.phase() == 2) {  // from the best of phases 1 and 2
      EXPECT_EQ(s.fusion_bytes, 4u << 20);
      EXPECT_EQ(s.knobs.small_allreduce_bytes, 64u << 10);
    }
    if (tuner.phase() == 3) EXPECT_EQ(s.knobs.hierarchical_allreduce, 2);
    now += std::chrono::microseconds(static_cast<int64_t>(1e6 * 1000 / speed(s)));
    tuner.Record(1000, now);
  }
  ASSERT_TRUE(tuner.done());
  EXPECT_EQ(phases_seen, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(tuner.current().fusion_bytes, 4u << 20);
  EXPECT_EQ(tuner.current().cycle_ms, 0.0);
  EXPECT_EQ(tuner.current().knobs.hierarchical_allreduce, 2);
  EXPECT_EQ(tuner.current().knobs.small_allreduce_bytes, 256u << 10);
  EXPECT_EQ(tuner.candidates().size(), 5u);  // 64 KiB (the best so far), 0, 16 KiB, 256 KiB, 1 MiB
  std::FILE* f = std::fopen(log.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[256];
  std::string first, last;
  while (std::fgets(buf, sizeof(buf), f)) {
    if (first.empty()) first = buf;
    last = buf;
  }
  std::fclose(f);
  EXPECT_NE(first.find("hierarchical_allreduce,small_allreduce_bytes"), std::string::npos);
  EXPECT_EQ(last.rfind("best,4194304,0,off,262144,", 0), 0u) << last;

  // Without them (shared memory moves every byte; the job forced hierarchical), the search ends
  // after the fusion threshold, as before.
  Autotuner plain(start, 0, 2, "", Autotuner::Scope());
  for (int list = 0; list < 2000 && !plain.done(); ++list) {
    EXPECT_LE(plain.phase(), 1);
    now += std::chrono::microseconds(10);
    plain.Record(1000, now);
  }
  EXPECT_TRUE(plain.done());
}

// As in Horovod, a knob the job set is held constant: its phase is left out and the others
// tune around its value; with nothing left to tune the tuner is done at once.
TEST(Autotune, HoldsTheKnobsTheJobSet) {
  Autotuner::Setting start;
  start.fusion_bytes = 1u << 20;
  start.cycle_ms = 2.0;
  Autotuner::Scope fixed_cycle;
  fixed_cycle.cycle = false;
  Autotuner tuner(start, /*warmup_samples=*/1, /*steps_per_sample=*/2, "", fixed_cycle);
  ASSERT_TRUE(tuner.tunes_anything());
  EXPECT_EQ(tuner.phase(), 1);
  Clock::time_point now = Clock::now();
  for (int list = 0; list < 2000 && !tuner.done(); ++list) {
    EXPECT_EQ(tuner.phase(), 1);
    EXPECT_EQ(tuner.current().cycle_ms, 2.0) << list;
    const bool best = tuner.current().fusion_bytes == (16u << 20);
    now += std::chrono::microseconds(best ? 5 : 10);
    tuner.Record(1000, now);
  }
  ASSERT_TRUE(tuner.done());
  EXPECT_EQ(tuner.current().fusion_bytes, 16u << 20);
  EXPECT_EQ(tuner.current().cycle_ms, 2.0);

  Autotuner::Scope fixed_fusion;
  fixed_fusion.fusion = false;
  Autotuner cycles(start, 0, 2, "", fixed_fusion);
  for (int list = 0; list < 2000 && !cycles.done(); ++list) {
    EXPECT_EQ(cycles.phase(), 0);
    EXPECT_EQ(cycles.current().fusion_bytes, 1u << 20) << list;
    now += std::chrono::microseconds(cycles.current().cycle_ms == 5.0 ? 5 : 10);
    cycles.Record(1000, now);
  }
  ASSERT_TRUE(cycles.done());
  EXPECT_EQ(cycles.current().cycle_ms, 5.0);
  EXPECT_EQ(cycles.current().fusion_bytes, 1u << 20);

  Autotuner::Scope both = fixed_cycle;
  both.fusion = false;
  Autotuner nothing(start, 0, 2, "", both);
  EXPECT_FALSE(nothing.tunes_anything());
  EXPECT_TRUE(nothing.done());
  EXPECT_EQ(nothing.current().fusion_bytes, 1u << 20);
  EXPECT_EQ(nothing.current().cycle_ms, 2.0);
}

// The plan follows a list's knobs: the algorithm threshold and the hierarchical choice, with
// scratch for the algorithm chosen.
TEST(Plan, FollowsTheListsKnobs) {
  PlanContext c;
  c.size = 4;
  c.hierarchical = true;
  c.local_size = 2;
  c.cross_size = 2;
  PlanKnobs k;
  const size_t small = 1000;  // 4000 bytes of float32
  EXPECT_EQ(PlanAllreduce(small, DataType::kFloat32, WithKnobs(c, k)).algorithm,
            AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_FALSE(PlanAllreduce(small, DataType::kFloat32, WithKnobs(c, k)).hierarchical);
  k.small_allreduce_bytes = 0;  // the ring always
  AllreducePlan p = PlanAllreduce(small, DataType::kFloat32, WithKnobs(c, k));
  EXPECT_EQ(p.algorithm, AllreduceAlgorithm::kRing);
  k.hierarchical_allreduce = 1;  // on, even for a small buffer
  p = PlanAllreduce(small, DataType::kFloat32, WithKnobs(c, k));
  EXPECT_TRUE(p.hierarchical);
  k.hierarchical_allreduce = 2;  // off, even for a large one
  k.small_allreduce_bytes = 64u << 20;
  p = PlanAllreduce(1u << 20, DataType::kFloat32, WithKnobs(c, k));
  EXPECT_FALSE(p.hierarchical);
  EXPECT_EQ(p.algorithm, AllreduceAlgorithm::kRecursiveDoubling);
  // Recursive doubling's scratch is the buffer; the ring's is less.
  EXPECT_EQ(PlanScratchBytes(p, 1u << 20, DataType::kFloat32, WithKnobs(c, k)), 4u << 20);
  p.algorithm = AllreduceAlgorithm::kRing;
  EXPECT_EQ(PlanScratchBytes(p, 1u << 20, DataType::kFloat32, WithKnobs(c, k)),
            RingAllreduceScratchBytes(1u << 20, DataType::kFloat32, 4));
  // The plan names the backend: hvd's algorithm, or a backend running the whole allreduce
  // (taking the tensors where they lie when it can), whatever the knobs.
  EXPECT_EQ(p.backend, AllreduceBackend::kAlgorithm);
  c.offload = true;
  k.hierarchical_allreduce = 1;
  p = PlanAllreduce(1u << 20, DataType::kFloat32, WithKnobs(c, k));
  EXPECT_EQ(p.backend, AllreduceBackend::kOffload);
  EXPECT_FALSE(p.hierarchical);
  c.offload_pieces = true;
  EXPECT_EQ(PlanAllreduce(1, DataType::kFloat32, WithKnobs(c, k)).backend,
            AllreduceBackend::kOffloadPieces);
}

}  // namespace
}  // namespace hvd

namespace hvd {
namespace {

// A handle's waiters sleep on its state word (no spin window here): every waiter, of Wait and
// of WaitFor, returns the status Complete gave, and none before Complete ran; a second Complete
// changes nothing.
TEST(Handle, WaitersSleepUntilCompleteAndGetItsStatus) {
  Handle h;
  std::atomic<bool> completed{false};
  std::vector<std::thread> waiters;
  std::atomic<int> right{0};
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&, i] {
      Status s = i % 2 ? h.WaitFor(std::chrono::seconds(30)) : h.Wait();
      if (completed.load() && s.code() == StatusCode::kAborted && s.message() == "first") ++right;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(h.Poll());
  completed.store(true);
  h.Complete(Status::Aborted("first"));
  h.Complete(Status::OK());
  for (auto& t : waiters) t.join();
  EXPECT_EQ(right.load(), 4);
  EXPECT_TRUE(h.Poll());
  EXPECT_EQ(h.status().message(), "first");
}

TEST(Handle, WaitForTimesOutAndThenSeesCompletion) {
  Handle h;
  const auto start = std::chrono::steady_clock::now();
  Status s = h.WaitFor(std::chrono::milliseconds(30));
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
  EXPECT_TRUE(h.status().ok());  // OK while pending
  h.Complete(Status::InvalidArgument("done"));
  EXPECT_EQ(h.WaitFor(std::chrono::milliseconds(0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Wait().message(), "done");
}

// Complete racing a waiter that is about to sleep: none is left asleep (each wait is bounded,
// so a lost wake-up fails instead of hanging).
TEST(Handle, NoWakeUpIsLostWhenCompleteRacesTheSleeper) {
  for (int i = 0; i < 2000; ++i) {
    auto h = std::make_shared<Handle>();
    std::thread completer([h, i] {
      for (int k = 0; k < i % 50; ++k) std::this_thread::yield();
      h->Complete(Status::OK());
    });
    Status s = h->WaitFor(std::chrono::seconds(10));
    completer.join();
    ASSERT_TRUE(s.ok()) << "iteration " << i << ": " << s.ToString();
  }
}

// What only some operations give back is made at its first write; a handle without it answers
// empty.
TEST(Handle, ResultsAreEmptyUntilWritten) {
  Handle h;
  EXPECT_TRUE(h.output_shape().empty());
  EXPECT_TRUE(h.output_bytes().empty());
  EXPECT_TRUE(h.received_splits().empty());
  EXPECT_EQ(h.cuda_event(), nullptr);
  EXPECT_TRUE(h.StreamWait(nullptr).ok());  // no event: nothing to wait for
  h.mutable_results().output_shape = {2, 3};
  h.mutable_results().received_splits = {1, 1};
  EXPECT_EQ(h.output_shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.received_splits(), (std::vector<int64_t>{1, 1}));
  EXPECT_TRUE(h.output_bytes().empty());
}

// A staged allreduce's pieces: they tile the buffer in order, each but the last a multiple of
// 16 bytes and at least the knob's size, never more than kMaxStagingPieces; one piece when the
// knob is 0 or the buffer fits in one, none when it is empty.
TEST(Plan, StagingPiecesTileTheBuffer) {
  PlanContext c;
  PlanKnobs k;
  EXPECT_EQ(WithKnobs(c, k).staging_piece_bytes, size_t{4} << 20);  // the default, 4 MiB
  EXPECT_EQ(DefaultKnobs(Options()).staging_piece_bytes, uint64_t{4} << 20);
  for (uint64_t piece : {uint64_t{0}, uint64_t{1}, uint64_t{16}, uint64_t{1000}, uint64_t{4096},
                         uint64_t{1} << 20}) {
    k.staging_piece_bytes = piece;
    const PlanContext pc = WithKnobs(c, k);
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{16}, size_t{999}, size_t{4096},
                         size_t{4097}, size_t{70001} * 4, size_t{3} << 20, (size_t{256} << 20) + 8}) {
      const std::string what = "piece " + std::to_string(piece) + " bytes " + std::to_string(bytes);
      const std::vector<StagingPiece> ps = PlanStagingPieces(bytes, pc);
      if (bytes == 0) {
        EXPECT_TRUE(ps.empty()) << what;
        continue;
      }
      size_t want_pieces = 1;
      if (piece != 0 && bytes > piece) {
        size_t size = std::max<size_t>(piece, (bytes + 15) / 16);
        size = (size + 15) / 16 * 16;
        want_pieces = (bytes + size - 1) / size;
      }
      ASSERT_EQ(ps.size(), want_pieces) << what;
      EXPECT_LE(ps.size(), kMaxStagingPieces) << what;
      size_t at = 0;
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ(ps[i].offset, at) << what << " piece " << i;
        EXPECT_GT(ps[i].bytes, 0u) << what << " piece " << i;
        if (i + 1 < ps.size()) {
          EXPECT_EQ(ps[i].bytes % 16, 0u) << what << " piece " << i;
          EXPECT_GE(ps[i].bytes, piece) << what << " piece " << i;
        }
        at += ps[i].bytes;
      }
      EXPECT_EQ(at, bytes) << what;
    }
  }
}

}  // namespace
}  // namespace hvd
