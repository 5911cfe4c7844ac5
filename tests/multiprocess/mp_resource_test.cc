// Out of memory on one rank. Rank 1's address space is limited (RLIMIT_AS) so that it cannot
// allocate what an allgather's output or a fused allreduce's buffer needs, and its output
// allocator throws. Each such operation fails on every rank with ResourceExhausted naming rank 1,
// no process dies, and the operations after it work with the right values, large ones included.
// A failure too small to be agreed on before the collective abandons the communicator instead:
// every rank fails fast, naming rank 1, and no process dies.
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hvd/engine.h"
#include "mp_fork.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HVD_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HVD_SANITIZED 1
#endif
#endif

namespace mp {
namespace {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::Status;
using hvd::TensorView;

constexpr int64_t kGatherElems = 12 << 20;  // 48 MiB of float32 per rank: 96 MiB gathered
constexpr int64_t kFusedElems = 10 << 20;   // two tensors of 40 MiB: an 80 MiB fusion buffer
constexpr int64_t kMidElems = 128 << 10;    // 512 KiB per rank: a 1 MiB output, agreed on
constexpr size_t kHeadroom = 64 << 20;      // what rank 1 may still map once limited

size_t VirtualBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  return 0;
}

Status Wait(const hvd::HandlePtr& h) { return h->WaitFor(std::chrono::seconds(60)); }

void Say(const Reporter& out, const std::string& key, const Status& s) {
  out.Say(key + ".code", hvd::StatusCodeName(s.code()));
  out.Say(key + ".message", s.message());
}

int RunRank(int r, const hvd::Options& base, const Reporter& out) {
  hvd::Options o = base;
  o.fusion_threshold_bytes = 256u << 20;
  auto created = hvd::Engine::Create(o);
  if (!created.ok()) {
    out.Say("create", created.status().ToString());
    return 2;
  }
  hvd::Engine& e = **created;
  const int n = e.size();
  // Every input is allocated before the limit.
  std::vector<float> gather_in(kGatherElems, r + 1.0f);
  std::vector<float> a(kFusedElems, r + 1.0f), b(kFusedElems, 2 * (r + 1.0f));
  std::vector<float> small(1000, r + 1.0f);
  std::vector<float> mid(kMidElems, r + 1.0f);
  TensorView sv(small.data(), DataType::kFloat32, {1000});
  if (!Wait(e.Allreduce("ready", sv, sv, ReduceOp::kSum)).ok()) return 3;
  if (r == 1) {
    rlimit lim{VirtualBytes() + kHeadroom, RLIM_INFINITY};
    if (::setrlimit(RLIMIT_AS, &lim) != 0) return 4;
  }
  // 1. An allgather whose 96 MiB output does not fit in rank 1.
  TensorView gv(gather_in.data(), DataType::kFloat32, {kGatherElems});
  Say(out, "gather", Wait(e.Allgather("big.gather", gv)));
  // 2. Two tensors fused into an 80 MiB buffer.
  TensorView av(a.data(), DataType::kFloat32, {kFusedElems});
  TensorView bv(b.data(), DataType::kFloat32, {kFusedElems});
  auto hs = e.GroupedAllreduce({"fused.a", "fused.b"}, {av, bv}, {av, bv}, ReduceOp::kSum);
  Say(out, "fused.a", Wait(hs[0]));
  Say(out, "fused.b", Wait(hs[1]));
  // 3. An allgather whose framework allocator throws on rank 1 (as torch's does when full).
  TensorView mv(mid.data(), DataType::kFloat32, {kMidElems});
  std::vector<float> keep(2 * kMidElems);
  hvd::OutputAllocator throwing = [r, &keep](const std::vector<int64_t>&) -> void* {
    if (r == 1) throw std::bad_alloc();
    return keep.data();
  };
  Say(out, "throwing", Wait(e.Allgather("throwing.gather", mv, throwing)));
  // 4. The engine goes on: a small allreduce, then a 48 MiB one in place (no allocation).
  Say(out, "after", Wait(e.Allreduce("after", sv, sv, ReduceOp::kSum)));
  bool small_ok = true;
  for (float x : small) small_ok = small_ok && x == 6.0f;  // (1 + 2) after "ready", summed again
  out.Say("after.values", small_ok ? "ok" : "wrong: " + std::to_string(small[0]));
  Say(out, "large", Wait(e.Allreduce("large", gv, gv, ReduceOp::kSum)));
  bool large_ok = true;
  for (float x : gather_in) large_ok = large_ok && x == n * (n + 1) / 2.0f;
  out.Say("large.values", large_ok ? "ok" : "wrong: " + std::to_string(gather_in[0]));
  e.Shutdown();
  out.Say("done", "yes");
  return 0;
}

TEST(OutOfMemory, OneRankShortFailsTheOperationEverywhereAndTheEngineGoesOn) {
#ifdef HVD_SANITIZED
  GTEST_SKIP() << "RLIMIT_AS cannot limit a sanitized process (its shadow memory is reserved)";
#endif
  ForkedWorld w(2, 30);
  ASSERT_TRUE(w.store_ok());
  ASSERT_TRUE(w.Start(RunRank));
  ASSERT_TRUE(w.WaitAll(120)) << "a rank is still running";
  for (int r = 0; r < 2; ++r) {
    const ChildResult& c = w.result(r);
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + Describe(c));
    ASSERT_EQ(c.exit_code, 0);
    auto value = [&c](const std::string& k) { return Value(c, k); };
    std::printf("[mp] rank %d: %s: %s\n", r, value("gather.code").c_str(),
                value("gather.message").c_str());
    for (const char* op : {"gather", "fused.a", "fused.b", "throwing"}) {
      EXPECT_EQ(value(std::string(op) + ".code"), "ResourceExhausted") << op;
      EXPECT_NE(value(std::string(op) + ".message").find("rank 1 could not allocate"),
                std::string::npos)
          << op;
    }
    EXPECT_EQ(value("after.code"), "OK");
    EXPECT_EQ(value("after.values"), "ok");
    EXPECT_EQ(value("large.code"), "OK");
    EXPECT_EQ(value("large.values"), "ok");
    EXPECT_EQ(value("done"), "yes");
  }
  // The rank that ran out says what it could not get.
  EXPECT_NE(w.result(1).values.at("gather.message").find("allgather output"), std::string::npos);
}

