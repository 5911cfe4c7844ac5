// Out of memory on one rank. Rank 1's address space is limited (RLIMIT_AS) so that it cannot
// allocate what an allgather's output or a fused allreduce's buffer needs, and its output
// allocator throws. Each such operation fails on every rank with ResourceExhausted naming rank 1,
// no process dies, and the operations after it work with the right values, large ones included.
// Over shared memory between every rank a fused allreduce needs no fusion buffer (the tensors
// are read and written where they lie), so there it succeeds with the right values.
// An output too small to be agreed on that the allocator does not give fails on that rank
// alone: it receives into a stand-in, and the others' operation completes.
#include <malloc.h>
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hvd/engine.h"
#include "mp_fork.h"
#include "sanitized.h"

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

int RunRank(int r, const hvd::Options& base, const Reporter& out, hvd::Options::Toggle shm) {
  hvd::Options o = base;
  o.fusion_threshold_bytes = 256u << 20;
  o.shm = shm;
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
  bool fused_ok = true;  // where it succeeds: (1 + 2) and 2 (1 + 2) summed in place
  for (int64_t i = 0; i < kFusedElems; i += 4099) fused_ok = fused_ok && a[i] == 3.0f && b[i] == 6.0f;
  out.Say("fused.values", fused_ok ? "ok" : "wrong");
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

void CheckOneRankShort(hvd::Options::Toggle shm) {
#ifdef HVD_SANITIZED
  GTEST_SKIP() << "RLIMIT_AS cannot limit a sanitized process (its shadow memory is reserved)";
#endif
  const bool fusion_buffer = shm == hvd::Options::Toggle::kOff;
  ForkedWorld w(2, 30);
  ASSERT_TRUE(w.store_ok());
  ASSERT_TRUE(w.Start([shm](int r, const hvd::Options& o, const Reporter& out) {
    return RunRank(r, o, out, shm);
  }));
  ASSERT_TRUE(w.WaitAll(120)) << "a rank is still running";
  for (int r = 0; r < 2; ++r) {
    const ChildResult& c = w.result(r);
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + Describe(c));
    ASSERT_EQ(c.exit_code, 0);
    auto value = [&c](const std::string& k) { return Value(c, k); };
    std::printf("[mp] rank %d: %s: %s\n", r, value("gather.code").c_str(),
                value("gather.message").c_str());
    std::vector<std::string> short_ops = {"gather", "throwing"};
    if (fusion_buffer) {
      short_ops.push_back("fused.a");
      short_ops.push_back("fused.b");
    } else {
      EXPECT_EQ(value("fused.a.code"), "OK");
      EXPECT_EQ(value("fused.b.code"), "OK");
      EXPECT_EQ(value("fused.values"), "ok");
    }
    for (const std::string& op : short_ops) {
      EXPECT_EQ(value(op + ".code"), "ResourceExhausted") << op;
      EXPECT_NE(value(op + ".message").find("rank 1 could not allocate"), std::string::npos)
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

// Over TCP the fused tensors go through the fusion buffer.
TEST(OutOfMemory, OneRankShortFailsTheOperationEverywhereAndTheEngineGoesOn) {
  CheckOneRankShort(hvd::Options::Toggle::kOff);
}

// Over shared memory the fused allreduce needs no buffer of its own and succeeds.
TEST(OutOfMemory, OneRankShortOverSharedMemoryFusesWithoutABuffer) {
  CheckOneRankShort(hvd::Options::Toggle::kOn);
}

// A small output (under the 1 MiB the ranks agree on) that the caller's allocator does not give:
// an allgather's allocator throws on rank 1, a reducescatter's returns null on rank 0 (the
// coordinator). That rank receives into a stand-in and its operation alone fails with
// ResourceExhausted; the others' operations complete with the right values, and the next
// operation works everywhere. (It abandoned the communicator before: every rank failed.)
TEST(OutOfMemory, ASmallOutputTheAllocatorRefusesFailsOnThatRankAlone) {
  ForkedWorld w(3, 30);
  ASSERT_TRUE(w.store_ok());
  ASSERT_TRUE(w.Start([](int r, const hvd::Options& o, const Reporter& out) {
    auto created = hvd::Engine::Create(o);
    if (!created.ok()) return 2;
    hvd::Engine& e = **created;
    std::vector<float> v(1000, r + 1.0f), keep(3000, -1.0f);
    TensorView tv(v.data(), DataType::kFloat32, {1000});
    hvd::OutputAllocator gather_alloc = [r, &keep](const std::vector<int64_t>&) -> void* {
      if (r == 1) throw std::bad_alloc();
      return keep.data();
    };
    Say(out, "gather", Wait(e.Allgather("small.gather", tv, gather_alloc)));
    bool gathered = true;  // rank j's 1000 rows hold j + 1
    for (int j = 0; j < 3; ++j) gathered = gathered && keep[1000 * j] == j + 1.0f && keep[1000 * j + 999] == j + 1.0f;
    out.Say("gather.values", gathered ? "ok" : "wrong");
    std::vector<float> part(334, -1.0f);
    hvd::OutputAllocator scatter_alloc = [r, &part](const std::vector<int64_t>&) -> void* {
      return r == 0 ? nullptr : part.data();
    };
    Say(out, "scatter", Wait(e.Reducescatter("small.scatter", tv, ReduceOp::kSum, 1.0, 1.0,
                                             scatter_alloc)));
    out.Say("scatter.values", part[0] == 6.0f && part[332] == 6.0f ? "ok" : "wrong");
    Say(out, "later", Wait(e.Allreduce("later", tv, tv, ReduceOp::kSum)));
    out.Say("later.values", v[0] == 6.0f && v[999] == 6.0f ? "ok" : "wrong");
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
    if (r == 1) {
      EXPECT_EQ(value("gather.code"), "ResourceExhausted");
      EXPECT_NE(value("gather.message").find("cannot allocate"), std::string::npos);
      EXPECT_NE(value("gather.message").find("on this rank only"), std::string::npos);
    } else {
      EXPECT_EQ(value("gather.code"), "OK") << value("gather.message");
      EXPECT_EQ(value("gather.values"), "ok");
    }
    if (r == 0) {
      EXPECT_EQ(value("scatter.code"), "ResourceExhausted");
      EXPECT_NE(value("scatter.message").find("the allocation returned null"), std::string::npos);
    } else {
      EXPECT_EQ(value("scatter.code"), "OK") << value("scatter.message");
      EXPECT_EQ(value("scatter.values"), "ok");  // 1000 rows: 334, 333, 333; 1 + 2 + 3 each
    }
    EXPECT_EQ(value("later.code"), "OK") << value("later.message");
    EXPECT_EQ(value("later.values"), "ok");
    EXPECT_EQ(value("done"), "yes");
  }
}

// Heap in use (glibc's count of bytes handed out and not freed).
size_t HeapInUse() { return mallinfo2().uordblks; }

// An engine created and destroyed again and again (init and shutdown in a loop, an elastic
// job's resets) leaves nothing behind: each one's progress helper, which its handles may
// outlive, is taken again by the next engine (each cycle kept about 190 bytes before, 57 KB
// over these 300). One allreduce per engine, with its value checked.
TEST(Lifecycle, EnginesCreatedAndDestroyedKeepNoMemory) {
  auto cycle = [](int i) {
    hvd::Options o;  // a world of one
    auto created = hvd::Engine::Create(o);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    double v = i;
    TensorView t(&v, DataType::kFloat64, {1});
    ASSERT_TRUE((*created)->Allreduce("x", t, t, ReduceOp::kSum)->Wait().ok());
    EXPECT_EQ(v, i);
  };
  for (int i = 0; i < 50; ++i) cycle(i);  // the pools of handles and buffers fill
  const size_t before = HeapInUse();
  for (int i = 0; i < 300; ++i) cycle(i);
  const size_t after = HeapInUse();
  EXPECT_LT(after, before + 16 * 1024) << "bytes in use grew from " << before << " to " << after
                                       << " over 300 engines";
}

}  // namespace
}  // namespace mp
