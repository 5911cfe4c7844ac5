// The engine behind hvd::Engine: the caller-facing queue and the background thread that owns
// negotiation, the transport and execution.
//
// Threads:
//   - Caller threads call Enqueue*/Shutdown only. They validate, move each TensorEntry into
//     its name's node of in_flight_ and put the node on queue_ (under mu_), raise queued_, and
//     wake the background thread with a no-op handler posted to io_ when it sleeps (Wake()).
//   - The background thread runs Loop(): it drains the queue (the entries stay in their nodes)
//     and announces the new requests to the coordinator; on rank 0 it also computes and
//     broadcasts responses; it executes responses in order; between those it sleeps in
//     io_.run_one_for(), which wakes on a posted enqueue, a control message, or the idle tick.
//     It is the only thread that touches io_'s sockets, the transport, the coordinator, the
//     entries it has drained and the execution queue, save a waiting caller that runs its work
//     in its place (below).
//   - in_flight_: its structure (nodes made live or free, lookups by name) is guarded by mu_. A
//     live node's entry is written by the caller that submits it, under mu_, and from the
//     drain on it is the background thread's alone until it releases the node (under mu_).
//     Only the background thread sweeps free nodes (NameTable::erasures()), so the pointers it
//     keeps to nodes (ProcessSetState::node_of_bit) are checked against a count no other
//     thread changes.
//
// Caller-driven progress. The loop's work (draining, negotiating, executing) runs under one
// lock, ProgressHelper::run, which the background thread holds while it runs. A caller that
// waits on a handle (Handle::Wait, while it polls) asks for the lock; once the background
// thread has nothing to do it steps aside (releases it and yields, then sleeps, until no
// caller wants it), and the caller runs the work itself until its handle finishes or nothing
// moves for its spin window. A small operation then completes on the thread that waits for it,
// with no hand-off between two threads of a rank (each a wake-up on a shared core). Only the
// background thread sleeps in io_, fails everything after an abort and shuts down. A caller
// leaves those to it, and also the set-up of device work (opening the device, agreeing on its
// path, creating or destroying communicators), whose CUDA state stays with the thread that
// makes it, and the responses whose host work is large (CallerMayExecute). Device collectives
// themselves are run by callers too: a caller that waits for a CUDA tensor's allreduce launches
// it on the engine's stream itself, with the device current on its thread for the response
// (Device::MakeCurrent) and its own given back after.
//
// The control keeper (control_keeper.h) stands in for the thread that runs the work while that
// thread is inside a framework's output allocator (or CUDA's allocation or free): past a grace
// it polls the control plane for it, under the keeper's lock, which the thread takes again
// before it goes on.
//
// Thread-safety: Enqueue*, Shutdown and the accessors may be called from any thread.
#pragma once

#include <sys/types.h>

#include <asio.hpp>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bootstrap/store.h"
#include "common/inheritance.h"
#include "common/short_mutex.h"
#include "common/spin_lock.h"
#include "collectives/collectives.h"
#include "coordinator/coordinator.h"
#include "coordinator/messages.h"
#include "coordinator/response_cache.h"
#include "device/device.h"
#include "engine/control_keeper.h"
#include "engine/name_table.h"
#include "engine/timeline.h"
#include "hvd/engine.h"
#include "planner/autotune.h"
#include "planner/plan.h"
#include "transport/control.h"
#include "transport/device_collectives.h"
#include "transport/group_view.h"
#include "transport/transport.h"