// A small allgather (8 KB out) whose allocator throws on rank 1: too small to be agreed on, so
// rank 1 leaves the others in the collective; it abandons the communicator and every rank fails
// fast with a message naming it.
TEST(OutOfMemory, AnUnagreedFailureAbandonsTheCommunicatorNamingTheRank) {
  ForkedWorld w(3, 30);
  ASSERT_TRUE(w.store_ok());
  ASSERT_TRUE(w.Start([](int r, const hvd::Options& o, const Reporter& out) {
    auto created = hvd::Engine::Create(o);
    if (!created.ok()) return 2;
    hvd::Engine& e = **created;
    std::vector<float> v(1000, 1.0f), keep(3000);
    TensorView tv(v.data(), DataType::kFloat32, {1000});
    hvd::OutputAllocator alloc = [r, &keep](const std::vector<int64_t>&) -> void* {
      if (r == 1) throw std::bad_alloc();
      return keep.data();
    };
    Say(out, "gather", Wait(e.Allgather("small.gather", tv, alloc)));
    Say(out, "later", Wait(e.Allreduce("later", tv, tv, ReduceOp::kSum)));
    e.Shutdown();
    out.Say("done", "yes");
    return 0;
  }));
  ASSERT_TRUE(w.WaitAll(60)) << "a rank is still running";
  for (int r = 0; r < 3; ++r) {
    const ChildResult& c = w.result(r);
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + Describe(c));
    ASSERT_EQ(c.exit_code, 0);
    auto value = [&c](const std::string& k) { return Value(c, k); };
    std::printf("[mp] rank %d: %s: %s\n", r, value("gather.code").c_str(),
                value("gather.message").c_str());
    EXPECT_NE(value("gather.code"), "OK");
    EXPECT_NE(value("gather.message").find("rank 1"), std::string::npos);
    EXPECT_NE(value("later.code"), "OK");
    EXPECT_LT(c.seconds, 20) << "a survivor waited for the timeout instead of failing fast";
    EXPECT_EQ(value("done"), "yes");
  }
  EXPECT_NE(w.result(1).values.at("gather.message").find("cannot allocate"), std::string::npos);
}

}  // namespace
}  // namespace mp
