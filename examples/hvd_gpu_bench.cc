// GPU benchmarks (built with CUDA), each against the bare operation it wraps, in one run:
//
//   hvd_gpu_bench --copy                 the batched fusion copy of N tensors (one kernel)
//                                        against one cudaMemcpyAsync of the same bytes
//   hvd_gpu_bench --nccl                 one rank: hvd's allreduce of a CUDA tensor (through
//                                        the engine and NCCL) against a bare ncclAllReduce
//   hvdrun -np 2 hvd_gpu_bench --staging ranks sharing a GPU (staged through pinned host
//                                        memory): hvd's allreduce of CUDA tensors against a
//                                        D2H + H2D copy of the same bytes and against hvd's
//                                        allreduce of the same bytes in host memory
//
// Tables use nccl-tests' columns (size, count, type, time, algbw, busbw) and add the ratio to
// the reference. Times are medians of --iters timed runs after --warmup untimed ones; device
// copies are timed with CUDA events on the stream they run on; allreduces (hvd's and the bare
// one alike) from the call until the host has the result.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/device.h"
#include "hvd/config.h"
#include "hvd/engine.h"

#if HVD_HAVE_NCCL
#include <nccl.h>
#endif

namespace {

int g_warmup = 5, g_iters = 20;

#define CHECK_CUDA(x)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of fn() timed with events on `stream`.
template <typename Fn>
double TimeOnStream(cudaStream_t stream, Fn fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < g_warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < g_iters; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    fn();
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(t);
}

template <typename Fn>
double TimeOnHost(Fn fn) {
  for (int i = 0; i < g_warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < g_iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(t);
}

void Header(const char* extra) {
  std::printf("%12s %12s %8s %10s %8s %8s %s\n", "size(B)", "count", "type", "time(us)",
              "algbw", "busbw", extra);
}

void Row(size_t bytes, const char* type, size_t esize, double sec, double busfactor,
         const std::string& extra) {
  const double algbw = bytes / sec / 1e9;
  std::printf("%12zu %12zu %8s %10.1f %8.2f %8.2f %s\n", bytes, bytes / esize, type, sec * 1e6,
              algbw, algbw * busfactor, extra.c_str());
}

std::string Ratio(const char* what, double ratio) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s %.3f", what, ratio);
  return buf;
}

hvd::Device* OpenDevice(int ordinal) {
  hvd::DeviceRuntime* rt = hvd::CudaRuntime();
  if (rt == nullptr || rt->DeviceCount() == 0) {
    std::printf("SKIP: no CUDA device\n");
    std::exit(0);
  }
  auto d = rt->Open(ordinal);
  if (!d.ok()) {
    std::fprintf(stderr, "%s\n", d.status().ToString().c_str());
    std::exit(1);
  }
  return d->release();
}

// ---------------------------------------------------------------- --copy

void BenchCopy(int tensors) {
  hvd::Device* dev = OpenDevice(0);
  auto stream = static_cast<cudaStream_t>(dev->stream());
  std::mt19937 rng(42);
  std::printf("# batched fusion copy: %d tensors, sizes drawn from [lo, hi], packed at 16-byte "
              "offsets, against one cudaMemcpyAsync (D2D) of the same bytes; bandwidth counts "
              "bytes copied once\n", tensors);
  std::printf("%10s %10s %12s %12s %12s %12s %8s\n", "lo(KiB)", "hi(KiB)", "bytes",
              "batched(us)", "memcpy(us)", "batched GB/s", "ratio");
  const std::pair<size_t, size_t> ranges[] = {{4, 4}, {4, 64}, {16, 16}, {64, 64}};
  for (auto [lo, hi] : ranges) {
    std::uniform_int_distribution<size_t> pick(lo * 1024, hi * 1024);
    std::vector<size_t> sizes(tensors);
    for (auto& s : sizes) s = pick(rng) / 4 * 4;
    std::vector<size_t> offsets;
    const size_t total = hvd::AlignedOffsets(sizes, &offsets);
    size_t payload = 0;
    for (size_t s : sizes) payload += s;
    // Tensors in their own allocations, as a framework's are.
    std::vector<void*> srcs(tensors);
    for (int i = 0; i < tensors; ++i) {
      CHECK_CUDA(cudaMalloc(&srcs[i], sizes[i]));
      CHECK_CUDA(cudaMemset(srcs[i], i & 255, sizes[i]));
    }
    void *fusion, *flat_src;
    CHECK_CUDA(cudaMalloc(&fusion, total));
    CHECK_CUDA(cudaMalloc(&flat_src, total));
    std::vector<hvd::CopySpan> spans;
    for (int i = 0; i < tensors; ++i) {
      spans.push_back({srcs[i], static_cast<char*>(fusion) + offsets[i], sizes[i]});
    }
    double batched = TimeOnStream(stream, [&] {
      auto s = dev->BatchedCopy(spans);
      if (s.code() == hvd::StatusCode::kResourceExhausted) {  // its table is full: as the engine
        dev->Synchronize(hvd::NoDeadline(), nullptr);
        s = dev->BatchedCopy(spans);
      }
      if (!s.ok()) {
        std::fprintf(stderr, "FAIL batched copy: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    });
    dev->Synchronize(hvd::NoDeadline(), nullptr);
    // Check: every byte of every tensor landed.
    std::vector<unsigned char> host(total);
    CHECK_CUDA(cudaMemcpy(host.data(), fusion, total, cudaMemcpyDeviceToHost));
    for (int i = 0; i < tensors; ++i) {
      for (size_t k = 0; k < sizes[i]; k += 997) {
        if (host[offsets[i] + k] != (i & 255)) {
          std::fprintf(stderr, "FAIL batched copy: tensor %d byte %zu\n", i, k);
          std::exit(1);
        }
      }
    }
    double flat = TimeOnStream(stream, [&] {
      CHECK_CUDA(cudaMemcpyAsync(fusion, flat_src, payload, cudaMemcpyDeviceToDevice, stream));
    });
    std::printf("%10zu %10zu %12zu %12.1f %12.1f %12.1f %8.3f\n", lo, hi, payload, batched * 1e6,
                flat * 1e6, payload / batched / 1e9, flat / batched);
    for (void* p : srcs) cudaFree(p);
    cudaFree(fusion);
    cudaFree(flat_src);
  }
}

// ---------------------------------------------------------------- --nccl

#if HVD_HAVE_NCCL
#define CHECK_NCCL(x)                                                                    \
  do {                                                                                   \
    ncclResult_t r_ = (x);                                                               \
    if (r_ != ncclSuccess && r_ != ncclInProgress) {                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

// A non-blocking communicator's call taken (the engine's NcclCollectives::Settle, less its
// control-plane polls).
void SettleNccl(ncclComm_t comm) {
  for (;;) {
    ncclResult_t st = ncclSuccess;
    CHECK_NCCL(ncclCommGetAsyncError(comm, &st));
    if (st == ncclSuccess) return;
    CHECK_NCCL(st);
  }
}
#endif

// One rank: hvd's allreduce against the bare ncclAllReduce, with two rows between them that
// make the same CUDA and NCCL calls as the engine does but from the calling thread, so that the
// table splits hvd's fixed cost into what its ordering and NCCL mode cost and what the engine
// (its threads, negotiation, bookkeeping) adds:
//   bare ncclAllReduce      blocking communicator, on the caller's stream, cudaStreamSynchronize
//   + ready event           the same on a second stream that waits for an event recorded on the
//                           caller's (hvd's engine stream waits for the caller's)
//   hvd's calls, no engine  + a non-blocking communicator (its error looked at before, the call
//                           settled after) and the stream's completion found by polling
//                           cudaStreamQuery with yields (Device::Synchronize)
//   hvd                     Engine::Allreduce and Wait
void BenchNccl(size_t max_bytes) {
#if HVD_HAVE_NCCL
  hvd::Device* dev = OpenDevice(0);
  auto stream = static_cast<cudaStream_t>(dev->stream());
  auto engine = hvd::Engine::CreateFromEnvironment();
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    std::exit(1);
  }
  ncclComm_t comm;
  int devs[1] = {0};
  CHECK_NCCL(ncclCommInitAll(&comm, 1, devs));
  ncclComm_t nb_comm;  // as the engine makes its own
  {
    ncclUniqueId id;
    CHECK_NCCL(ncclGetUniqueId(&id));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    CHECK_NCCL(ncclCommInitRankConfig(&nb_comm, 1, id, 0, &config));
    SettleNccl(nb_comm);
  }
  cudaStream_t side;
  CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t ready;
  CHECK_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  std::printf("# allreduce float32 sum, one rank on cuda:0, out of place: hvd (engine, NCCL%s) "
              "against a bare ncclAllReduce on a stream, each timed from the call until the "
              "host sees the result; ratio = bare time / this row's time. Between them, the "
              "calls hvd makes, from the calling thread: '+ ready event' orders a second "
              "stream after the caller's, 'hvd's calls' adds a non-blocking communicator and "
              "completion found by polling\n",
              (*engine)->options().async_completion ? ", stream-ordered completion" : "");
  Header("");
  void *in, *out;
  CHECK_CUDA(cudaMalloc(&in, max_bytes));
  CHECK_CUDA(cudaMalloc(&out, max_bytes));
  CHECK_CUDA(cudaMemset(in, 0x3c, max_bytes));  // not zeros: 0.0115 in every float
  for (size_t bytes = 1 << 20; bytes <= max_bytes; bytes *= 4) {
    const size_t count = bytes / 4;
    double bare = TimeOnHost([&] {
      CHECK_NCCL(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
    });
    double ordered = TimeOnHost([&] {
      CHECK_CUDA(cudaEventRecord(ready, stream));
      CHECK_CUDA(cudaStreamWaitEvent(side, ready, 0));
      CHECK_NCCL(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, side));
      CHECK_CUDA(cudaStreamSynchronize(side));
    });
    double calls = TimeOnHost([&] {
      int current = -1;
      CHECK_CUDA(cudaGetDevice(&current));  // the engine's DeviceScope
      CHECK_CUDA(cudaEventRecord(ready, stream));
      CHECK_CUDA(cudaStreamWaitEvent(side, ready, 0));
      ncclResult_t st = ncclSuccess;
      CHECK_NCCL(ncclCommGetAsyncError(nb_comm, &st));
      CHECK_NCCL(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, nb_comm, side));
      SettleNccl(nb_comm);
      for (;;) {
        cudaError_t e = cudaStreamQuery(side);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) CHECK_CUDA(e);
        std::this_thread::yield();
      }
    });
    hvd::TensorView vin(in, hvd::DataType::kFloat32, {static_cast<int64_t>(count)}, 0);
    hvd::TensorView vout(out, hvd::DataType::kFloat32, {static_cast<int64_t>(count)}, 0);
    vin.stream = stream;
    double mine = TimeOnHost([&] {
      auto h = (*engine)->Allreduce("bench", vin, vout, hvd::ReduceOp::kSum);
      auto s = h->Wait();
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        std::exit(1);
      }
      // Stream-ordered completion (HVD_ENABLE_ASYNC_COMPLETION=1): the host waits for the event.
      if (h->cuda_event()) CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(h->cuda_event())));
    });
    Row(bytes, "float", 4, mine, 1.0, Ratio("hvd; bare/hvd", bare / mine));
    Row(bytes, "float", 4, calls, 1.0, Ratio("hvd's calls, no engine;", bare / calls));
    Row(bytes, "float", 4, ordered, 1.0, Ratio("+ ready event;", bare / ordered));
    Row(bytes, "float", 4, bare, 1.0, "bare ncclAllReduce");
  }
  cudaEventDestroy(ready);
  cudaStreamDestroy(side);
  ncclCommDestroy(nb_comm);
  ncclCommDestroy(comm);
  (*engine)->Shutdown();
#else
  std::printf("SKIP: this build has no NCCL\n");
#endif
}

// ---------------------------------------------------------------- --staging

void BenchStaging(size_t max_bytes) {
  auto engine = hvd::Engine::CreateFromEnvironment();
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    std::exit(1);
  }
  hvd::Engine& e = **engine;
  hvd::Device* dev = OpenDevice(0);
  auto stream = static_cast<cudaStream_t>(dev->stream());
  const int n = e.size();
  const double bus = 2.0 * (n - 1) / n;
  if (e.rank() == 0) {
    const char* piece = std::getenv("HVD_STAGING_PIECE_BYTES");
    std::printf("# allreduce float32 sum, %d ranks sharing cuda:0, staged through pinned host "
                "memory in pieces (HVD_STAGING_PIECE_BYTES=%s): CUDA tensors against a D2H + H2D "
                "copy of the same bytes (pinned) and against host tensors of the same size\n",
                n, piece ? piece : "default");
    Header("");
  }
  void* dbuf;
  CHECK_CUDA(cudaMalloc(&dbuf, max_bytes));
  CHECK_CUDA(cudaMemset(dbuf, 0, max_bytes));
  std::vector<float> hbuf(max_bytes / 4, 1.0f);
  void* pinned;
  CHECK_CUDA(cudaHostAlloc(&pinned, max_bytes, cudaHostAllocDefault));
  for (size_t bytes = 1 << 16; bytes <= max_bytes; bytes *= 4) {
    const int64_t count = static_cast<int64_t>(bytes / 4);
    hvd::TensorView dv(dbuf, hvd::DataType::kFloat32, {count}, 0);
    dv.stream = stream;
    hvd::TensorView hv(hbuf.data(), hvd::DataType::kFloat32, {count});
    auto run = [&](const hvd::TensorView& v, const char* name) {
      return TimeOnHost([&] {
        auto s = e.Allreduce(name, v, v, hvd::ReduceOp::kSum)->Wait();
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          std::exit(1);
        }
      });
    };
    double device = run(dv, "bench.device");
    double host = run(hv, "bench.host");
    double copies = TimeOnStream(stream, [&] {
      CHECK_CUDA(cudaMemcpyAsync(pinned, dbuf, bytes, cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaMemcpyAsync(dbuf, pinned, bytes, cudaMemcpyHostToDevice, stream));
    });
    if (e.rank() == 0) {
      Row(bytes, "float", 4, device, bus, Ratio("cuda tensors; host tensors' time / this", host / device));
      Row(bytes, "float", 4, host, bus, "host tensors");
      Row(bytes, "float", 4, copies, 1.0, "D2H + H2D copy (no reduction)");
    }
  }
  e.Shutdown();
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode;
  int tensors = 1000;
  size_t max_bytes = 1u << 30;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--copy" || a == "--nccl" || a == "--staging") mode = a;
    else if (a.rfind("--tensors=", 0) == 0) tensors = std::atoi(a.c_str() + 10);
    else if (a.rfind("--max-bytes=", 0) == 0) max_bytes = std::strtoull(a.c_str() + 12, nullptr, 10);
    else if (a.rfind("--iters=", 0) == 0) g_iters = std::atoi(a.c_str() + 8);
    else if (a.rfind("--warmup=", 0) == 0) g_warmup = std::atoi(a.c_str() + 9);
    else {
      std::fprintf(stderr, "usage: hvd_gpu_bench --copy|--nccl|--staging [--tensors=N] "
                           "[--max-bytes=B] [--iters=N] [--warmup=N]\n");
      return 2;
    }
  }
  if (mode == "--copy") BenchCopy(tensors);
  else if (mode == "--nccl") BenchNccl(max_bytes);
  else if (mode == "--staging") BenchStaging(max_bytes);
  else {
    std::fprintf(stderr, "hvd_gpu_bench: give --copy, --nccl or --staging\n");
    return 2;
  }
  return 0;
}