namespace hvd {

class JobBackends;  // transport/transport_factory.h

// A control message's payload, shared by the links it goes out on.
inline std::shared_ptr<const std::vector<uint8_t>> Payload(std::vector<uint8_t> v) {
  return std::make_shared<const std::vector<uint8_t>>(std::move(v));
}

// A kAbort message's payload for `cause` (background.cc, where receivers decode it).
std::shared_ptr<const std::vector<uint8_t>> AbortPayload(const Status& cause);

// The key of an operation in flight: its name, qualified by its process set unless global.
std::string PendingKey(int32_t process_set, const std::string& name);

// A new handle, in memory kept from handles that went (engine.cc).
HandlePtr NewHandle();

// What an engine and its handles share for caller-driven progress (see the file comment). It
// outlives both: never freed, so a handle may point at it after the engine is gone. An engine
// that is destroyed retires its helper, and the next engine of the process takes it again
// (init and shutdown in a loop, an elastic job's resets, keep one or two helpers, not one per
// engine). A handle of the old engine finished at its shutdown, so it only looks at the
// helper (its Wait returns at once); one that still waited would help the new engine's work
// while it waits, which is harmless.
class ProgressHelper {
 public:
  static ProgressHelper* New();
  void Retire() { retired.store(true); }
  std::atomic<bool> retired{false};
  std::mutex run;                 // held by the thread that runs the engine's work
  EngineImpl* engine = nullptr;   // guarded by run; null once the engine has stopped
  std::atomic<int> waiting{0};    // callers that ask for `run`
  std::atomic<int> blocked{0};    // callers in a handle's Wait or WaitFor (after helping)
  // No core to spare on this host (this process may use every CPU of the host, more than one,
  // and the host runs at least as many ranks; set before any handle exists): the background
  // thread, stepped aside, stays on its helping caller's CPU while it yields (StepAside), the
  // CPU where the last caller to start helping ran (sched_getcpu, kept only then).
  std::atomic<bool> pin_aside{false};
  std::atomic<int> caller_cpu{-1};
  // This process may use at least a CPU per rank on the host: a helping caller that waits for
  // its peers pauses between passes instead of yielding at each (HelpProgress). Off where the
  // ranks may share CPUs (taskset, or bound one per core: the peer may be on this one).
  std::atomic<bool> pause_idle{false};
  std::mutex aside_mu;
  std::condition_variable aside_cv;  // the background thread, stepped aside, waits on it
  bool aside = false;             // guarded by aside_mu
};

// Handle::Wait's part: runs the engine's work on this thread until `h` finishes, nothing moves
// for `spin`, `until` passes (checked between passes: a collective it runs is not cut short),
// or the engine must be left to its own thread (background.cc).
void HelpProgress(ProgressHelper* p, const Handle& h, std::chrono::microseconds spin,
                  Clock::time_point until);

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
// The factor a reduction's result is scaled by last: its postscale, with Average's division by
// the `members` that summed folded in (the collective itself sums).
inline double FinalScale(const Response& r, int members) {
  return r.op == ReduceOp::kAverage ? r.postscale / members : r.postscale;
}

// One submitted operation, from enqueue until its handle completes.
// Where a tensor's data lies: a TensorView without its shape, which the request keeps once.
// Small, as the entry it is in: a step of many tensors walks every entry several times.
struct TensorPlace {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  int device = kCpuDevice;
  void* stream = nullptr;  // device tensors: the caller's stream (TensorView::stream)
};

struct TensorEntry {
  Request request;
  TensorPlace input;
  TensorPlace output;  // as many elements as the input
  OutputAllocator allocator;
  HandlePtr handle;
  // Device tensors: an event recorded at submission on the caller's stream
  // (DeviceRuntime::RecordEvent), released when the entry goes.
  std::shared_ptr<void> ready_event;
  // Benchmark hook: runs on the background thread instead of negotiating (see hvd/raw.h).
  std::unique_ptr<std::function<Status(Transport&, ScratchBuffer&)>> raw;
  // The node of in_flight_ that holds this entry from submission until it completes (a
  // NameTable<TensorEntry>::Node*, which cannot be named inside TensorEntry).
  void* in_flight = nullptr;
  // Background thread only, from the drain on: drained (announced, awaiting execution; a
  // lookup by name finds no entry before), and the response-cache bit it was announced as
  // (-1: none), whose ProcessSetState::node_of_bit slot it clears when it completes.
  bool drained = false;
  int32_t announced_bit = -1;
  // The response cache's contents() when the request was last found in it, at the bit its
  // node's hint names; 0: not found, or the request changed since (every writer of the
  // request but FillAllreduceLocked, SubmitAllreduce's and SubmitGroupedAllreduce's, which
  // keeps it only when it wrote the same request again).
  // While the cache's contents() is still this, the bit holds this request: looking it up
  // again needs no comparison (EngineImpl::LookupBit). Kept when the node is released.
  uint64_t hint_contents = 0;
  // Built in its node (EngineImpl::FillAllreduceLocked): the node keeps its name's and shape's
  // storage when it completes, for the name's next use, instead of handing it to other entries.
  bool keeps_storage = false;
  // An operation of hvd's own under a name that starts with kOwnNamePrefix, which a caller's
  // operation may not use (RefusalLocked).
  bool own_name = false;
};

// An in_flight_ node whose operation ended lets go of what the entry holds (its handle, its
// allocator, its device event), keeping the storage of its strings for the next entry moved
// in (NameTable::Free): resetting the whole entry cost as much as the rest of its completion.
inline void NameTableReset(TensorEntry& e) {
  e.handle.reset();
  e.allocator = nullptr;
  e.ready_event.reset();
  e.raw.reset();
  e.in_flight = nullptr;
  e.input.data = e.output.data = nullptr;
  e.drained = false;
  e.announced_bit = -1;
  e.keeps_storage = false;
}
using InFlightNode = NameTable<TensorEntry>::Node;

// The ranks a response runs on (the world, or a process set's members) and what running
// collectives on them needs. Ranks here count in it.
struct Comm {
  Transport* t = nullptr;            // the engine's transport, or `view`
  std::unique_ptr<GroupView> view;   // a process set: its members' view of the transport
  int rank = 0;
  int size = 1;
  // The world rank of member i (for messages).
  int WorldRank(int i) const { return view ? view->base_rank(i) : i; }
  // This host's members and the members with this one's local index across hosts, when their
  // layout allows hierarchical collectives (plan.hierarchical); with them the members of each
  // host, hosts in cross's order, members in local's (the hierarchical allgather's layout).
  std::unique_ptr<GroupView> local, cross;
  std::vector<std::vector<int>> hosts;
  PlanContext plan;
  // Sizes every member has agreed it holds (execute.cc, step 2): the same on every member,
  // since every member executes the same responses of this communicator.
  size_t agreed_fusion = 0;
  size_t agreed_scratch = 0;
  // Device tensors (execute_device.cc): how the members agreed to run device collectives, at
  // their first device response here, and the NCCL communicator when they run through it.
  enum class DevicePath { kUnknown, kCollectives, kStaging };
  DevicePath device_path = DevicePath::kUnknown;
  std::unique_ptr<DeviceCollectives> device_collectives;
  // On the collectives path, the communicator of this host's members (over `local`), set up at
  // the first hierarchical device allreduce (planner/plan.h).
  std::unique_ptr<DeviceCollectives> local_device_collectives;
};

// What negotiation needs for one process set (id 0: every rank). Kept on its members, and on
// world rank 0, which coordinates every set. Ranks here count in the set.
struct ProcessSetState {
  int32_t id = 0;
  std::vector<int> ranks;  // world ranks, ascending
  int rank = -1;           // this rank's place in the set; -1: not a member (rank 0 only)
  bool removed = false;    // a removal is negotiated: new operations on it fail
  std::unique_ptr<ResponseCache> cache;  // identical on every member and rank 0
  std::unique_ptr<Comm> comm;            // members only
  // Members: [bit] this rank's drained node announced as that bit, so that a response rebuilt
  // from bits finds its entries without hashing their names (PendingNode); null once the
  // node's entry completes (so every node here is live and the background thread's); valid
  // while in_flight_.erasures() is nodes_generation. A node found there must hold the
  // response's name (a guard: every agreed bit was announced by this rank as that node).
  std::vector<NameTable<TensorEntry>::Node*> node_of_bit;
  uint64_t nodes_generation = 0;
  // Members: names failed for other ranks before this rank announced them (an error response
  // whose `sizes` leave this rank out, Coordinator::FailName). The coordinator owes this rank
  // that failure, so its next announcement of such a name goes there as a request, never as a
  // cached tensor's bit, which could be agreed on with the others' next step (LookupBit).
  std::unordered_set<std::string> announce_in_full;
  // Rank 0 only: the set's coordinator (null once its removal is negotiated), each member's
  // cache epoch, and the fast path for cached tensors (background.cc): [rank][word] cached
  // tensors announced and not yet agreed on; [bit] when the first rank announced it (zero: no
  // rank has); whether a row changed since the last AND.
  std::unique_ptr<Coordinator> coordinator;
  std::vector<uint64_t> worker_epochs;
  std::vector<std::vector<uint64_t>> ready_bits;
  std::vector<Clock::time_point> bit_since;
  bool bits_changed = false;
  Clock::time_point bits_checked;
  Clock::time_point agreed_since;  // when the oldest agreed bit not yet sent became agreed
  // Members: the responses of the last few fast-path steps of different bits and what they
  // were built from (EngineImpl::StepResponses). A training step agrees on the same bits step
  // after step, often with another step between two of them (a loss or metric allreduced once
  // per step, a barrier), so one remembered step is not enough.
  struct KnownStep {
    std::vector<uint64_t> bits;
    size_t threshold = 0;
    PlanKnobs knobs;
    uint64_t contents = 0;  // the cache's contents() then
    size_t bytes = 0;       // of every response
    uint64_t used = 0;      // known_steps_clock when last taken
    std::shared_ptr<std::vector<Response>> responses;
  };
  static constexpr size_t kKnownSteps = 4;
  std::vector<KnownStep> known_steps;  // at most kKnownSteps
  uint64_t known_steps_clock = 0;
};

// A response waiting for execution: its own, or one of a fast-path step's, shared with the
// step's other responses and with ProcessSetState::known_steps.
struct QueuedResponse {
  QueuedResponse() = default;
  explicit QueuedResponse(Response&& r) : own(std::move(r)) {}
  Response own;
  std::shared_ptr<std::vector<Response>> shared;
  size_t index = 0;
  const Response& get() const { return shared ? (*shared)[index] : own; }
};

// How long agreed cached tensors wait while some rank has announced a cached tensor that another
// has not (a step still arriving): EngineImpl::AgreedGoAt where rank 0 answers, the rounds'
// hold (rounds.cc) where the ranks agree among themselves.
constexpr auto kStragglerHold = std::chrono::microseconds(300);

// The global set's symmetric fast path (rounds.cc), kept on every rank of a job whose ranks
// all link to each other directly (one host sharing memory, or a world of one). Bits count in
// the global set's response cache.
struct Rounds {
  uint64_t done = 0;   // rounds completed here
  bool sent = false;   // this rank's part of round done+1 is out
  std::vector<uint64_t> ready;     // cached tensors announced here, not yet agreed or withdrawn
  bool fresh = false;              // `ready` has bits this rank's last part did not give
  std::vector<uint64_t> withdraw;  // bits this rank moved to the coordinator since its last part
  std::vector<Clock::time_point> since;  // [bit] when it was announced here
  Clock::time_point checked;             // when late bits were last looked for
  Clock::time_point started;             // when this rank last started a round (HVD_CYCLE_TIME)
  // When this rank first held its part while its callers were still enqueuing (zero: not
  // holding; EngineImpl::HoldPartForBurst), and when it last announced a bit.
  Clock::time_point held_since;
  Clock::time_point announced_at;
  // The last round completed held the bits every rank announced (some rank had announced a bit
  // another had not, and rank 0's part allowed the hold); the same on every rank. Rank 0: when
  // the first of the rounds holding since completed, here.
  bool holding = false;
  Clock::time_point holding_since;
  // While holding: the bits some rank announced in the last round that this rank had not (its
  // step still arriving here) and has not announced since, how many, and whether there were
  // any. Only a rank that lacked bits starts the next round, once it has them all
  // (PartHasNews).
  std::vector<uint64_t> missing;
  size_t missing_count = 0;
  bool lacked = false;
  // Rank 0: its coordinator took a request whose name has a bit, or a join, since its last part.
  bool coordinator_news = false;
  // [rank] the parts of round done+1 and (sent by ranks that completed it first) done+2.
  std::vector<std::optional<RoundContribution>> parts, early;
  std::vector<Clock::time_point> arrived, early_arrived;  // [rank] when its part came (timeline)
  int have = 0;  // parts present
  // A worker: response lists that rank 0 sent after a round not completed here yet.
  std::deque<ResponseList> held;
  // A worker: a broken link to another worker, reported if rank 0 does not end the job first.
  int broken_peer = -1;
  std::string broken_what;
  Clock::time_point broken_at;
};

class EngineImpl {
 public:
  std::string Describe(const Request& r) const;  // "allreduce 'x' on rank 3", for errors
  static StatusOr<std::unique_ptr<EngineImpl>> Create(const Options& options);
  ~EngineImpl();

