// The engine behind hvd::Engine: the caller-facing queue and the background thread that owns
// negotiation, the transport and execution.
//
// Threads:
//   - Caller threads call Enqueue*/Shutdown only. They validate, put a TensorEntry on queue_
//     (under mu_), raise queued_, and wake the background thread with a no-op handler posted
//     to io_ when it sleeps (Wake()).
//   - The background thread runs Loop(): it drains the queue into pending_ and announces the
//     new requests to the coordinator; on rank 0 it also computes and broadcasts responses; it
//     executes responses in order; between those it sleeps in io_.run_one_for(), which wakes on
//     a posted enqueue, a control message, or the idle tick. It is the only thread that touches
//     io_'s sockets, the transport, the coordinator, pending_ and the execution queue.
//
// Thread-safety: Enqueue*, Shutdown and the accessors may be called from any thread.
#pragma once

#include <asio.hpp>
#include <atomic>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "collectives/collectives.h"
#include "coordinator/coordinator.h"
#include "coordinator/messages.h"
#include "coordinator/response_cache.h"
#include "device/device.h"
#include "engine/timeline.h"
#include "hvd/engine.h"
#include "planner/plan.h"
#include "transport/control.h"
#include "transport/device_collectives.h"
#include "transport/group_view.h"
#include "transport/transport.h"

namespace hvd {

class JobBackends;  // transport/transport_factory.h

// The message of an exception caught with catch (...) (execute.cc).
std::string ExceptionMessage(std::exception_ptr p);

// Where the bytes of gather-like responses go (execute.cc), the same on the host and the
// device paths. `local_shape` is this rank's tensor's; the output shape is it with the first
// dimension replaced.
struct AllgatherLayout {
  std::vector<size_t> bytes;  // [rank]
  size_t total = 0;
  std::vector<int64_t> shape;
};
AllgatherLayout LayOutAllgather(const Response& r, int size, std::vector<int64_t> local_shape);
struct AlltoallLayout {
  std::vector<size_t> send, recv;  // bytes to and from each rank
  std::vector<int64_t> received_splits;
  size_t total = 0;  // received
  std::vector<int64_t> shape;
  size_t row_bytes = 0;
};
AlltoallLayout LayOutAlltoall(const Response& r, int size, int rank,
                              std::vector<int64_t> local_shape);
// Reducescatter: each rank's part of the first dimension, in elements (the first rows % size
// ranks get one row more).
struct ReducescatterLayout {
  std::vector<size_t> counts;
  size_t total = 0;  // elements of the whole input
  std::vector<int64_t> shape;  // this rank's part
};
ReducescatterLayout LayOutReducescatter(const Response& r, int size, int rank);

// One submitted operation, from enqueue until its handle completes.
struct TensorEntry {
  Request request;
  TensorView input;
  TensorView output;
  OutputAllocator allocator;
  HandlePtr handle;
  // Device tensors: an event recorded at submission on the caller's stream
  // (DeviceRuntime::RecordEvent), released when the entry goes.
  std::shared_ptr<void> ready_event;
  // Benchmark hook: runs on the background thread instead of negotiating (see hvd/raw.h).
  std::function<Status(Transport&, ScratchBuffer&)> raw;
};

class EngineImpl {
 public:
  static StatusOr<std::unique_ptr<EngineImpl>> Create(const Options& options);
  ~EngineImpl();

  const Options& options() const { return options_; }
  HandlePtr Enqueue(TensorEntry entry);
  std::vector<HandlePtr> EnqueueGroup(std::vector<TensorEntry> entries);
  Status Shutdown();
  // Counters for tests and the benchmark.
  uint64_t responses_executed() const { return responses_executed_.load(); }
  uint64_t cache_hits() const { return cache_hits_.load(); }

 private:
  explicit EngineImpl(const Options& options);
  Status Connect();
  Status SetUpViews(const Topology& topology, const std::string& why);
  void Wake();

  // Caller side.
  Status ValidateLocked(const TensorEntry& e) const;  // needs mu_ (reads in_flight_)

