// Device tensors end to end: every collective on device memory under hvdrun, results checked
// against the formulas of mp_common.h.
//
//   hvdrun -np N mp_device_worker [--fake=shared|own] [--fake-collectives] [--peerloss=V]
//                                 [--adasum-only]
//
// Without --fake it runs on the CUDA devices (rank r on device r % count): one rank goes
// through NCCL, ranks that share a GPU are staged through host memory. Without a CUDA device
// (or in a build without CUDA) it prints why and exits 77, which CTest reports as skipped.
// --fake installs a device over host memory (the engine cannot tell): "shared" gives every rank
// the same device identity, so the ranks agree to stage through host memory as they would on
// one GPU; "own" gives each rank its own, which stages only under HVD_GPU_OPERATIONS=cpu (or in
// a build without NCCL). The engine's device path (ready events, device fusion buffer, batched
// copies, scaling, staging, device outputs) thus runs in CI without a GPU.
// --fake-collectives (with --fake=own) stands hvd's host algorithms in for NCCL (the fake
// device's memory is host memory), so the collectives path runs too: fused and single
// allreduces on the communicator, hierarchical allreduce with a communicator per host, the
// ragged collectives, a process set's own communicator, and the 16-bit integers it cannot
// reduce staged. It prints how many calls each communicator size took, for the tests to check.
// Every run ends with the Adasum checks (CheckAdasum); --adasum-only runs only those.
// --peerloss=V: instead of the checks, every rank runs device allreduces of 32 MiB, and rank V
// SIGKILLs itself 0.3 s in, most likely inside one (they take most of the time); each survivor must fail within HVD_TIMEOUT_SECONDS (+10 s) with PeerLost
// or Timeout naming rank V, and its next operation fail at once. Each prints "PEERLOSS-OK rank
// r" (or "PEERLOSS-FAIL ...").
//
// The inputs are copied to the device on the worker's own stream without waiting: the engine
// must order its work after that stream (the ready events), or it reads stale memory.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "device/device.h"
#include "mp_common.h"
#include "reduce/reduce.h"
#include "transport/device_collectives.h"
#include "transport/transport.h"

namespace mp {
namespace {

using hvd::DataType;
using hvd::ReduceOp;
using hvd::TensorView;

// ---------------------------------------------------------------- a device over host memory

// The stream the worker's tensors are produced on (its own device handle's), once opened.
void* g_tensor_stream = nullptr;

// Which threads open devices, make communicators and run the fake collectives: the worker's own
// (main, the engine's caller) or another (the engine's background thread).
std::thread::id g_main_thread;
std::atomic<int> g_opens_by_main{0}, g_opens_elsewhere{0}, g_calls_by_main{0},
    g_comms_by_main{0};

// The device current on this thread, as CUDA keeps one per thread: set where the engine opens
// its device (CUDA's Open leaves it current there) and inside Device::MakeCurrent's scopes. The
// engine's device refuses work on a thread where it is not current (a caller that ran device
// work outside MakeCurrent); the worker's own device handle, a framework's, does not look.
thread_local int t_current = -1;

class FakeDevice : public hvd::Device {
 public:
  FakeDevice(int ordinal, std::string uuid, bool strict)
      : ordinal_(ordinal), uuid_(std::move(uuid)), strict_(strict) {}
  int ordinal() const override { return ordinal_; }
  std::string Describe() const override { return "fake:" + std::to_string(ordinal_); }
  std::string Uuid() const override { return uuid_; }
  // Each opened device has a stream of its own (a token: work runs at once), as a CUDA
  // device handle does, so that a ready event recorded on the wrong stream shows.
  void* stream() const override { return const_cast<char*>(&stream_token_); }
  hvd::Status MakeCurrent(std::shared_ptr<void>* scope) override {
    scope->reset();
    if (t_current == ordinal_) return hvd::Status::OK();
    const int before = t_current;
    t_current = ordinal_;
    *scope = std::shared_ptr<void>(new int(before), [](void* p) {
      t_current = *static_cast<int*>(p);
      delete static_cast<int*>(p);
    });
    return hvd::Status::OK();
  }
  hvd::Status Allocate(size_t bytes, void** out) override {
    HVD_RETURN_IF_ERROR(Current());
    *out = std::malloc(bytes ? bytes : 1);
    std::memset(*out, 0xA5, bytes);  // poisoned: unwritten results show
    return hvd::Status::OK();
  }
  void Free(void* p) override { std::free(p); }
  hvd::Status AllocateHost(size_t bytes, void** out) override { return Allocate(bytes, out); }
  void FreeHost(void* p) override { std::free(p); }
  hvd::Status WaitEvent(void* event) override {
    HVD_RETURN_IF_ERROR(Current());
    return event ? hvd::Status::OK() : hvd::Status::Internal("null ready event");
  }
  // As CUDA's, a table of the spans copied since the last Synchronize, here of 8 spans: a copy
  // that does not fit a table in use is refused until the engine synchronizes.
  hvd::Status BatchedCopy(const std::vector<hvd::CopySpan>& spans) override {
    HVD_RETURN_IF_ERROR(Current());
    if (table_used_ > 0 && table_used_ + spans.size() > kTableSpans) {
      ++table_full_;
      return hvd::Status::ResourceExhausted(hvd::kCopyTableFull);
    }
    table_used_ += spans.size();
    for (const auto& s : spans) std::memcpy(s.dst, s.src, s.bytes);
    return hvd::Status::OK();
  }
  hvd::Status Copy(void* dst, const void* src, size_t bytes) override {
    HVD_RETURN_IF_ERROR(Current());
    if (bytes) std::memcpy(dst, src, bytes);
    return hvd::Status::OK();
  }
  hvd::Status Zero(void* dst, size_t bytes) override {
    HVD_RETURN_IF_ERROR(Current());
    if (bytes) std::memset(dst, 0, bytes);
    return hvd::Status::OK();
  }
  hvd::Status Scale(void* buf, size_t count, DataType dtype, double factor) override {
    HVD_RETURN_IF_ERROR(Current());
    hvd::Scale(buf, count, dtype, factor);
    return hvd::Status::OK();
  }
  hvd::Status Synchronize(hvd::Deadline, const std::function<hvd::Status()>& poll) override {
    HVD_RETURN_IF_ERROR(Current());
    table_used_ = 0;
    return poll ? poll() : hvd::Status::OK();
  }
  static constexpr size_t kTableSpans = 8;
  static inline std::atomic<int> table_full_{0};  // copies refused (read at exit)