  const Options& options() const { return options_; }
  // Caller side: gives `r` the storage of a finished entry's name and shape, if one is spare.
  void TakeShell(Request* r);
  HandlePtr Enqueue(TensorEntry&& entry);
  std::vector<HandlePtr> EnqueueGroup(std::vector<TensorEntry> entries);
  void Submit(TensorEntry* entries, size_t n);
  HandlePtr SubmitAllreduce(const std::string& name, const TensorView& in, const TensorView& out,
                            ReduceOp op, double prescale, double postscale, int32_t process_set);
  // A host group whose arguments are sound, built in its nodes; false: use Submit (engine.cc).
  bool SubmitGroupedAllreduce(const std::vector<std::string>& names,
                              const std::vector<TensorView>& inputs,
                              const std::vector<TensorView>& outputs, ReduceOp op,
                              double prescale, double postscale, int32_t process_set,
                              std::vector<HandlePtr>* handles);
  // Under mu_: an allreduce written into its name's node; whether it is the request the node
  // held (engine.cc).
  bool FillAllreduceLocked(InFlightNode* node, const std::string& name, const TensorView& in,
                           const TensorView& out, ReduceOp op, double prescale,
                           double postscale, int32_t process_set, const std::string& group,
                           int32_t group_size, const HandlePtr& h);
  void SetWaitPolicy(TensorEntry& e) const;  // under mu_
  void SetWaitPolicy(TensorEntry& e, int64_t bytes) const;  // the request's bytes known
  // Under mu_: why a new operation is refused outright (failed or shut down), or OK.
  Status SubmitRefusalLocked() const;
  // The refusal of an operation (`described`: its Describe()) whose name is in flight already.
  static Status InFlightAlready(const std::string& described);
  // Whether this is a child forked (without exec) from the process that made the engine: its
  // copy of the engine has no threads, so operations are refused (ForkedRefusal), and shutdown
  // and destruction leave it alone (common/inheritance.h).
  bool InForkedChild() const { return ForkGeneration() != fork_generation_; }
  Status ForkedRefusal() const;
  Status Shutdown();
  // Process sets (collective: every rank calls them in the same order). Add returns the new
  // set's id; `at_init` allows it without HVD_DYNAMIC_PROCESS_SETS.
  StatusOr<int32_t> AddProcessSet(std::vector<int> ranks, bool at_init = false);
  Status RemoveProcessSet(int32_t id);
  // The ranks of a set this rank knows (empty: none with that id).
  std::vector<int> ProcessSetRanks(int32_t id) const;
  std::vector<int32_t> ProcessSetIds() const;
  Status StartTimeline(const std::string& path, bool mark_cycles);
  Status StopTimeline();
  // Hands DrainQueue a timeline to switch to (an empty path: none), if the engine started with
  // one; `what` names the call in the error.
  Status SwitchTimeline(std::string path, bool mark_cycles, const char* what);
  // Elastic jobs (engine.cc): the store hvdrun publishes its worlds in, and the newest
  // generation it names (read by rank 0 for Engine::HostsUpdated).
  void set_elastic_store(std::unique_ptr<StoreClient> store) {
    std::lock_guard<std::mutex> l(elastic_mu_);
    elastic_store_ = std::move(store);
  }
  StatusOr<int64_t> LatestGeneration();
  // Tells hvdrun, once, that this worker holds the job's state (ElasticHoldsKey).
  Status MarkHoldsState();
  // Tells hvdrun that this worker left its world (the world broke under it), so that hvdrun
  // can tell a worker that never does (stopped, cut off) from a slow one (bootstrap/elastic.h).
  void ReportLeftWorld(const Status& why);
  // Counters for tests and the benchmark.
  uint64_t responses_executed() const { return responses_executed_.load(); }
  uint64_t cache_hits() const { return cache_hits_.load(); }
  // Whether MPI gave MPI_THREAD_MULTIPLE when the job formed (false without MPI in use).
  bool mpi_thread_multiple() const { return mpi_thread_multiple_; }
  uint64_t fast_path_steps() const { return fast_path_steps_.load(std::memory_order_relaxed); }
  bool negotiates_in_rounds() const { return rounds_ != nullptr; }  // set at Create, then fixed
  uint64_t fast_path_steps_reused() const {
    return fast_path_steps_reused_.load(std::memory_order_relaxed);
  }
  // The background thread's time in negotiation (announcing, agreeing, building the responses
  // to execute), and the requests and response lists this rank sent (hvd/raw.h).
  uint64_t negotiation_ns() const { return negotiation_ns_.load(std::memory_order_relaxed); }
  uint64_t negotiation_messages() const {
    return negotiation_messages_.load(std::memory_order_relaxed);
  }
  // Of negotiation_ns(), the part whose cost is per tensor: draining submitted tensors and
  // looking them up in the response cache, and building the agreed responses
  // from cache bits. The rest is the agreement itself (parts and lists encoded, sent, read and
  // ANDed), a few messages per step whatever the number of tensors.
  uint64_t bookkeeping_ns() const { return bookkeeping_ns_.load(std::memory_order_relaxed); }
  // A waiting caller's pass over the loop's work, under helper_->run (background.cc): 1 when
  // something moved, 0 when nothing did, -1 when the caller must leave the engine to its thread.
  int HelpStep();