  // Background thread (background.cc).
  void Loop();
  void RunLoop();
  bool DrainQueue();
  void StopPolling();  // lowers the poller's flag before a wait that does not poll it
  void Announce(std::vector<Request> requests);
  void OnControlMessage(int peer, uint8_t type, std::vector<uint8_t>&& payload);
  void OnControlError(int peer, const std::string& what,
                      StatusCode code = StatusCode::kPeerLost);
  void StartHeartbeat();
  void OnHeartbeatTimer();
  Status AwaitRootCause(const Status& local);
  void CoordinatorStep();
  Clock::duration CycleRemaining() const;
  Status OnRequests(int peer, RequestList&& list);
  // Rank 0's fast path for cached tensors (background.cc).
  void OfferBit(int rank, uint32_t bit);
  void AddFull(int rank, std::vector<Request> requests);
  void DemoteBit(uint32_t bit, const Request* as = nullptr);
  std::vector<uint64_t> AgreedBits() const;  // the AND of every rank's row; empty if none
  std::vector<uint64_t> AgreeOnBits();        // the same, taken out of the rows
  Clock::duration CycleWindow() const;
  void DemoteLateBits(Clock::time_point now);
  void ApplyOnRankZero(const std::vector<Response>& list);
  Status OnResponses(ResponseList&& list);
  void BroadcastControl(uint8_t type, std::shared_ptr<const std::vector<uint8_t>> payload);
  void FailAll(const Status& status, bool notify = true);
  void CompleteEntry(TensorEntry& e, const Status& status);
  void FinishShutdown(int requested_by);
  void FlushControl(Deadline deadline);

  // Execution (execute.cc).
  // The most memory any rank may need for one response, computed from the response alone, so
  // that every rank makes the same decision about agreeing on it.
  struct MemoryNeeds {
    size_t fusion = 0;   // of the fusion buffer
    size_t scratch = 0;  // of the algorithm's scratch
    size_t output = 0;   // of a newly allocated output (allgather, alltoall, reducescatter)
  };
  void Execute(const Response& r);
  Status Run(const Response& r, std::vector<TensorEntry*>& entries);
  Status Reserve(const MemoryNeeds& need, size_t fusion, void** fusion_out,
                 Status local = Status::OK(), size_t missing = 0);
  Status AgreeOnMemory(const MemoryNeeds& need, const Status& local, size_t missing);
  void Abandon(const Status& why);
  Status ExecuteAllreduce(const Response& r, std::vector<TensorEntry*>& entries);
  Status ExecuteAllgather(const Response& r, TensorEntry* e);
  Status ExecuteBroadcast(const Response& r, TensorEntry* e);
  Status ExecuteAlltoall(const Response& r, TensorEntry* e);
  Status ExecuteReducescatter(const Response& r, TensorEntry* e);
  void* AllocateOutput(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes);
  Deadline CollectiveDeadline() const;

  // Device tensors (execute_device.cc).
  Status RecordReady(TensorEntry& e);  // caller side
  Status ExecuteOnDevice(const Response& r, std::vector<TensorEntry*>& entries);
  Status OpenDevice(const std::vector<TensorEntry*>& entries);
  Status ChooseDevicePath(const Status& opened);
  Status PollDuringDeviceWait();
  Status DeviceSynchronize();
  Status DeviceDone(const std::vector<TensorEntry*>& entries);
  Status RunDeviceCollective(const Response& r, std::vector<TensorEntry*>& entries);
  Status RunStaged(const Response& r, std::vector<TensorEntry*>& entries, bool* host_failed);
  Status DeviceAllreduce(const Response& r, std::vector<TensorEntry*>& entries);
  Status DeviceAllgather(const Response& r, TensorEntry* e);
  Status DeviceBroadcast(const Response& r, TensorEntry* e);
  Status DeviceAlltoall(const Response& r, TensorEntry* e);
  Status DeviceReducescatter(const Response& r, TensorEntry* e);
  Status AllocateDeviceOutput(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes,
                              void** out);

  const Options options_;