 private:
  hvd::Status Current() const {
    if (!strict_ || t_current == ordinal_) return hvd::Status::OK();
    return hvd::Status::Internal("fake device: work for " + Describe() + " on a thread where " +
                                 (t_current < 0 ? std::string("no device")
                                                : "fake:" + std::to_string(t_current)) +
                                 " is current (device work outside Device::MakeCurrent)");
  }
  int ordinal_;
  std::string uuid_;
  bool strict_;
  char stream_token_ = 0;
  size_t table_used_ = 0;
};

class FakeRuntime : public hvd::DeviceRuntime {
 public:
  explicit FakeRuntime(std::string uuid) : uuid_(std::move(uuid)) {}
  hvd::StatusOr<std::unique_ptr<hvd::Device>> Open(int ordinal) override {
    // The worker's own handle is opened on main; the engine's on its background thread, where
    // it stays current, as CUDA's Open leaves it.
    const bool engine = std::this_thread::get_id() != g_main_thread;
    ++(engine ? g_opens_elsewhere : g_opens_by_main);
    if (engine) t_current = ordinal;
    return std::unique_ptr<hvd::Device>(new FakeDevice(ordinal, uuid_, engine));
  }
  // A tensor's ready event must be recorded on the stream the caller gave with it (every
  // tensor of this worker names its own device handle's stream): recorded on another, the
  // engine would not wait for the work that produces the data.
  hvd::Status RecordEvent(int, void* stream, void** event) override {
    if (refuse_events) return hvd::Status::Internal("fake runtime: this device records no event");
    if (g_tensor_stream != nullptr && stream != g_tensor_stream) {
      std::ostringstream os;
      os << "fake runtime: a ready event recorded on stream " << stream
         << ", not on the tensor's stream " << g_tensor_stream;
      return hvd::Status::Internal(os.str());
    }
    *event = new int(0);
    return hvd::Status::OK();
  }
  void ReleaseEvent(void* event) override { delete static_cast<int*>(event); }
  hvd::Status RecordOnDevice(hvd::Device&, void** event) override {
    *event = new int(0);
    return hvd::Status::OK();
  }
  hvd::Status StreamWaitEvent(void*, void* event) override {
    return event ? hvd::Status::OK() : hvd::Status::Internal("null event");
  }
  int DeviceCount() override { return 1; }

  std::atomic<bool> refuse_events{false};  // CheckOneRankCannotUseItsDevice

 private:
  std::string uuid_;
};

// ---------------------------------------------------------------- collectives over host memory

// Calls taken by the fake communicators, by communicator size (by the thread that runs the
// engine's work: its background thread, or a caller under its run lock).
std::map<int, int> g_fake_calls;

// Device collectives standing in for NCCL on the fake device: hvd's host algorithms over the
// communicator's transport (the world, a process set's view, or a host's members). As NCCL,
// it has no 16-bit integers and leaves Adasum to the host path; set-up meets every member.
class FakeCollectives : public hvd::DeviceCollectives {
 public:
  explicit FakeCollectives(hvd::Transport& t) : t_(t) {}
  const char* name() const override { return "fake collectives"; }
  bool Reduces(DataType dtype, ReduceOp op) const override {
    return op != ReduceOp::kAdasum && dtype != DataType::kInt16 && dtype != DataType::kUInt16;
  }
  hvd::Status Allreduce(const void* in, void* out, size_t count, DataType dtype,
                        ReduceOp op) override {
    HVD_RETURN_IF_ERROR(Enter());
    if (in != out && count) std::memcpy(out, in, count * hvd::DataTypeSize(dtype));
    return hvd::Allreduce(t_, out, count, dtype, op, scratch_, Deadline());
  }
  hvd::Status Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    HVD_RETURN_IF_ERROR(Enter());
    return hvd::Allgatherv(t_, in, out, bytes, Deadline());
  }
  hvd::Status Broadcast(void* buf, size_t bytes, int root) override {
    HVD_RETURN_IF_ERROR(Enter());
    return hvd::Broadcast(t_, buf, bytes, root, Deadline());
  }
  hvd::Status Alltoallv(const void* in, const std::vector<size_t>& send, void* out,
                        const std::vector<size_t>& recv) override {
    HVD_RETURN_IF_ERROR(Enter());
    return hvd::Alltoallv(t_, in, send, out, recv, Deadline());
  }
  hvd::Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                            DataType dtype, ReduceOp op) override {
    HVD_RETURN_IF_ERROR(Enter());
    return hvd::ReduceScatter(t_, in, out, counts, dtype, op, scratch_, Deadline());
  }
  hvd::Status Check() override { return hvd::Status::OK(); }
  void Abort() override { aborted_ = true; }