 private:
  explicit EngineImpl(const Options& options);
  Status Connect();
  Status SetUpViews(Comm& comm, const Topology& topology, const std::string& why);
  StatusOr<bool> SymmetricNegotiation(bool all_linked, bool links_in_memory, unsigned cores,
                                      Deadline deadline);
  void Wake();
  // `problem` (not empty): this rank refuses the call's arguments, and every rank's call fails.
  HandlePtr EnqueueProcessSetOp(std::vector<int> ranks, int32_t remove,
                                const std::string& problem);

  // Process sets (background.cc).
  ProcessSetState& World() { return *sets_.at(0); }
  ProcessSetState* FindSet(int32_t id);
  std::unique_ptr<ProcessSetState> NewSet(int32_t id, std::vector<int> ranks);
  void ApplyProcessSets(std::vector<Response>& list);  // as a global list is applied
  Status ExecuteProcessSet(const Response& r, std::vector<TensorEntry*>& entries);

  // Caller side.
  // Need mu_ (they read in_flight_ and known_sets_).
  // What this rank refuses alone, at the call: an operation it cannot negotiate (no name, a
  // process set that it is not a member of or that does not exist).
  Status RefusalLocked(const Request& r, bool own_name = false) const;
  // What is wrong with the arguments (the caller sends it as Request::error, and every rank
  // fails the operation); may rewrite the request's root.
  Status ValidateLocked(TensorEntry& e) const;
  // Of those, the checks of the entry's input and output places alone (ValidateLocked ends
  // with them): a request that passed the rest before needs only these.
  Status ValidatePlacesLocked(const TensorEntry& e) const;
  Status CheckProcessSetLocked(Request& r) const;