  // Caller side, guarded by mu_.
  mutable std::mutex mu_;
  std::deque<TensorEntry> queue_;
  std::unordered_set<std::string> in_flight_;  // names queued or pending on this rank
  Status dead_;                                // set once: later operations fail with it
  bool shutdown_requested_ = false;
  uint64_t barrier_count_ = 0;
  std::atomic<bool> wake_posted_{false};
  std::atomic<bool> queued_{false};    // the queue may hold entries the background has not seen
  std::atomic<bool> sleeping_{false};  // the background thread sleeps in io_ (or is about to)

  // Background side.
  asio::io_context io_;
  // MPI and the Slurm-hosted store when used (transport/transport_factory.h); declared before
  // transport_ so that it outlives the transport that points at its offload.
  std::unique_ptr<JobBackends> backends_;
  std::unique_ptr<Transport> transport_;
  // This host's ranks and the ranks with this rank's local index across hosts: views of
  // transport_, set when the layout allows hierarchical collectives (plan_.hierarchical).
  std::unique_ptr<GroupView> local_view_, cross_view_;
  // With the views: the world ranks of each host, hosts in cross_view_'s order, ranks in
  // local_view_'s (the hierarchical allgather's layout).
  std::vector<std::vector<int>> hosts_;
  PlanContext plan_;
  std::vector<std::shared_ptr<ControlLink>> control_;  // rank 0: [peer]; worker: [0]
  std::shared_ptr<ControlPoller> poller_;  // links the io_context alone does not drive; or null
  bool polling_ = false;  // poller_ is told this thread polls it (only while it spins idle)
  bool control_over_tcp_ = true;  // some control link is read by the io_context
  Clock::time_point io_polled_;   // when the spinning loop last polled the io_context
  std::unique_ptr<Coordinator> coordinator_;              // rank 0 only
  std::unique_ptr<ResponseCache> cache_;                  // identical on every rank
  std::vector<uint64_t> worker_epochs_;                   // rank 0: each worker's cache epoch
  // Rank 0's fast path: [rank][word] cached tensors announced and not yet agreed on; [bit] when
  // the first rank announced it (zero: no rank has); whether a row changed since the last AND.
  std::vector<std::vector<uint64_t>> ready_bits_;
  std::vector<Clock::time_point> bit_since_;
  bool bits_changed_ = false;
  Clock::time_point bits_checked_;
  Clock::time_point agreed_since_;  // when the oldest agreed bit not yet sent became agreed
  std::unordered_map<std::string, TensorEntry> pending_;  // announced, awaiting execution
  std::deque<Response> to_execute_;
  std::unique_ptr<Timeline> timeline_;
  ScratchBuffer scratch_;
  ScratchBuffer fusion_;
  // Device tensors (execute_device.cc): this rank's device, opened at its first device
  // response; how the ranks agreed to run device collectives, at that response; the device
  // fusion buffer and the pinned host staging buffer. Declared in the order they go.
  std::shared_ptr<Device> device_;
  enum class DevicePath { kUnknown, kCollectives, kStaging };
  DevicePath device_path_ = DevicePath::kUnknown;
  DeviceBuffer device_fusion_;
  DeviceBuffer host_staging_{true};
  std::unique_ptr<DeviceCollectives> device_collectives_;
  size_t agreed_fusion_ = 0;   // sizes every rank has agreed it holds (execute.cc, step 2)
  size_t agreed_scratch_ = 0;
  bool abandon_ = false;       // this rank failed alone inside the response being executed
  bool joined_ = false;
  bool shutdown_sent_ = false;
  Deadline shutdown_deadline_ = NoDeadline();
  int shutdown_by_ = -1;   // the rank whose shutdown ends the job, once known
  Status abort_;           // set by a control message or a lost peer
  std::unique_ptr<asio::steady_timer> heartbeat_;
  std::chrono::microseconds spin_{0};  // polling window before sleeping (HVD_SPIN_MICROSECONDS)
  std::chrono::microseconds wait_spin_{0};  // the same for callers' Wait (0: oversubscribed)
  Clock::time_point last_work_;
  std::vector<Clock::time_point> last_heard_;  // per control peer
  bool done_ = false;
  std::atomic<uint64_t> responses_executed_{0};
  std::atomic<uint64_t> cache_hits_{0};
  std::mutex join_mu_;  // serialises joining thread_
  std::thread thread_;
};

}  // namespace hvd