 private:
  static hvd::Deadline Deadline() { return hvd::DeadlineAfterSeconds(60); }
  hvd::Status Enter() {
    if (aborted_) return hvd::Status::Aborted("the fake communicator was aborted");
    ++g_fake_calls[t_.size()];
    if (std::this_thread::get_id() == g_main_thread) ++g_calls_by_main;
    return hvd::Status::OK();
  }
  hvd::Transport& t_;
  hvd::ScratchBuffer scratch_;
  bool aborted_ = false;
};

hvd::StatusOr<std::unique_ptr<hvd::DeviceCollectives>> MakeFakeCollectives(
    hvd::Transport& t, hvd::Device&, hvd::Deadline deadline, hvd::PollFn) {
  if (std::this_thread::get_id() == g_main_thread) ++g_comms_by_main;
  HVD_RETURN_IF_ERROR(hvd::Barrier(t, deadline));
  return std::unique_ptr<hvd::DeviceCollectives>(new FakeCollectives(t));
}

// ---------------------------------------------------------------- device buffers

struct Env {
  hvd::Engine* e;
  hvd::Device* dev;  // the worker's own handle on the device (its own stream)
  int ordinal;
};

// A device copy of a host buffer, queued on the worker's stream (not waited for).
struct DevBuf {
  DevBuf(Env& env, const Buffer& host) : env(env), bytes(host.bytes.size()) {
    if (!env.dev->Allocate(bytes, &p).ok()) std::abort();
    if (!env.dev->Copy(p, host.data(), bytes).ok()) std::abort();
  }
  DevBuf(Env& env, size_t n) : env(env), bytes(n + 1) {
    if (!env.dev->Allocate(bytes, &p).ok()) std::abort();
  }
  ~DevBuf() { env.dev->Free(p); }
  TensorView View(DataType t, std::vector<int64_t> shape) const {
    TensorView v(p, t, std::move(shape), env.ordinal);
    v.stream = env.dev->stream();
    return v;
  }
  Env& env;
  size_t bytes;
  void* p = nullptr;
};

// Copies `bytes` of device memory back to the host and waits.
std::vector<uint8_t> ToHost(Env& env, const void* p, size_t bytes) {
  std::vector<uint8_t> out(bytes + 1);
  if (bytes) env.dev->Copy(out.data(), p, bytes);
  env.dev->Synchronize(hvd::DeadlineAfterSeconds(60), nullptr);
  return out;
}

// Waits for an operation; with stream-ordered completion the worker's stream then waits for
// its device work before anything the worker queues reads the results.
hvd::Status Done(Env& env, const hvd::HandlePtr& h) {
  hvd::Status s = WaitDone(h);
  if (s.ok()) s = h->StreamWait(env.dev->stream());
  return s;
}

// ---------------------------------------------------------------- checks

void CheckAllreduce(Env& env, Checker& ck) {
  ck.Begin("device allreduce");
  const int r = env.e->rank(), n = env.e->size();
  int64_t salt = 0;
  for (DataType t : AllDataTypes()) {
    for (ReduceOp op : AllReduceOps()) {
      if (t == DataType::kBool && op == ReduceOp::kAverage) continue;
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{33}, int64_t{70001}}) {
        for (bool in_place : {true, false}) {
          ++salt;
          Buffer host(t, count);
          for (int64_t i = 0; i < count; ++i) Put(t, host.data(), i, ReduceInput(t, op, r, n, i, salt));
          DevBuf in(env, host);
          DevBuf out(env, host.bytes.size());
          TensorView vin = in.View(t, {count});
          TensorView vout = in_place ? vin : out.View(t, {count});
          const std::string what = "allreduce " + Str(t) + " " + Str(op) + " count=" +
                                   std::to_string(count) + (in_place ? " in place" : "");
          auto h = env.e->Allreduce("dev.ar." + std::to_string(salt), vin, vout, op);
          if (!ck.ExpectOk(Done(env, h), what)) continue;
          auto got = ToHost(env, vout.data, static_cast<size_t>(count) * hvd::DataTypeSize(t));
          ck.ExpectElements(t, got.data(), count,
                            [&](int64_t i) { return ExpectedReduce(t, op, n, i, salt); }, what);
        }
      }
    }
  }
  ck.End();
}

// The last rank's device cannot take the tensor (a CUDA error as it is submitted): the
// operation fails on every rank with that rank's reason, instead of there alone while the others
// wait for it; the next operation works.
void CheckOneRankCannotUseItsDevice(Env& env, Checker& ck, FakeRuntime& rt) {
  ck.Begin("one rank cannot use its device");
  const int r = env.e->rank(), n = env.e->size();
  Buffer host(DataType::kFloat32, 5);
  for (int64_t i = 0; i < 5; ++i) Put(DataType::kFloat32, host.data(), i, 1.0);
  DevBuf buf(env, host);
  TensorView v = buf.View(DataType::kFloat32, {5});
  rt.refuse_events = r == n - 1;
  hvd::Status s = Done(env, env.e->Allreduce("dev.refused", v, v, ReduceOp::kSum));
  rt.refuse_events = false;
  ck.Expect(!s.ok() && s.message().find("this device records no event") != std::string::npos &&
                s.message().find("rank " + std::to_string(n - 1)) != std::string::npos,
            "the refusal reaches every rank: " + s.ToString());
  s = Done(env, env.e->Allreduce("dev.after_refused", v, v, ReduceOp::kSum));
  if (ck.ExpectOk(s, "the next allreduce")) {
    auto got = ToHost(env, v.data, 5 * sizeof(float));
    ck.ExpectElements(DataType::kFloat32, got.data(), 5, [&](int64_t) { return double(n); },
                      "the next allreduce's sum");
  }
  ck.End();
}

