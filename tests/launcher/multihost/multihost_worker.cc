// A rank for the multi-host launcher tests: says who and where it is, runs allreduce,
// allgather and broadcast with values checked by formula, and prints "CHECKS-OK rank R".
//
//   multihost_worker                 checks, then exits 0 (2 on a wrong value, 1 on an error)
//   multihost_worker --rounds N      the checks N times; rank 0 prints "ROUNDS-MS N T": the
//                                    milliseconds the N rounds took
//   multihost_worker --set R,R,...  the checks, then every rank adds a process set of those world
//                                    ranks (HVD_DYNAMIC_PROCESS_SETS=1) and its members allreduce
//                                    in it, checked; each member prints "SET-OK rank R"
//   multihost_worker --hold DIR SEC [COUNT]
//                                    checks, writes its pid to DIR/pid.RANK, then for at most
//                                    SEC seconds allreduces a scalar every 50 ms or, with a
//                                    COUNT, COUNT floats back to back (checked). When an
//                                    operation fails (a peer was killed or cut off) it writes
//                                    "UNIX-MS STATUS" to DIR/fail.RANK (readable when its
//                                    output cannot reach hvdrun), prints the status, waits a
//                                    second (so hvdrun sees the killed rank first) and exits 3.
//
// Rank 0 prints "FIRST-COLLECTIVE-UNIX-MS T": the wall clock when the first allreduce finished.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "hvd/engine.h"

namespace {

using hvd::DataType;
using hvd::TensorView;

int Fail(int rank, const std::string& what) {
  std::printf("CHECK-FAIL rank %d: %s\n", rank, what.c_str());
  std::fflush(stdout);
  return 2;
}

long long UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Sum over ranks of in[i] = rank * 1000 + i % 997 (exact in float32 at these sizes).
int CheckAllreduce(hvd::Engine& e, const std::string& name, int64_t n) {
  const int r = e.rank(), s = e.size();
  std::vector<float> buf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(r * 1000 + i % 997);
  TensorView t(buf.data(), DataType::kFloat32, {n});
  hvd::Status st = e.Allreduce(name, t, t, hvd::ReduceOp::kSum)->Wait();
  if (!st.ok()) return Fail(r, name + ": " + st.ToString());
  for (int64_t i = 0; i < n; ++i) {
    float want = static_cast<float>(1000 * s * (s - 1) / 2 + s * (i % 997));
    if (buf[i] != want) {
      return Fail(r, name + "[" + std::to_string(i) + "] = " + std::to_string(buf[i]) +
                         ", expected " + std::to_string(want));
    }
  }
  return 0;
}

// Rank q contributes q + 1 rows of 3 int32: q * 100 + row * 3 + col.
int CheckAllgather(hvd::Engine& e) {
  const int r = e.rank(), s = e.size();
  std::vector<int32_t> mine(static_cast<size_t>((r + 1) * 3));
  for (size_t k = 0; k < mine.size(); ++k) mine[k] = r * 100 + static_cast<int32_t>(k);
  TensorView t(mine.data(), DataType::kInt32, {r + 1, 3});
  auto h = e.Allgather("mh.allgather", t);
  hvd::Status st = h->Wait();
  if (!st.ok()) return Fail(r, "allgather: " + st.ToString());
  const int64_t rows = static_cast<int64_t>(s) * (s + 1) / 2;
  if (h->output_shape() != std::vector<int64_t>{rows, 3}) return Fail(r, "allgather shape");
  const auto* got = reinterpret_cast<const int32_t*>(h->output_bytes().data());
  size_t at = 0;
  for (int q = 0; q < s; ++q) {
    for (int k = 0; k < (q + 1) * 3; ++k, ++at) {
      if (got[at] != q * 100 + k) return Fail(r, "allgather value at " + std::to_string(at));
    }
  }
  return 0;
}

// The last rank broadcasts 7777 + i.
int CheckBroadcast(hvd::Engine& e) {
  const int r = e.rank(), root = e.size() - 1;
  std::vector<int64_t> buf(64, -1);
  if (r == root) {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = 7777 + static_cast<int64_t>(i);
  }
  TensorView t(buf.data(), DataType::kInt64, {64});
  hvd::Status st = e.Broadcast("mh.broadcast", t, t, root)->Wait();
  if (!st.ok()) return Fail(r, "broadcast: " + st.ToString());
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != 7777 + static_cast<int64_t>(i)) return Fail(r, "broadcast value");
  }
  return 0;
}

int CheckAll(hvd::Engine& e) {
  int rc = CheckAllreduce(e, "mh.small", 4099);
  if (rc != 0) return rc;
  if ((rc = CheckAllreduce(e, "mh.large", 1 << 20)) != 0) return rc;
  if ((rc = CheckAllgather(e)) != 0) return rc;
  return CheckBroadcast(e);
}

