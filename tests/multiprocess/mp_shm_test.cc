// Shared memory between the ranks of this host (transport/shm/shm_transport.h), with real
// processes: each rank maps every local rank's memfd segment and nothing appears in /dev/shm;
// HVD_SHM=off maps none; a rank SIGKILLed while the others allreduce through shared memory
// fails every survivor with PeerLost naming it, and still nothing is left in /dev/shm.
#include <dirent.h>
#include <signal.h>

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "hvd/engine.h"
#include "mp_fork.h"

namespace mp {
namespace {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::Status;
using hvd::TensorView;

// What /dev/shm holds that could be hvd's (other programs, such as Open MPI's tests running
// alongside, come and go there).
std::set<std::string> DevShm() {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.find("hvd") != std::string::npos) names.insert(name);
    }
    ::closedir(d);
  }
  return names;
}

int SegmentsMapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("/memfd:hvd-shm") != std::string::npos;
  return n;
}

// Allreduces `count` floats of rank + 1 + i % 7 and checks the sum by formula.
Status CheckedAllreduce(hvd::Engine& e, const std::string& name, int64_t count) {
  const int n = e.size();
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = static_cast<float>(e.rank() + 1 + i % 7);
  TensorView t(v.data(), DataType::kFloat32, {count});
  Status s = e.Allreduce(name, t, t, ReduceOp::kSum)->WaitFor(std::chrono::seconds(60));
  if (!s.ok()) return s;
  for (int64_t i = 0; i < count; ++i) {
    if (v[i] != static_cast<float>(n * (n + 1) / 2 + n * (i % 7))) {
      return Status::Internal("wrong value at " + std::to_string(i));
    }
  }
  return Status::OK();
}

void RunJob(int size, hvd::Options::Toggle shm, int want_mapped) {
  const std::set<std::string> before = DevShm();
  ForkedWorld w(size, 30);
  ASSERT_TRUE(w.store_ok());
  ASSERT_TRUE(w.Start([shm](int, const hvd::Options& base, const Reporter& out) {
    hvd::Options o = base;
    o.shm = shm;
    auto created = hvd::Engine::Create(o);
    if (!created.ok()) {
      out.Say("create", created.status().ToString());
      return 2;
    }
    for (int64_t count : {int64_t{1}, int64_t{1001}, int64_t{3} << 20}) {
      Status s = CheckedAllreduce(**created, "shm." + std::to_string(count), count);
      out.Say("allreduce." + std::to_string(count), s.ToString());
    }
    out.Say("mapped", std::to_string(SegmentsMapped()));
    return (*created)->Shutdown().ok() ? 0 : 3;
  }));
  ASSERT_TRUE(w.WaitAll(90));
  for (int r = 0; r < size; ++r) {
    const ChildResult& c = w.result(r);
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + Describe(c));
    EXPECT_EQ(c.exit_code, 0);
    for (const char* count : {"1", "1001", "3145728"}) {
      EXPECT_EQ(Value(c, std::string("allreduce.") + count), "OK");
    }
    EXPECT_EQ(Value(c, "mapped"), std::to_string(want_mapped));
  }
  EXPECT_EQ(DevShm(), before) << "a job left something in /dev/shm";
}

TEST(SharedMemory, EveryRankMapsEveryLocalSegmentAndNothingIsInDevShm) {
  RunJob(3, hvd::Options::Toggle::kOn, 3);
}

TEST(SharedMemory, AutoIsTheDefaultAndOffMapsNothing) {
  RunJob(2, hvd::Options::Toggle::kAuto, 2);
  RunJob(2, hvd::Options::Toggle::kOff, 0);
}

TEST(SharedMemory, RankKilledMidAllreduceFailsEverySurvivorNamingIt) {
  constexpr double kTimeout = 5;
  constexpr int kVictim = 2;
  const std::set<std::string> before = DevShm();
  ForkedWorld w(4, kTimeout);
  ASSERT_TRUE(w.store_ok());
  ASSERT_TRUE(w.Start([](int r, const hvd::Options& base, const Reporter& out) {
    hvd::Options o = base;
    o.shm = hvd::Options::Toggle::kOn;
    auto created = hvd::Engine::Create(o);
    if (!created.ok()) return 2;
    out.Say("mapped", std::to_string(SegmentsMapped()));
    // 4 MiB allreduces back to back until one fails (the victim is killed in one of them).
    for (int i = 0; i < 100000; ++i) {
      if (i == 3) out.Say("running", "yes");
      Status s = CheckedAllreduce(**created, "loop", 1 << 20);
      if (!s.ok()) {
        out.Say("failed", s.ToString());
        std::_Exit(0);  // the job is broken: skip a shutdown that talks to the lost rank
      }
    }
    return 4;
  }));
  // Wait until every rank is in the loop, then kill the victim.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool running = false;
  while (!running && std::chrono::steady_clock::now() < deadline) {
    w.Wait({0, 1, 2, 3}, 0.1);
    running = true;
    for (int r = 0; r < 4; ++r) running = running && Value(w.result(r), "running") == "yes";
  }
  ASSERT_TRUE(running);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double killed_at = w.Elapsed();
  w.Signal(kVictim, SIGKILL);
  ASSERT_TRUE(w.WaitAll(kTimeout + 20));
  for (int r = 0; r < 4; ++r) {
    const ChildResult& c = w.result(r);
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + Describe(c));
    EXPECT_EQ(Value(c, "mapped"), "4");
    if (r == kVictim) {
      EXPECT_EQ(c.term_signal, SIGKILL);
      continue;
    }
    EXPECT_EQ(c.exit_code, 0);
    EXPECT_NE(Value(c, "failed").find("PeerLost"), std::string::npos);
    EXPECT_NE(Value(c, "failed").find("rank 2"), std::string::npos);
    EXPECT_LT(c.seconds - killed_at, kTimeout + 5);
  }
  EXPECT_EQ(DevShm(), before) << "a job left something in /dev/shm";
}

}  // namespace
}  // namespace mp