// Many tensors in flight at once, of sizes 0, 1 and odd: they fuse into the device fusion
// buffer (batched copies at aligned offsets), with and without scale factors.
void CheckFused(Env& env, Checker& ck) {
  ck.Begin("device fused allreduce");
  const int r = env.e->rank(), n = env.e->size();
  for (DataType t : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16, DataType::kInt64}) {
    for (int round = 0; round < 2; ++round) {
      const double pre = round ? 3.0 : 1.0, post = round ? 0.5 : 1.0;
      const ReduceOp op = round ? ReduceOp::kSum : ReduceOp::kAverage;
      std::vector<std::unique_ptr<DevBuf>> bufs;
      std::vector<hvd::HandlePtr> hs;
      std::vector<int64_t> counts;
      for (int k = 0; k < 40; ++k) {
        const int64_t count = k % 7 == 0 ? 0 : (k * 37) % 1000 + (k % 3);
        counts.push_back(count);
        Buffer host(t, count);
        for (int64_t i = 0; i < count; ++i) {
          // Multiples of 2n that stay exact in every dtype under x3 and x0.5.
          Put(t, host.data(), i, 2.0 * n * ((i + k + r) % 5));
        }
        bufs.push_back(std::make_unique<DevBuf>(env, host));
        TensorView v = bufs.back()->View(t, {count});
        hs.push_back(env.e->Allreduce("dev.fused." + Str(t) + "." + std::to_string(round) + "." +
                                          std::to_string(k),
                                      v, v, op, pre, post));
      }
      for (int k = 0; k < 40; ++k) {
        const std::string what = "fused " + Str(t) + " tensor " + std::to_string(k) +
                                 " count=" + std::to_string(counts[k]) + (round ? " scaled" : "");
        if (!ck.ExpectOk(Done(env, hs[k]), what)) continue;
        auto got = ToHost(env, bufs[k]->p, static_cast<size_t>(counts[k]) * hvd::DataTypeSize(t));
        ck.ExpectElements(t, got.data(), counts[k], [&](int64_t i) {
          double sum = 0;
          for (int q = 0; q < n; ++q) sum += pre * 2.0 * n * ((i + k + q) % 5);
          return op == ReduceOp::kAverage ? sum * post / n : sum * post;
        }, what);
      }
    }
  }
  ck.End();
}

void CheckMovement(Env& env, Checker& ck) {
  ck.Begin("device allgather, broadcast, alltoall");
  const int r = env.e->rank(), n = env.e->size();
  const int64_t width = 3;
  for (DataType t : {DataType::kFloat32, DataType::kUInt8, DataType::kInt16, DataType::kFloat64}) {
    // Allgather: rank q has q rows (rank 0 none).
    {
      Buffer host(t, r * width);
      for (int64_t i = 0; i < r * width; ++i) Put(t, host.data(), i, Pattern(t, r, i, 1));
      DevBuf in(env, host);
      auto h = env.e->Allgather("dev.ag." + Str(t), in.View(t, {r, width}));
      const std::string what = "allgather " + Str(t);
      if (ck.ExpectOk(Done(env, h), what)) {
        const int64_t rows = static_cast<int64_t>(n) * (n - 1) / 2;
        ck.Expect(h->output_shape() == std::vector<int64_t>{rows, width}, what + " shape");
        auto got = ToHost(env, h->output_data(), static_cast<size_t>(rows * width) * hvd::DataTypeSize(t));
        int64_t at = 0;
        std::vector<double> want;
        for (int q = 0; q < n; ++q) {
          for (int64_t i = 0; i < q * width; ++i) want.push_back(Pattern(t, q, i, 1));
        }
        (void)at;
        ck.ExpectElements(t, got.data(), rows * width, [&](int64_t i) { return want[i]; }, what);
      }
    }
    // Broadcast from every root, out of place.
    for (int root = 0; root < n; ++root) {
      const int64_t count = 1001;
      Buffer host(t, count);
      for (int64_t i = 0; i < count; ++i) Put(t, host.data(), i, Pattern(t, r, i, 2));
      DevBuf in(env, host);
      DevBuf out(env, host.bytes.size());
      auto h = env.e->Broadcast("dev.bc." + Str(t) + "." + std::to_string(root),
                                in.View(t, {count}), out.View(t, {count}), root);
      const std::string what = "broadcast " + Str(t) + " root " + std::to_string(root);
      if (!ck.ExpectOk(Done(env, h), what)) continue;
      auto got = ToHost(env, out.p, static_cast<size_t>(count) * hvd::DataTypeSize(t));
      ck.ExpectElements(t, got.data(), count, [&](int64_t i) { return Pattern(t, root, i, 2); }, what);
    }
    // Alltoall: rank q sends (q + j) % 3 rows to rank j.
    {
      std::vector<int64_t> splits(n);
      int64_t rows = 0;
      for (int j = 0; j < n; ++j) rows += splits[j] = (r + j) % 3;
      Buffer host(t, rows * width);
      int64_t at = 0;
      for (int j = 0; j < n; ++j) {
        for (int64_t k = 0; k < splits[j] * width; ++k) Put(t, host.data(), at++, Pattern(t, r * 7 + j, k, 3));
      }
      DevBuf in(env, host);
      auto h = env.e->Alltoall("dev.a2a." + Str(t), in.View(t, {rows, width}), splits);
      const std::string what = "alltoall " + Str(t);
      if (ck.ExpectOk(Done(env, h), what)) {
        std::vector<double> want;
        for (int q = 0; q < n; ++q) {
          for (int64_t k = 0; k < ((q + r) % 3) * width; ++k) want.push_back(Pattern(t, q * 7 + r, k, 3));
        }
        const int64_t got_rows = static_cast<int64_t>(want.size()) / width;
        ck.Expect(h->output_shape() == std::vector<int64_t>{got_rows, width}, what + " shape");
        auto got = ToHost(env, h->output_data(), want.size() * hvd::DataTypeSize(t));
        ck.ExpectElements(t, got.data(), static_cast<int64_t>(want.size()),
                          [&](int64_t i) { return want[i]; }, what);
      }
    }
  }
  ck.End();
}