  // Background thread (background.cc).
  void Loop();  // the background thread
  bool DrainQueue();
  // A burst of enqueues under way with a core to spare, and no caller waiting yet; waited out
  // (without `run`), AwaitEnqueueBurst says whether a caller came to wait meanwhile, to run
  // the work itself (background.cc).
  bool EnqueueBurstUnderway() const;
  bool AwaitEnqueueBurst();
  std::atomic<uint64_t> enqueued_{0};  // operations submitted (Wake), for AwaitEnqueueBurst
  bool spare_core_ = false;  // the background thread has a core beside the caller's (Connect)
  void StopPolling();  // lowers the poller's flag before a wait that does not poll it
  void Recycle(Response&& r);  // after Execute: keeps it in spare_responses_
  void Recycle(std::shared_ptr<std::vector<Response>>& step);  // the last holder's, emptied
  // The responses of the fast-path step that agreed on `bits` (ps.cache's RebuildAll), each
  // with the set's id and `knobs`, and their bytes; null if a bit is empty. The last step's
  // again, while the cache still holds what they were built from: then no tensor's response
  // is rebuilt, only marked used.
  std::shared_ptr<std::vector<Response>> StepResponses(ProcessSetState& ps,
                                                       const std::vector<uint64_t>& bits,
                                                       size_t threshold, const PlanKnobs& knobs,
                                                       size_t* bytes);
  // Queues a step's responses for execution.
  void QueueStep(const std::shared_ptr<std::vector<Response>>& step);
  void Announce(ProcessSetState& ps, const std::vector<NameTable<TensorEntry>::Node*>& nodes,
                Clock::time_point now);
  // The cache bit of a pending node's request, or -1; remembers the node by its bit.
  int LookupBit(ProcessSetState& ps, NameTable<TensorEntry>::Node* node);
  // LookupBit of each node into *bits, a group's members all hits or all -1.
  void LookupBits(ProcessSetState& ps, const std::vector<NameTable<TensorEntry>::Node*>& nodes,
                  std::vector<int>* bits);
  // The pending node of a response's i-th tensor on this rank, or null.
  NameTable<TensorEntry>::Node* PendingNode(ProcessSetState& ps, const Response& r, size_t i);
  void OnControlMessage(int peer, uint8_t type, std::vector<uint8_t>&& payload);
  void OnControlError(int peer, const std::string& what,
                      StatusCode code = StatusCode::kPeerLost);
  void StartHeartbeat();
  void OnHeartbeatTimer();
  // From inside a data-plane wait that does not run the io_context itself (MPI's, a device
  // stream's): runs the control plane's ready handlers; the engine's abort status, or OK.
  Status PollControlPlane();
  // The keeper's poll (ControlKeeper): PollControlPlane, an exception in it stopping the engine
  // as one on the background thread does.
  void KeeperPoll();
  // Rank 0's reading of a worker's abort that blames rank 0 itself (background.cc).
  Status BlameSeenByCoordinator(int from, const Status& why) const;
  // Rank 0's reading of a data-plane timeout seen by rank `from` (rank 0 itself included) that
  // names another worker: what rank 0's heartbeats say of that worker (background.cc).
  // `unsure`, where given, turns true where that worker runs (rank 0 hears from it) or the
  // timeout names no rank.
  Status BlameSeenByWorker(int from, const Status& why, bool* unsure = nullptr) const;
  // Rank 0: a worker's timeout naming a running rank (or none) waits kVerdictHold for a better
  // cause before every rank hears it (background.cc).
  void HoldVerdict(const Status& why);
  void ReleaseVerdict();
  static constexpr std::chrono::milliseconds kVerdictHold{500};
  // A data-plane wait of this worker's timed out: rank 0 hears it at once (Execute).
  void TellCoordinatorFirst(const Status& why);
  // The keeper's verdict on a foreign call that ran for `ran`, HVD_TIMEOUT_SECONDS or more:
  // every rank hears that this one is stuck, and the job fails (control_keeper.h).
  void KeeperGaveUp(Clock::duration ran);
  // Host work on this thread over many bytes (a copy, a fill, a scaling) in slices, with the
  // control plane polled between them (execute.cc): heartbeats go out and aborts are heard
  // however long it takes.
  void CopyPolling(void* dst, const void* src, size_t bytes);
  void FillZeroPolling(void* dst, size_t bytes);
  void ScalePolling(void* buf, size_t count, DataType dtype, double factor);
  // Runs the control plane for up to `wait` until a cause comes (an abort): that, else `local`.
  Status AwaitRootCause(const Status& local, Clock::duration wait = std::chrono::seconds(1));
  bool coordinator() const { return options_.rank == 0; }
  void CoordinatorStep();
  bool CoordinatorStep(ProcessSetState& ps, Clock::time_point now);  // whether it sent a list
  // Rank 0 inside a collective (its data-plane waits run the io_context, and with it control
  // messages and timers): steps the coordinators of the sets it is not a member of, whose
  // members need not wait for this collective to end; all of them without `set`.
  void StepSetsAside(int32_t set = -1);
  // Steps, in turn, the coordinator of each set `which` accepts (CoordinatorStep(ps, now)).
  void StepCoordinators(const std::function<bool(const ProcessSetState&)>& which);
  // Adds the time since `since` to negotiation_ns() and returns that time; CountBookkeeping
  // adds it to bookkeeping_ns() too (call it only inside a counted stretch, or with both).
  Clock::duration CountNegotiation(Clock::time_point since);
  void CountBookkeeping(Clock::duration d);
  // How long until a wait of rank 0's (HVD_CYCLE_TIME, a straggler hold) ends and the loop has
  // work: Clock::duration::max() where none is pending, zero where one is due.
  Clock::duration CycleRemaining() const;
  Status OnRequests(int peer, RequestList&& list);
  // Rank 0's fast path for cached tensors (background.cc); ranks count in the set.
  // A member's announcement: its bits at cache epoch `epoch` join its row or go to the
  // coordinator with its requests (groups whole). A bit's wait, kBitPatience, counts from its
  // first offer (OfferWords reads the clock).
  Status OfferList(ProcessSetState& ps, int rank, uint64_t epoch,
                   const std::vector<uint64_t>& words, std::vector<Request> requests);
  // Whole words of bits joining a member's row (OfferList's checks done or not needed).
  Status OfferWords(ProcessSetState& ps, int rank, const std::vector<uint64_t>& words);
  // The timeline's tick: member `rank` of `ps` was seen ready for `name` (rank 0 sees them all).
  void TickReady(const ProcessSetState& ps, int rank, const Request& r);
  void AddFull(ProcessSetState& ps, int rank, std::vector<Request> requests);
  // The bits of `bits` (and of their groups) waiting in rows go to the coordinator, one batch
  // per member; `was`: what changed bits meant.
  void DemoteBits(ProcessSetState& ps, std::vector<uint64_t> bits,
                  const std::vector<std::pair<uint32_t, Request>>& was = {});
  // The AND of every member's row (groups only whole); empty if none.
  static std::vector<uint64_t> AgreedBits(const ProcessSetState& ps);
  std::vector<uint64_t> AgreeOnBits(ProcessSetState& ps);  // the same, taken out of the rows
  Clock::duration CycleWindow() const;
  void DemoteLateBits(ProcessSetState& ps, Clock::time_point now);
  // Grows the set's bit vectors (rank 0's rows and their clocks; the world's rounds) to the
  // slots its cache has given out, after each Apply.
  void FitBits(ProcessSetState& ps);
  Clock::time_point AgreedGoAt(const ProcessSetState& ps) const;
  void ApplyOnRankZero(ProcessSetState& ps, std::vector<Response>& list);
  Status OnResponses(ResponseList&& list);