// In the set of world ranks `members`: the sum of in[i] = world rank * 1000 + i % 997.
int CheckSet(hvd::Engine& e, const std::vector<int>& members) {
  const int r = e.rank();
  auto id = e.AddProcessSet(members);
  if (!id.ok()) return Fail(r, "adding the set: " + id.status().ToString());
  // Every rank waits for the members before it goes on to shut down (which ends the job's
  // engine on every rank).
  auto done = [&e, r](int rc) {
    hvd::Status st = e.Barrier()->Wait();
    return rc != 0 || st.ok() ? rc : Fail(r, "barrier after the set: " + st.ToString());
  };
  if (std::find(members.begin(), members.end(), r) == members.end()) return done(0);
  const int64_t n = 1 << 20;
  std::vector<float> buf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(r * 1000 + i % 997);
  TensorView t(buf.data(), DataType::kFloat32, {n});
  hvd::Status st = e.Allreduce("mh.set", t, t, hvd::ReduceOp::kSum, 1.0, 1.0, *id)->Wait();
  if (!st.ok()) return done(Fail(r, "set allreduce: " + st.ToString()));
  int64_t ranks = 0;
  for (int m : members) ranks += m;
  const int64_t k = static_cast<int64_t>(members.size());
  for (int64_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(1000 * ranks + k * (i % 997));
    if (buf[i] != want) return done(Fail(r, "set allreduce value at " + std::to_string(i)));
  }
  std::printf("SET-OK rank %d\n", r);
  return done(0);
}

int Hold(hvd::Engine& e, const std::string& dir, double seconds, int64_t count) {
  std::ofstream(dir + "/pid." + std::to_string(e.rank())) << ::getpid() << "\n";
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  const int s = e.size();
  std::vector<float> buf(static_cast<size_t>(count));
  while (std::chrono::steady_clock::now() < end) {
    std::fill(buf.begin(), buf.end(), 1.0f);
    TensorView t(buf.data(), DataType::kFloat32, {count});
    hvd::Status st = e.Allreduce("mh.hold", t, t, hvd::ReduceOp::kSum)->Wait();
    if (!st.ok()) {
      std::ofstream(dir + "/fail." + std::to_string(e.rank()))
          << UnixMs() << " " << st.ToString() << "\n";
      std::printf("HOLD-FAILED rank %d: %s\n", e.rank(), st.ToString().c_str());
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::_Exit(3);  // the engine's peers are gone: skip a shutdown that talks to them
    }
    for (float v : buf) {
      if (v != static_cast<float>(s)) return Fail(e.rank(), "hold allreduce value");
    }
    if (count == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool hold = (argc == 4 || argc == 5) && std::strcmp(argv[1], "--hold") == 0;
  bool rounds = argc == 3 && std::strcmp(argv[1], "--rounds") == 0;
  std::vector<int> set;
  if (argc == 3 && std::strcmp(argv[1], "--set") == 0) {
    for (const char* p = argv[2]; *p;) {
      char* end = nullptr;
      set.push_back(static_cast<int>(std::strtol(p, &end, 10)));
      if (end == p) return 64;
      p = *end == ',' ? end + 1 : end;
    }
  }
  const int64_t hold_count = argc == 5 ? std::atoll(argv[4]) : 1;
  const int round_count = rounds ? std::atoi(argv[2]) : 1;
  if ((argc != 1 && !hold && !rounds && set.empty()) || hold_count < 1 || round_count < 1) {
    std::fprintf(stderr, "usage: multihost_worker [--rounds N | --set R,R,... | "
                         "--hold DIR SECONDS [COUNT]]\n");
    return 64;
  }
  auto engine = hvd::Engine::CreateFromEnvironment();
  if (!engine.ok()) {
    std::printf("INIT-FAILED: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  hvd::Engine& e = **engine;
  const char* host = std::getenv("HVD_HOSTNAME");
  const char* bind = std::getenv("HVD_BIND_ADDR");
  std::printf("WHO rank %d size %d local %d/%d cross %d/%d host %s bind %s pid %d\n", e.rank(),
              e.size(), e.local_rank(), e.local_size(), e.cross_rank(), e.cross_size(),
              host ? host : "-", bind ? bind : "-", static_cast<int>(::getpid()));
  int rc = CheckAllreduce(e, "mh.small", 4099);
  if (rc != 0) return rc;
  if (e.rank() == 0) std::printf("FIRST-COLLECTIVE-UNIX-MS %lld\n", UnixMs());
  const long long start = UnixMs();
  for (int i = 0; i < round_count; ++i) {
    if ((rc = CheckAll(e)) != 0) return rc;
  }
  if (e.rank() == 0 && rounds) {
    std::printf("ROUNDS-MS %d %lld\n", round_count, UnixMs() - start);
  }
  std::printf("CHECKS-OK rank %d\n", e.rank());
  std::fflush(stdout);
  if (!set.empty() && (rc = CheckSet(e, set)) != 0) return rc;
  if (hold && (rc = Hold(e, argv[2], std::atof(argv[3]), hold_count)) != 0) return rc;
  hvd::Status st = e.Shutdown();
  if (!st.ok()) {
    std::printf("SHUTDOWN-FAILED rank %d: %s\n", e.rank(), st.ToString().c_str());
    return 1;
  }
  return 0;
}