void CheckReducescatter(Env& env, Checker& ck) {
  ck.Begin("device reducescatter");
  const int r = env.e->rank(), n = env.e->size();
  const int64_t width = 5;
  int64_t salt = 1000;
  for (DataType t : {DataType::kFloat32, DataType::kInt32, DataType::kBFloat16, DataType::kInt16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      for (int64_t rows : {static_cast<int64_t>(2 * n), static_cast<int64_t>(2 * n + 1)}) {
        ++salt;
        Buffer host(t, rows * width);
        for (int64_t i = 0; i < rows * width; ++i) Put(t, host.data(), i, ReduceInput(t, op, r, n, i, salt));
        DevBuf in(env, host);
        auto h = env.e->Reducescatter("dev.rs." + std::to_string(salt), in.View(t, {rows, width}), op);
        const std::string what = "reducescatter " + Str(t) + " " + Str(op) + " rows=" + std::to_string(rows);
        if (!ck.ExpectOk(Done(env, h), what)) continue;
        const RowShare share = ReducescatterShare(rows, n, r);
        const int64_t first = share.first, mine = share.count;
        ck.Expect(h->output_shape() == std::vector<int64_t>{mine, width}, what + " shape");
        auto got = ToHost(env, h->output_data(), static_cast<size_t>(mine * width) * hvd::DataTypeSize(t));
        ck.ExpectElements(t, got.data(), mine * width, [&](int64_t i) {
          return ExpectedReduce(t, op, n, first * width + i, salt);
        }, what);
      }
    }
  }
  ck.End();
}

// With HVD_DYNAMIC_PROCESS_SETS=1 and three ranks or more: allreduces on device tensors in a
// process set of the even ranks, one tensor and three fused, which runs on a communicator of
// its own (the world's cannot serve it).
// ---------------------------------------------------------------- Adasum

// The Adasum of two vectors from its definition, in float64 (a coefficient is 1 only below
// sqrt(DBL_MIN): zeros, in practice).
std::vector<double> AdasumPair(const std::vector<double>& a, const std::vector<double>& b) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double tiny = std::sqrt(std::numeric_limits<double>::min());
  const double ca = aa >= tiny ? 1 - dot / (2 * aa) : 1, cb = bb >= tiny ? 1 - dot / (2 * bb) : 1;
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

// Pairs (0, 1), (2, 3), ..., then pairs of pairs.
std::vector<double> AdasumTree(std::vector<std::vector<double>> level) {
  while (level.size() > 1) {
    std::vector<std::vector<double>> next;
    for (size_t i = 0; i < level.size(); i += 2) next.push_back(AdasumPair(level[i], level[i + 1]));
    level = std::move(next);
  }
  return level[0];
}