  // The symmetric fast path (rounds.cc).
  // Whether `ps` agrees on cached tensors in rounds (the global set of a job that runs them).
  bool Symmetric(const ProcessSetState& ps) const {
    return rounds_ && ps.id == kGlobalProcessSet;
  }
  void AnnounceBit(uint32_t bit, Clock::time_point now);
  // Sends this rank's part and completes rounds while it can; true if it did either.
  bool TryRounds();
  bool RoundNews(Clock::time_point now) const;
  // Whether this rank's part waits: a caller is still enqueuing (tensors came since the last
  // drain, or the last bit was announced less than kBurstGap ago) and none waits, for at
  // most kBurstHold from the first part held (rounds.cc).
  bool HoldPartForBurst();
  Clock::time_point BurstGapEnd() const;
  Clock::duration BurstHoldRemaining(Clock::time_point now) const;
  bool PartHasNews() const;  // rounds.cc
  void SendPart();
  // At shutdown: whether a round some rank may run is still to complete here (rounds.cc).
  bool RoundsLeftAtShutdown();
  Status CompleteRound();
  Status OnRoundPart(int peer, const std::vector<uint8_t>& payload);
  // Bits of this rank's ready row whose cache entry a list changed go to the coordinator.
  void OnCacheChanged(const std::vector<std::pair<uint32_t, Request>>& changed);
  void WithdrawLateBits(Clock::time_point now);
  // Requests whose bits left the fast path, to the coordinator.
  void SendToCoordinator(std::vector<Request> requests);
  void OnPeerLinkError(int peer, const std::string& what);
  void CheckPeerLinks();
  // To every worker, or (members given) to those world ranks.
  void BroadcastControl(uint8_t type, std::shared_ptr<const std::vector<uint8_t>> payload,
                        const std::vector<int>* members = nullptr);
  void FailAll(const Status& status, bool notify = true);
  // The failure note (job_store_): written at once where operations of this rank fail with
  // another rank's failure, or owed (under mu_) where none was pending, and then written by the
  // caller whose next operation is refused, before that refusal reaches it. A rank with nothing
  // more to do (its script ends, or fails on its own) leaves none: its exit is not that
  // failure's doing.
  void LeaveFailureNote(const Status& status);
  void WriteFailureNoteLocked(const Status& status);  // note_mu_ held
  void OweFailureNoteLocked(const Status& status);
  void PayOwedFailureNote();
  // Background thread: ends entries it owns (drained, or taken from the queue) with `status`:
  // their nodes of in_flight_ are released, and then their handles completed.
  void CompleteEntry(TensorEntry& e, const Status& status);
  // With `ps`, the entries of a response executed in that set: each also gives up its bit's
  // node_of_bit slot, and an entry built outside its node its name and shape storage.
  void CompleteEntries(TensorEntry* const* entries, size_t n, const Status& status,
                       ProcessSetState* ps = nullptr);
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
  void KeepBarrierCount(const Response& r);
  Status ExecuteAllreduce(const Response& r, std::vector<TensorEntry*>& entries);
  Status ExecuteAllgather(const Response& r, TensorEntry* e);
  Status ExecuteBroadcast(const Response& r, TensorEntry* e);
  Status ExecuteAlltoall(const Response& r, TensorEntry* e);
  Status ExecuteReducescatter(const Response& r, TensorEntry* e);
  void* AllocateOutput(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes);
  // An output this rank could not allocate (`*local` failed) that the ranks do not agree on
  // (need.output under kAgreeBytes, execute.cc): it receives into a stand-in of the engine's
  // instead (*out), so that the others' collective completes, and the failure moves to
  // *alone, for this rank's operation alone. False (nothing changed) where none is needed or
  // none can be had.
  bool StandInForOutput(const MemoryNeeds& need, size_t bytes, Status* local, Status* alone,
                        void** out);
  Deadline CollectiveDeadline() const;

  // Device tensors (execute_device.cc).
  Status RecordReady(TensorEntry& e);  // caller side
  Status ExecuteOnDevice(const Response& r, std::vector<TensorEntry*>& entries);
  Status OpenDevice(const std::vector<TensorEntry*>& entries);
  Status ChooseDevicePath(Comm& comm, const Status& opened);
  Status PollDuringDeviceWait();
  Status DeviceSynchronize();
  Status DeviceCopy(const std::vector<CopySpan>& spans);
  Status GetDeviceBuffer(DeviceBuffer& b, Device* d, size_t bytes, void** out);
  Status DeviceDone(const std::vector<TensorEntry*>& entries);
  Status RunDeviceCollective(const Response& r, std::vector<TensorEntry*>& entries);
  Status RunStaged(const Response& r, std::vector<TensorEntry*>& entries, bool* host_failed);
  Status RunStagedAllreduce(const Response& r, std::vector<TensorEntry*>& entries,
                            bool* host_failed);
  void DrainCopies();
  Status PackOnDevice(const std::vector<TensorEntry*>& entries, const std::vector<size_t>& bytes,
                      const std::vector<size_t>& offsets, uint8_t* buf,
                      std::vector<CopySpan>* out);
  Status DeviceAllreduce(const Response& r, std::vector<TensorEntry*>& entries);
  Status DeviceHierarchicalAllreduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                                     const PlanContext& pc);
  Status SetUpLocalDeviceCollectives(const char* what);
  Status DeviceAdasum(const Response& r, std::vector<TensorEntry*>& entries, bool* host_failed);
  Status CheckDeviceCollectives();
  void AbortDeviceCollectives();
  Status DeviceAllgather(const Response& r, TensorEntry* e);
  Status DeviceBroadcast(const Response& r, TensorEntry* e);
  Status DeviceAlltoall(const Response& r, TensorEntry* e);
  Status DeviceReducescatter(const Response& r, TensorEntry* e);
  // *in itself for a factor of 1, else a copy of its `count` elements in the device fusion
  // buffer, scaled there by the device's rules (*in then points at the copy).
  Status PrescaledOnDevice(const void** in, size_t count, DataType dtype, double factor);
  Status AllocateDeviceOutput(TensorEntry* e, const std::vector<int64_t>& shape, size_t bytes,
                              void** out);

  const Options options_;
  // The fork generation and process id where the engine was made (InForkedChild).
  const uint64_t fork_generation_;
  const pid_t pid_;