// Adasum of device tensors, several in one fused response, as Horovod computes it. Where the
// tensors run on the device collectives (`collectives`: NCCL, or the fake standing in for it),
// each host's members are summed and the hosts' sums combined by Adasum, divided by the members
// per host: on one host the average, on the fake hosts of two the Adasum of two sums over 2.
// Staged (a device shared, or HVD_GPU_OPERATIONS=cpu), it is the flat Adasum over the ranks,
// refused on every rank where their number is not a power of two; the next operation works.
void CheckAdasum(Env& env, Checker& ck, bool collectives) {
  ck.Begin("device Adasum");
  const int r = env.e->rank(), n = env.e->size();
  const int per_host = env.e->local_size(), hosts = env.e->cross_size();
  const bool by_hosts = collectives && per_host > 1;
  const bool refused = by_hosts ? (hosts & (hosts - 1)) != 0 : (n & (n - 1)) != 0;
  auto input = [](int q, size_t tensor, int64_t i) {
    // Exact in float16 (multiples of 1/4 up to 8): the reference rounds nothing.
    return 0.25 * static_cast<double>((i * (q + 3) + static_cast<int64_t>(tensor) * 5 + q) % 33) -
           4.0 + (tensor == 2 ? 0.5 * q : 0);
  };
  const std::vector<int64_t> counts = {0, 1, 33, 70001, 7};
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16}) {
    std::vector<std::unique_ptr<DevBuf>> bufs;
    std::vector<hvd::HandlePtr> hs;
    for (size_t k = 0; k < counts.size(); ++k) {
      Buffer host(t, counts[k]);
      for (int64_t i = 0; i < counts[k]; ++i) Put(t, host.data(), i, input(r, k, i));
      bufs.push_back(std::make_unique<DevBuf>(env, host));
      TensorView v = bufs.back()->View(t, {counts[k]});
      hs.push_back(env.e->Allreduce("dev.adasum." + Str(t) + "." + std::to_string(k), v, v,
                                    ReduceOp::kAdasum));
    }
    for (size_t k = 0; k < counts.size(); ++k) {
      const std::string what = "Adasum " + Str(t) + " tensor " + std::to_string(k) + " count=" +
                               std::to_string(counts[k]) + (by_hosts ? " (hosts)" : " (flat)");
      hvd::Status st = Done(env, hs[k]);
      if (refused) {
        const char* why = by_hosts ? "a number of hosts that is a power of two" : "power of two";
        ck.Expect(st.code() == hvd::StatusCode::kInvalidArgument &&
                      st.message().find(why) != std::string::npos,
                  what + " refused, got " + st.ToString());
        continue;
      }
      if (!ck.ExpectOk(st, what)) continue;
      std::vector<std::vector<double>> ranks(n, std::vector<double>(counts[k]));
      for (int q = 0; q < n; ++q) {
        for (int64_t i = 0; i < counts[k]; ++i) ranks[q][i] = input(q, k, i);
      }
      std::vector<double> want;
      if (!by_hosts) {
        want = AdasumTree(ranks);
      } else {  // hosts of consecutive ranks (hvdrun's and the fake hosts' layout)
        std::vector<std::vector<double>> sums(hosts, std::vector<double>(counts[k], 0.0));
        for (int q = 0; q < n; ++q) {
          for (int64_t i = 0; i < counts[k]; ++i) sums[q / per_host][i] += ranks[q][i];
        }
        want = AdasumTree(sums);
        for (double& w : want) w /= per_host;
      }
      auto got = ToHost(env, bufs[k]->p, static_cast<size_t>(counts[k]) * hvd::DataTypeSize(t));
      const double tol = t == DataType::kFloat16 ? 2e-2 : t == DataType::kFloat32 ? 1e-4 : 1e-9;
      bool ok = true;
      for (int64_t i = 0; i < counts[k] && ok; ++i) {
        const double have = Get(t, got.data(), static_cast<size_t>(i));
        if (!(std::fabs(have - want[i]) <= tol * (1 + std::fabs(want[i])))) {
          ok = ck.Expect(false, what + ": element " + std::to_string(i) + " is " +
                                    Checker::Num(have) + ", expected " + Checker::Num(want[i]));
        }
      }
      if (ok) ck.Expect(true, what);
    }
  }
  // The next operation works, refused or not.
  Buffer one(DataType::kFloat32, 3);
  for (int64_t i = 0; i < 3; ++i) Put(DataType::kFloat32, one.data(), i, 1.0);
  DevBuf after(env, one);
  TensorView v = after.View(DataType::kFloat32, {3});
  if (ck.ExpectOk(Done(env, env.e->Allreduce("dev.adasum.after", v, v, ReduceOp::kSum)),
                  "an allreduce after Adasum")) {
    auto got = ToHost(env, after.p, 3 * sizeof(float));
    ck.ExpectElements(DataType::kFloat32, got.data(), 3, [&](int64_t) { return double(n); },
                      "an allreduce after Adasum");
  }
  ck.End();
}

void CheckProcessSet(Env& env, Checker& ck) {
  const int r = env.e->rank(), n = env.e->size();
  if (n < 3 || !env.e->options().dynamic_process_sets) return;
  ck.Begin("device allreduce in a process set");
  std::vector<int> even;
  for (int q = 0; q < n; q += 2) even.push_back(q);
  auto id = env.e->AddProcessSet(even);
  if (!ck.ExpectOk(id.status(), "AddProcessSet of the even ranks")) {
    ck.End();
    return;
  }
  const int m = static_cast<int>(even.size());
  if (r % 2 == 0) {
    int64_t salt = 1000;
    for (DataType t : {DataType::kFloat32, DataType::kInt32}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        if (t == DataType::kInt32 && op == ReduceOp::kAverage) continue;
        for (int tensors : {1, 3}) {
          std::vector<std::unique_ptr<DevBuf>> bufs;
          std::vector<hvd::HandlePtr> hs;
          std::vector<int64_t> salts;
          const int64_t count = 1001;
          for (int k = 0; k < tensors; ++k) {
            salts.push_back(++salt);
            Buffer host(t, count);
            for (int64_t i = 0; i < count; ++i) {
              Put(t, host.data(), i, ReduceInput(t, op, r / 2, m, i, salts.back()));
            }
            bufs.push_back(std::make_unique<DevBuf>(env, host));
            TensorView v = bufs.back()->View(t, {count});
            hs.push_back(env.e->Allreduce("dev.set." + std::to_string(salts.back()), v, v, op,
                                          1.0, 1.0, *id));
          }
          for (int k = 0; k < tensors; ++k) {
            const std::string what = "set allreduce " + Str(t) + " " + Str(op) + " of " +
                                     std::to_string(tensors) + ", tensor " + std::to_string(k);
            if (!ck.ExpectOk(Done(env, hs[k]), what)) continue;
            auto got = ToHost(env, bufs[k]->p, static_cast<size_t>(count) * hvd::DataTypeSize(t));
            ck.ExpectElements(t, got.data(), count, [&](int64_t i) {
              return ExpectedReduce(t, op, m, i, salts[k]);
            }, what);
          }
        }
      }
    }
  }
  ck.ExpectOk(env.e->RemoveProcessSet(*id), "RemoveProcessSet");
  ck.End();
}