  // Caller side, guarded by mu_: every caller takes it once per tensor, and every hold is a
  // few field writes, a push or a pass over the live entries without a wait.
  mutable SpinLock mu_;
  std::vector<InFlightNode*> queue_;  // submitted, not drained yet
  bool sweep_wanted_ = false;         // a caller freed nodes; the next drain sweeps
  // By PendingKey(): every entry submitted and not completed on this rank (see Threads above).
  NameTable<TensorEntry> in_flight_;
  Status dead_;                                // set once: later operations fail with it
  bool shutdown_requested_ = false;
  // A timeline to switch to (StartTimeline, StopTimeline: an empty path), taken by DrainQueue;
  // `ticket` counts the switches asked for, and timeline_switched_ is the last one applied (the
  // old file closed, the new one open), which SwitchTimeline waits for.
  struct TimelineSwitch {
    std::string path;
    bool mark_cycles = false;
    uint64_t ticket = 0;
  };
  std::unique_ptr<TimelineSwitch> timeline_switch_;
  uint64_t timeline_switches_ = 0;
  std::atomic<uint64_t> timeline_switched_{0};
  // The process sets this rank has executed the addition of and not the removal: their ranks
  // and how many barriers were submitted on each.
  struct KnownSet {
    std::vector<int> ranks;
    uint64_t barriers = 0;
  };
  std::map<int32_t, KnownSet> known_sets_;
  uint64_t process_set_ops_ = 0;  // additions and removals submitted (their names)
  HandlePtr process_set_call_;    // the last of them (sets_ says why one runs at a time)
  std::atomic<bool> wake_posted_{false};
  std::atomic<bool> queued_{false};    // the queue may hold entries the background has not seen
  std::atomic<bool> sleeping_{false};  // the background thread sleeps in io_ (or is about to)
  // The storage of executed entries' names and shapes, handed back by the background thread
  // (ReturnShells) for callers to build the next ones in (TakeShell): a step of the same
  // tensors then allocates neither on the caller's thread, nor frees on the background thread
  // what the caller's allocated.
  struct Shell {
    std::string name;
    std::vector<int64_t> shape;
  };
  static constexpr size_t kMaxShells = 16384;
  ShortMutex shells_mu_;
  std::vector<Shell> shells_;  // guarded by shells_mu_

  std::mutex elastic_mu_;  // serialises callers' use of elastic_store_
  std::unique_ptr<StoreClient> elastic_store_;  // guarded by elastic_mu_; null unless elastic
  bool holds_marked_ = false;                     // guarded by elastic_mu_