int RunPeerLoss(Env& env, int victim) {
  hvd::Engine& e = *env.e;
  const int r = e.rank();
  const double timeout = e.options().timeout_seconds;
  const int64_t count = 8 << 20;
  Buffer host(DataType::kFloat32, count);
  DevBuf buf(env, host);
  TensorView v = buf.View(DataType::kFloat32, {count});
  hvd::Status warm = Done(env, e.Allreduce("peerloss.warmup", v, v, ReduceOp::kSum));
  if (!warm.ok()) {
    std::printf("PEERLOSS-FAIL rank %d: warm-up failed: %s\n", r, warm.ToString().c_str());
    return 1;
  }
  if (r == victim) {  // most likely inside a step's collective, which takes most of the time
    std::thread([r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::printf("[mp] rank %d kills itself\n", r);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }).detach();
  }
  const auto t0 = Clock::now();
  hvd::Status st;
  int steps = 0;
  while (st.ok() && SecondsSince(t0) < timeout + 20) {
    st = Done(env, e.Allreduce("peerloss.step" + std::to_string(steps++), v, v, ReduceOp::kSum));
  }
  return PeerLossVerdict(e, victim, t0, steps, st, v);
}

// --join-first=device|none: the last rank joins before it has used a device, naming its device
// (device) or not (none); the others run device allreduces and then join. Naming it, the joined
// rank contributes zeros on that device and the others get the sum of their own values; not
// naming it, every rank's device allreduce fails, saying what to do, and the job still ends.
int RunJoinFirst(Env& env, bool name_device) {
  hvd::Engine& e = *env.e;
  const int r = e.rank(), n = e.size(), last = n - 1;
  Checker ck(r, n);
  ck.Begin(name_device ? "join(device) before any device tensor" : "join() before any device tensor");
  if (r == last) {
    auto h = name_device ? e.Join(env.ordinal) : e.Join();
    ck.ExpectOk(WaitDone(h), "join");
    ck.Expect(h->join_last_rank() >= 0 && h->join_last_rank() < n, "join_last_rank");
    ck.End();
    e.Shutdown();
    return ck.total_failures() ? 1 : 0;
  }
  for (int step = 0; step < 3; ++step) {
    const int64_t count = 1001;
    Buffer host(DataType::kFloat32, count);
    for (int64_t i = 0; i < count; ++i) Put(DataType::kFloat32, host.data(), i, (r + 1) * (i % 7));
    DevBuf buf(env, host);
    TensorView v = buf.View(DataType::kFloat32, {count});
    const std::string what = "device allreduce " + std::to_string(step) + " beside a joined rank";
    hvd::Status s = Done(env, e.Allreduce("joinfirst." + std::to_string(step), v, v, ReduceOp::kSum));
    if (!name_device) {
      ck.Expect(!s.ok() && s.message().find("ranks " + std::to_string(last)) != std::string::npos &&
                    s.message().find("join(device) names the device") != std::string::npos,
                what + " fails, naming the joined rank and how to name the device: " +
                    s.ToString());
      continue;
    }
    if (!ck.ExpectOk(s, what)) continue;
    auto got = ToHost(env, v.data, static_cast<size_t>(count) * sizeof(float));
    // Ranks 0..n-2 add (q + 1) * (i % 7); the joined rank adds zeros.
    ck.ExpectElements(DataType::kFloat32, got.data(), count,
                      [&](int64_t i) { return (n - 1) * n / 2.0 * (i % 7); }, what);
  }
  ck.ExpectOk(WaitDone(e.Join()), "join");
  ck.End();
  e.Shutdown();
  return ck.total_failures() ? 1 : 0;
}

// --latency=N: the engine's own cost per device operation, where no device work hides it. The
// median time of N device allreduces of 256 floats (fake device and collectives: host memcpys)
// beside N of host tensors, each from the call until Wait returns. Then which thread ran
// what: a caller that waits runs device collectives itself (not oversubscribed), but the
// device is opened, and the path agreed, on the background thread. Prints both and exits.
int RunLatency(Env& env, int iters) {
  hvd::Engine& e = *env.e;
  const int64_t count = 256;
  Buffer host(DataType::kFloat32, count);
  DevBuf buf(env, host);
  TensorView dv = buf.View(DataType::kFloat32, {count});
  TensorView hv(host.data(), DataType::kFloat32, {count});
  auto time = [&](const TensorView& v, const char* name) {
    std::vector<double> t;
    for (int i = 0; i < iters + iters / 10; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      hvd::Status s = Done(env, e.Allreduce(name, v, v, ReduceOp::kSum));
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (!s.ok()) {
        std::fprintf(stderr, "FAIL %s: %s\n", name, s.ToString().c_str());
        std::exit(1);
      }
      if (i >= iters / 10) t.push_back(us);  // the first tenth warms up
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double host_us = time(hv, "latency.host");
  const double dev_us = time(dv, "latency.device");
  std::printf("rank %d: allreduce of %lld floats, median of %d: host tensors %.2f us, device "
              "tensors %.2f us\n", e.rank(), static_cast<long long>(count), iters, host_us, dev_us);
  e.Shutdown();
  int calls = 0;
  for (const auto& kv : g_fake_calls) calls += kv.second;
  // (The worker opened its own device handle on its thread: one open there is its own.)
  std::printf("rank %d: device collectives run by the caller's thread: %d of %d. Devices "
              "opened by the engine on the caller's thread: %d, on another: %d\n",
              e.rank(), g_calls_by_main.load(), calls, g_opens_by_main.load() - 1,
              g_opens_elsewhere.load());
  // With more ranks than CPUs callers do not run the engine's work (EngineImpl, caller-driven
  // progress): the counts above then say nothing (ctest skips the test).
  const unsigned cpus = std::thread::hardware_concurrency();
  if (cpus < static_cast<unsigned>(e.local_size())) {
    std::printf("SKIP: %d ranks on %u CPUs: callers run no engine work there\n", e.local_size(),
                cpus);
  }
  return 0;
}

}  // namespace
}  // namespace mp

int main(int argc, char** argv) {
  std::string fake;
  bool fake_collectives = false;
  int victim = -1;
  std::string join_first;
  bool adasum_only = false;
  int latency = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--fake=", 0) == 0) {
      fake = a.substr(7);
    } else if (a == "--fake-collectives") {
      fake_collectives = true;
    } else if (a.rfind("--peerloss=", 0) == 0) {
      victim = std::atoi(a.c_str() + 11);
    } else if (a == "--join-first=device" || a == "--join-first=none") {
      join_first = a.substr(13);
    } else if (a == "--adasum-only") {
      adasum_only = true;
    } else if (a.rfind("--latency=", 0) == 0) {
      latency = std::atoi(a.c_str() + 10);
    } else {
      std::fprintf(stderr, "unknown argument %s: expected --fake=shared|own, --fake-collectives, "
                   "--peerloss=RANK, --join-first=device|none, --adasum-only, --latency=N\n", a.c_str());
      return 2;
    }
  }
  if (fake_collectives && fake.empty()) {
    std::fprintf(stderr, "--fake-collectives needs --fake=shared|own\n");
    return 2;
  }
  mp::g_main_thread = std::this_thread::get_id();
  if (fake_collectives) hvd::SetDeviceCollectivesForTesting(mp::MakeFakeCollectives);
  std::unique_ptr<mp::FakeRuntime> fake_rt;
  const char* rank_env = std::getenv("HVD_RANK");
  const int rank = rank_env ? std::atoi(rank_env) : 0;
  if (fake == "shared" || fake == "own") {
    fake_rt = std::make_unique<mp::FakeRuntime>(fake == "shared" ? "fake-shared" : "fake-" + std::to_string(rank));
    hvd::SetDeviceRuntimeForTesting(fake_rt.get());
  } else if (!fake.empty()) {
    std::fprintf(stderr, "--fake=%s: expected shared or own\n", fake.c_str());
    return 2;
  }
  hvd::DeviceRuntime* rt = hvd::GetDeviceRuntime();
  const int count = rt ? rt->DeviceCount() : 0;
  if (count == 0) {
    std::printf("SKIP: %s\n", rt ? "no CUDA device is visible to this process"
                                 : "this build has no CUDA");
    return 77;
  }
  auto engine = hvd::Engine::CreateFromEnvironment();
  if (!engine.ok()) {
    std::fprintf(stderr, "FAIL init: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  hvd::Engine& e = **engine;
  const int ordinal = e.local_rank() % count;
  auto dev = rt->Open(ordinal);
  if (!dev.ok()) {
    std::fprintf(stderr, "FAIL opening device %d: %s\n", ordinal, dev.status().ToString().c_str());
    return 1;
  }
  mp::Env env{&e, dev->get(), ordinal};
  if (fake_rt) mp::g_tensor_stream = env.dev->stream();
  // Communicators are made where the engine sets device work up: on its background thread,
  // never on a caller's (EngineImpl::CallerMayExecute).
  auto set_up_apart = [&e](int rc) {
    if (mp::g_comms_by_main.load() == 0) return rc;
    std::printf("FAIL rank %d: %d device communicators were made on the caller's thread\n",
                e.rank(), mp::g_comms_by_main.load());
    return 1;
  };
  if (victim >= 0) return set_up_apart(mp::RunPeerLoss(env, victim));
  if (latency > 0) return set_up_apart(mp::RunLatency(env, latency));
  if (!join_first.empty()) return set_up_apart(mp::RunJoinFirst(env, join_first == "device"));
  mp::Checker ck(e.rank(), e.size());
  if (!adasum_only) {
    mp::CheckAllreduce(env, ck);
    mp::CheckFused(env, ck);
    mp::CheckMovement(env, ck);
    mp::CheckReducescatter(env, ck);
    mp::CheckProcessSet(env, ck);
    if (fake_rt) mp::CheckOneRankCannotUseItsDevice(env, ck, *fake_rt);
  }
  const char* gpu_ops = std::getenv("HVD_GPU_OPERATIONS");
  mp::CheckAdasum(env, ck, fake_collectives && fake == "own" &&
                               !(gpu_ops && std::string(gpu_ops) == "cpu"));
  e.Shutdown();
  if (fake_rt) std::printf("rank %d: %d batched copies waited for a synchronize\n", e.rank(),
                           mp::FakeDevice::table_full_.load());
  if (fake_collectives) {  // read after the background thread has stopped
    for (const auto& [size, calls] : mp::g_fake_calls) {
      std::printf("rank %d: fake collectives of %d ranks took %d calls\n", e.rank(), size, calls);
    }
  }
  return set_up_apart(ck.total_failures() ? 1 : 0);
}