  // Background side.
  asio::io_context io_;
  // Wakes the loop's sleep when a wait of rank 0's ends; whether a wait of it is pending, and
  // the number of the last one armed. Under ProgressHelper::run, as io_'s handlers are.
  // Declared next to io_: the transport's teardown still runs io_, and with it the handler of
  // a wait the timer's destruction cancelled, which reads these.
  uint64_t due_arms_ = 0;
  bool due_armed_ = false;
  asio::steady_timer due_timer_{io_};
  // MPI and the Slurm-hosted store when used (transport/transport_factory.h); declared before
  // transport_ so that it outlives the transport that points at its offload.
  std::unique_ptr<JobBackends> backends_;
  bool shut_down_ = false;  // background thread: the loop ended with a shutdown (FinishShutdown)
  bool mpi_thread_multiple_ = false;  // set once in Connect (Engine::mpi_threads_supported)
  std::unique_ptr<Transport> transport_;
  Topology topology_;  // where each rank runs (empty for a world of one)
  std::string layout_note_;  // why the layout does not allow hierarchical collectives
  std::vector<std::shared_ptr<ControlLink>> control_;  // rank 0: [peer]; worker: [0]
  // A worker: links to the other workers (JobConnections::peers), for the rounds.
  std::vector<std::shared_ptr<ControlLink>> peers_;
  std::unique_ptr<Rounds> rounds_;  // the symmetric fast path, or null (rank 0 answers bits)
  std::shared_ptr<ControlPoller> poller_;  // links the io_context alone does not drive; or null
  // poller_ is told this thread polls it: while it spins, and through the collectives it runs.
  bool polling_ = false;
  bool control_over_tcp_ = true;  // some control link is read by the io_context
  Clock::time_point io_polled_;   // when the spinning loop last polled the io_context
  // Reused from step to step, so that a step of many tensors allocates none of them: the
  // nodes being drained from queue_ (DrainQueue), those of the response being executed with
  // their entries (Execute) and pieces (ExecuteAllreduce), and the handles being completed.
  std::vector<InFlightNode*> draining_;
  std::vector<int> announce_bits_;  // Announce's, kept from drain to drain
  std::map<int32_t, std::vector<NameTable<TensorEntry>::Node*>> drained_;  // by set (DrainQueue)
  std::vector<TensorEntry*> executing_;
  std::vector<InFlightNode*> releasing_;
  std::vector<HandlePtr> completing_;
  std::vector<size_t> counts_;
  std::vector<AllreducePiece> pieces_;
  std::vector<Shell> returning_;  // shells of the response being executed
  void KeepShell(Request& r);     // moves r's name and shape into returning_
  void ReturnShells();
  std::deque<QueuedResponse> to_execute_;
  std::vector<Response> spare_responses_;  // executed, their names' storage to write over
  std::unique_ptr<Timeline> timeline_;
  ScratchBuffer scratch_;
  ScratchBuffer fusion_;
  std::vector<uint8_t> stand_in_;  // StandInForOutput
  // Device tensors (execute_device.cc): this rank's device, opened at its first device
  // response; the device fusion buffer, the pinned host staging buffer and the share buffer of
  // hierarchical allreduce. Declared before sets_, whose NCCL communicators go first.
  std::shared_ptr<Device> device_;
  DeviceBuffer device_fusion_;
  DeviceBuffer host_staging_{true};
  DeviceBuffer device_share_;  // a hierarchical allreduce's share of this rank
  // Process sets by id, 0 (every rank) included. Rank 0 gives a removed set's id to a later
  // set (free_set_ids_, first removed first, as Horovod), once it has executed the removal. That
  // addition cannot be mistaken for the removed set on any rank: a rank submits an addition
  // only after its earlier addition or removal has executed (Submit refuses one while
  // process_set_call_ is pending), so every rank has executed the removal before rank 0 can
  // answer the addition, and every message a rank sent for the removed set is ahead of its
  // request for the addition on the same link (rank 0 drops those: the set is gone by then).
  std::map<int32_t, std::unique_ptr<ProcessSetState>> sets_;
  int32_t next_set_id_ = 1;             // rank 0
  std::deque<int32_t> free_set_ids_;    // rank 0
  std::unique_ptr<Autotuner> autotune_;  // rank 0 with HVD_AUTOTUNE=1
  // The fusion threshold and cycle time rank 0 runs with now: the options', or autotune's.
  size_t FusionThreshold() const;
  double CycleTimeMs() const;
  PlanKnobs Knobs() const;  // the plan knobs rank 0 sends with each list
  void ReportAutotune();
  int autotune_reported_ = -1;  // the phase last logged (4: the choice)
  Comm* comm_ = nullptr;     // where the response being executed runs
  bool in_collective_ = false;  // inside Execute's Run (control messages may arrive)
  // Runs a framework's output allocator, and CUDA's allocations and frees, polling the control
  // plane for this rank while they take long (up to HVD_TIMEOUT_SECONDS). Declared after io_,
  // the transport and the control links: its thread is joined before they go.
  ControlKeeper keeper_{[this] { KeeperPoll(); },
                        std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(options_.timeout_seconds)),
                        [this](Clock::duration ran) { KeeperGaveUp(ran); }};
  bool abandon_ = false;       // this rank failed alone inside the response being executed
  bool joined_ = false;
  int join_device_ = kCpuDevice;  // Join(device): where a joined rank's zeros go (execute_device.cc)
  bool shutdown_sent_ = false;
  Deadline shutdown_deadline_ = NoDeadline();
  int shutdown_by_ = -1;   // the rank whose shutdown ends the job, once known
  // The fast path at shutdown (rounds.cc): a worker runs the rounds rank 0 completed before it
  // stopped (from rank 0's shutdown message), waiting at most until the deadline (set when the
  // wait starts).
  uint64_t shutdown_after_round_ = 0;
  Deadline shutdown_rounds_deadline_ = NoDeadline();
  Status abort_;           // set by a control message or a lost peer
  // abort_ (or the shutdown) is this rank's own doing: an exception in hvd's work, this rank
  // abandoning the communicator, its own shutdown. Otherwise another rank's failure ended the
  // job here, and FailAll leaves a note saying so in hvdrun's store (job_store_).
  bool failing_on_own_ = false;
  // Null but under hvdrun. Guarded by note_mu_, as note_state_'s changes and owed_note_.
  std::unique_ptr<StoreClient> job_store_;
  std::mutex note_mu_;
  enum NoteState : int { kNoNote = 0, kNoteOwed = 1, kNoteLeft = 2 };
  std::atomic<int> note_state_{kNoNote};  // owed under mu_ as well
  Status owed_note_;  // written before note_state_ turns kNoteOwed
  std::unique_ptr<asio::steady_timer> heartbeat_;
  Status held_verdict_;  // rank 0 (HoldVerdict)
  std::unique_ptr<asio::steady_timer> verdict_timer_;
  std::chrono::microseconds spin_{0};  // polling window before sleeping (HVD_SPIN_MICROSECONDS)
  // More ranks on this host than cores: callers' Wait polls only for operations of up to
  // kSmallWaitBytes (engine.cc).
  bool oversubscribed_ = false;
  static constexpr size_t kSmallWaitBytes = 64 << 10;
  // Not oversubscribed, a caller that waits runs the work of host operations of up to this
  // size itself (SetWaitPolicy): measured on 2 ranks, 256 KiB took 60 µs handed to the
  // background thread and 45 run by the caller, 1 MiB 148 and 135; 4 MiB the same either way.
  static constexpr size_t kCallerRunsBytes = 1 << 20;
  Clock::time_point last_work_;
  std::vector<Clock::time_point> last_heard_;  // per control peer
  // The heartbeat timer's last run, and until when a run that came HVD_TIMEOUT_SECONDS / 2 or
  // more late (this rank was held up: stopped, say) counts as recent (HeldUp).
  Clock::time_point last_tick_, held_up_until_;
  bool HeldUp() const;
  bool done_ = false;
  std::atomic<uint64_t> responses_executed_{0};
  std::atomic<uint64_t> cache_hits_{0};
  std::atomic<uint64_t> fast_path_steps_{0}, fast_path_steps_reused_{0};  // StepResponses
  std::atomic<uint64_t> negotiation_ns_{0};
  std::atomic<uint64_t> negotiation_messages_{0};
  std::atomic<uint64_t> bookkeeping_ns_{0};
  std::mutex join_mu_;  // serialises joining thread_
  std::thread thread_;
  // Caller-driven progress. Submit gives it to the handles of operations of up to
  // kSmallWaitBytes and of device operations (a launch at any size; CallerMayExecute keeps
  // the large host work of some back), and only where the host has a core per rank: there the
  // hand-off it saves is a large part of the time. With more ranks than cores, a helping caller and its
  // stepped-aside background thread both take time slices that the peers' threads need
  // (measured: 4 ranks on 2 cores, 4 B-16 KiB, slower in most runs); at 1 MiB (2 ranks) the
  // saving is lost in the operation (100-113 against 92-95 µs in three pairs).
  ProgressHelper* const helper_ = ProgressHelper::New();
  // One pass of the loop's work: drain, rounds, rank 0's coordinators, execution; whether
  // anything was done (background.cc). By a caller, it stops before a response that
  // CallerMayExecute refuses, and raises handed_back_. Work marks the cycle in the timeline;
  // WorkCycle is the pass itself.
  bool Work(bool by_caller);
  bool WorkCycle(bool by_caller);
  // Whether a caller may execute `r`: not a device response that first sets something up (the
  // device opened at the rank's first device response, the path agreed with the others, a
  // communicator created): those run on the background thread, where the device stays current
  // once opened (cuda_device.cc) and no caller's thread is left switched to it.
  bool CallerMayExecute(const Response& r);
  bool handed_back_ = false;  // a caller's pass stopped before such a response
  // The background thread, idle while a caller waits: lets the caller run the work (`run` is
  // released until no caller asks for it, or a tick passes). Where ProgressHelper::pin_aside,
  // on the CPU of the caller that helps.
  void StepAside(std::unique_lock<std::mutex>& run);
  void StandAside();  // StepAside's wait, with `run` released already
  // While polling after work (the background thread's spin, a helping caller): the control
  // rings with the poller's flag up, and the io_context every kIoPollEvery (every round with
  // TCP control links); whether anything moved.
  bool SpinPoll(Clock::time_point now);
  void RunLoop(std::unique_lock<std::mutex>& run);
};

}  // namespace hvd
