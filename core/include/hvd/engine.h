// The public C++ API of hvd: an Engine per process; named, asynchronous collectives that return
// a Handle.
//
//   auto engine = hvd::Engine::CreateFromEnvironment();   // StatusOr<std::unique_ptr<Engine>>
//   hvd::TensorView grad(ptr, hvd::DataType::kFloat32, {1024});
//   auto h = (*engine)->Allreduce("layer1.grad", grad, grad, hvd::ReduceOp::kAverage);
//   hvd::Status st = h->Wait();
//
// Thread-safety: every Engine method may be called from any number of threads at once. The
// calls only enqueue; one background thread per engine negotiates with the other ranks and
// runs the collectives. Each operation is named; a name may be in flight only once at a time,
// and every rank must eventually submit the same names with matching arguments.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hvd/export.h"
#include "hvd/options.h"
#include "hvd/status.h"
#include "hvd/types.h"

namespace hvd {

// Called once, when the shape of a result that only negotiation can tell (allgather, alltoall,
// reducescatter) is known: on the engine's background thread, or on a thread that waits for an
// operation and runs the engine's work meanwhile (for a CUDA tensor with the device current),
// while the engine's work is held up. It must not wait for another operation. Returns memory
// for that many elements of the operation's dtype, owned by the caller, or nullptr (or an
// exception) to fail the operation with ResourceExhausted. For host tensors: on every rank
// where some rank's output is 1 MiB or more (the ranks agree on it before any byte moves), on
// this rank alone under that (it receives into the engine's memory meanwhile, and the
// operation completes on the ranks that had their output). For CUDA tensors a refused output
// ends the communicator on every rank.
using OutputAllocator = std::function<void*(const std::vector<int64_t>& shape)>;

class ProgressHelper;  // engine/engine_impl.h

// The completion state of one operation.
// Thread-safety: all methods may be called from any thread.
class HVD_EXPORT Handle {
 public:
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  // True once the operation has finished, successfully or not. While it has not, the calling
  // thread first yields its core once: a loop of polls (`while (!h->Poll())`, Horovod's
  // `while not hvd.poll(h)`) then leaves the engine's threads, and the other ranks' on its
  // host, their time. Without the yield such a loop held its core, and each step of the
  // operation waited for a time slice: 4-byte allreduces at 2 ranks on 2 cores took 7.9 ms
  // each, 38-57 µs with it (Wait: 12-41 µs).
  // In a child forked while it was pending it is true: the wait that follows fails there.
  bool Poll() const;
  // True once finished, without yielding: for a look between other work.
  bool Finished() const;
  // Blocks until the operation has finished; returns its status. It first polls for up to the
  // engine's spin window (HVD_SPIN_MICROSECONDS), yielding the core, as a short operation
  // usually finishes within microseconds; then it sleeps until woken. While it polls, the
  // waiting thread runs the engine's work itself when the background thread is idle
  // (operations of up to 64 KiB and CUDA tensors' operations, where the host has a core per
  // rank; see engine/engine_impl.h, caller-driven progress).
  Status Wait() const;
  // As Wait, but returns Timeout if it has not finished within `timeout` (it goes on). A
  // collective the waiting thread runs meanwhile is not cut short. An operation that finished
  // failing with Timeout (a peer silent for HVD_TIMEOUT_SECONDS, a stall shutdown) gives
  // Timeout too. To tell the two apart, look at status() once Finished(): the operation may
  // have finished, with any status, OK included, since this returned.
  Status WaitFor(std::chrono::milliseconds timeout) const;
  // The final status; OK while pending.
  Status status() const;
  // True when the engine refused the operation as it was submitted (no name, a process set
  // this rank is not in, a name already in flight, after shutdown or a failure): the handle
  // failed before any negotiation. Wrong arguments (a root outside the set, splits that do not
  // fit, an output that does not match) are negotiated instead, so that every rank fails the
  // operation together with this rank's reason: their handles fail without refused().
  bool refused() const { return refused_; }

  // After success of allgather, alltoall and reducescatter: the result's shape and, unless an
  // OutputAllocator was given, its bytes (owned by the handle): output_bytes() for host
  // tensors; for device tensors output_data() points at device memory the handle owns.
  const std::vector<int64_t>& output_shape() const { return results().output_shape; }
  const std::vector<uint8_t>& output_bytes() const { return results().output_bytes; }
  void* output_data() const { return output_data_; }
  // After success of alltoall: rows received from each rank.
  const std::vector<int64_t>& received_splits() const { return results().received_splits; }
  // After success of join: the last rank that joined.
  int join_last_rank() const { return join_last_rank_; }
  // After success of a process set's addition: its id.
  int32_t process_set_id() const { return process_set_id_; }

  // Device tensors, stream-ordered completion (HVD_ENABLE_ASYNC_COMPLETION=1): the handle
  // finishes once the operation's device work is queued, and its results are ready when this
  // event (a cudaEvent_t) is; null when the engine waited for the device itself (the default)
  // or the operation was on host memory.
  void* cuda_event() const { return results().cuda_event.get(); }
  // Makes `stream` (a cudaStream_t; nullptr = the legacy default stream) wait for cuda_event()
  // without blocking the caller; OK and nothing done without an event. Call after Wait().
  Status StreamWait(void* stream) const;

  // Engine side: completes the handle and wakes its waiters. Called once.
  void Complete(Status status);

  // Engine side: what only some operations give back, filled by the thread that runs the
  // engine's work before Complete(). Apart from the handle and made at the first write
  // (mutable_results()), so that the handle of an allreduce, the most common by far, stays
  // small.
  struct Results {
    std::vector<int64_t> output_shape;
    std::vector<uint8_t> output_bytes;
    // Device memory the engine allocated for output_data_ (device tensors, no allocator
    // given); freed with the handle.
    std::shared_ptr<void> output_owner;
    std::vector<int64_t> received_splits;
    std::shared_ptr<void> cuda_event;
  };
  Results& mutable_results() {
    if (!results_) results_ = std::make_unique<Results>();
    return *results_;
  }
  void* output_data_ = nullptr;
  int join_last_rank_ = -1;
  int32_t process_set_id_ = -1;
  // Engine side, set before the handle is returned: how long Wait() polls before sleeping, and
  // whether it was refused at submission.
  std::chrono::microseconds spin_{0};
  bool refused_ = false;
  // Engine side: the engine's caller-driven progress (null: a handle no engine made), and
  // whether a caller that waits runs the engine's work (else it only waits, counted as
  // blocked: the engine sends what it holds for a burst of enqueues at once).
  ProgressHelper* helper_ = nullptr;
  bool helps_ = false;
  // Engine side: the fork generation it was made in (common/inheritance.h). A child forked
  // while it was pending cannot see it finish: its wait fails there instead of hanging.
  uint64_t fork_generation_ = 0;

 private:
  const Results& results() const;
  // Polls for up to spin_ (or `limit`); true once finished.
  bool Spin(std::chrono::steady_clock::time_point limit) const;
  // Sleeps until finished or `limit`; true once finished.
  bool Sleep(std::chrono::steady_clock::time_point limit) const;

  // Completion takes no lock and makes no system call unless a waiter sleeps (handle.cc): a
  // step of many tensors completes as many handles. The state is a futex word.
  static constexpr uint32_t kClaimed = 1;   // Complete has begun (it runs once)
  static constexpr uint32_t kFinished = 2;  // status_ is final
  static constexpr uint32_t kSleeping = 4;  // a waiter may sleep on the word: Complete wakes it
  mutable std::atomic<uint32_t> state_{0};
  Status status_;  // written once, before kFinished is raised
  std::unique_ptr<Results> results_;
};
using HandlePtr = std::shared_ptr<Handle>;

class EngineImpl;

// Process sets, as Horovod's: a subset of the ranks that runs collectives among itself, with
// its own negotiation (coordinator, response cache, stall inspector) and communicator. An id
// names one; 0 is the set of every rank.
constexpr int32_t kGlobalProcessSet = 0;

// Thread-safety: see the file comment.
class HVD_EXPORT Engine {
 public:
  // Connects to the other ranks (through the rendezvous store when size > 1) and starts the
  // background thread. Fails with a message naming the setting or peer that was wrong.
  static StatusOr<std::unique_ptr<Engine>> Create(const Options& options);
  static StatusOr<std::unique_ptr<Engine>> CreateFromEnvironment();

  // Elastic training (hvdrun --min-np/--max-np/--host-discovery-script; docs/ELASTIC.md).
  // With Options::elastic, Create waits (up to HVD_ELASTIC_TIMEOUT) for the newest world hvdrun
  // publishes and forms it: rank, size and peers come from that world.
  //
  // A native trainer's loop: commit its state every few steps; an operation that fails with
  // PeerLost or Timeout (a rank died), or HostsUpdated() returning true (hvdrun added or
  // removed hosts), means roll back to the last commit (PeerLost) or keep the state (hosts
  // updated), then `engine = Engine::Reset(std::move(engine))`, broadcast the state from the
  // new rank 0 and go on.
  //
  // Reset shuts `engine` down (its operations still in flight fail with Aborted) and creates
  // the engine of the next world from the same options: in an elastic job one newer than
  // engine's, otherwise the same world again. FailedPrecondition ("has no place in world"):
  // hvdrun left this worker out (its host was blacklisted or removed) and is stopping it.
  static StatusOr<std::unique_ptr<Engine>> Reset(std::unique_ptr<Engine> engine);
  // Collective over every rank: true on every rank when hvdrun has published a newer world
  // than this engine's (rank 0 reads the store and broadcasts what it read). Always false,
  // without communicating, outside an elastic job.
  StatusOr<bool> HostsUpdated();
  // After the broadcast of the state from rank 0 that follows a Reset (or the start of a
  // worker that joins a running job): this worker now holds the job's state, and hvdrun may
  // make it rank 0 of a later world, whose state every rank takes. A worker that has neither
  // called this nor reached a commit (HostsUpdated) holds only what it started with: should
  // every worker that holds the state die, the job fails instead of training from the start.
  // OK and nothing done outside an elastic job.
  Status StateSynced();
  // The generation of this engine's world (1, 2, ...); 0 outside an elastic job.
  int64_t elastic_generation() const;

  ~Engine();  // Shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Finishes the background thread; operations still pending when it ends fail with Aborted
  // (where every rank shuts down with the same operations submitted, they may finish first).
  // Idempotent.
  Status Shutdown();

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  int cross_rank() const;
  int cross_size() const;
  const Options& options() const;
  // Whether MPI, where this job uses it (started by mpirun, or HVD_CPU_OPERATIONS=mpi), gives
  // this process MPI_THREAD_MULTIPLE, so that the program may call MPI alongside hvd (Horovod's
  // mpi_threads_supported). False where MPI is not in use or the build has none.
  bool mpi_threads_supported() const;

  // Process sets. Adding and removing one is collective: every rank calls it, with the same
  // ranks, in the same order; it blocks until every rank has. Ranks outside the set take part
  // in the agreement only. Without Options::dynamic_process_sets (HVD_DYNAMIC_PROCESS_SETS=1)
  // only the sets in Options::process_sets exist. Adding fails with InvalidArgument for ranks
  // that are out of range, repeated, or those of a set that exists; removing fails for the
  // global set or an id that names none. Operations of a removed set still in flight fail with
  // FailedPrecondition on every member. As in Horovod, a removed set's id is given to the next
  // sets added, the first removed first; then the next unused id. A rank's additions and
  // removals run one at a time: one called while another is in flight on this rank fails with
  // FailedPrecondition.
  StatusOr<int32_t> AddProcessSet(std::vector<int> ranks);
  Status RemoveProcessSet(int32_t id);
  // The set's world ranks, ascending; empty if this rank knows no set `id`.
  std::vector<int> ProcessSetRanks(int32_t id) const;
  std::vector<int32_t> ProcessSetIds() const;

  // The timeline while the job runs (Horovod's hvd.start_timeline / stop_timeline): start
  // writing one to `path` ("%r": each rank its own; else rank 0 only), closing any before;
  // stop closes it. Operations submitted after Start returns are in it. Both need the engine
  // started with a timeline (Options::timeline_path, HVD_TIMELINE=DYNAMIC for none at first):
  // FailedPrecondition otherwise. Not collective: each rank starts and stops its own.
  Status StartTimeline(const std::string& path, bool mark_cycles = false);
  Status StopTimeline();

  // Every operation below returns a handle; invalid arguments give a handle that has already
  // failed with InvalidArgument. Inputs must stay valid until the handle finishes.
  //
  // Each runs on a process set (the last argument; the global set by default), which this rank
  // must be a member of. Ranks, roots and splits count in the set: rank i of a set is its i-th
  // lowest world rank, except a broadcast's root, which is a world rank (as in Horovod).

  // output may alias input (in place); both have the same dtype and element count.
  HandlePtr Allreduce(const std::string& name, const TensorView& input, const TensorView& output,
                      ReduceOp op = ReduceOp::kAverage, double prescale = 1.0,
                      double postscale = 1.0, int32_t process_set = kGlobalProcessSet);
  // The tensors of a group are negotiated and run together.
  std::vector<HandlePtr> GroupedAllreduce(const std::vector<std::string>& names,
                                          const std::vector<TensorView>& inputs,
                                          const std::vector<TensorView>& outputs,
                                          ReduceOp op = ReduceOp::kAverage,
                                          double prescale = 1.0, double postscale = 1.0,
                                          int32_t process_set = kGlobalProcessSet);
  // Concatenates the ranks' tensors along the first dimension, which may differ per rank.
  HandlePtr Allgather(const std::string& name, const TensorView& input,
                      OutputAllocator allocator = nullptr,
                      int32_t process_set = kGlobalProcessSet);
  std::vector<HandlePtr> GroupedAllgather(const std::vector<std::string>& names,
                                          const std::vector<TensorView>& inputs,
                                          int32_t process_set = kGlobalProcessSet);
  // Copies root's input into every rank's output (output may alias input).
  HandlePtr Broadcast(const std::string& name, const TensorView& input, const TensorView& output,
                      int root, int32_t process_set = kGlobalProcessSet);
  // Sends splits[j] rows (first dimension) of input to rank j, in rank order; empty splits
  // means equal parts (first dimension divisible by size).
  HandlePtr Alltoall(const std::string& name, const TensorView& input,
                     const std::vector<int64_t>& splits = {},
                     OutputAllocator allocator = nullptr,
                     int32_t process_set = kGlobalProcessSet);
  // Reduces across ranks and gives rank r its part of the first dimension: parts differ by at
  // most one row, the first (rows % size) ranks get the extra row.
  HandlePtr Reducescatter(const std::string& name, const TensorView& input,
                          ReduceOp op = ReduceOp::kAverage, double prescale = 1.0,
                          double postscale = 1.0, OutputAllocator allocator = nullptr,
                          int32_t process_set = kGlobalProcessSet);
  // Reducescatters each tensor, negotiated and run as one group; each handle owns its part.
  std::vector<HandlePtr> GroupedReducescatter(const std::vector<std::string>& names,
                                              const std::vector<TensorView>& inputs,
                                              ReduceOp op = ReduceOp::kAverage,
                                              double prescale = 1.0, double postscale = 1.0,
                                              int32_t process_set = kGlobalProcessSet);
  HandlePtr Barrier(int32_t process_set = kGlobalProcessSet);
  // Stands for an operation that this rank's caller refused before it reached the engine (a
  // binding that could not take an argument): negotiated under `names` (a group when there are
  // several, as GroupedAllreduce would make it) as that operation would have been, so that every
  // rank's operation fails with `why` (naming this rank) instead of the others waiting for this
  // one. `op` is the operation's kind ("allreduce", "allgather", "broadcast", "alltoall",
  // "reducescatter"). Each handle fails with it too, once every rank has submitted it; until
  // then the names are in flight here.
  std::vector<HandlePtr> Refuse(const std::string& op, const std::vector<std::string>& names,
                                const std::string& why,
                                int32_t process_set = kGlobalProcessSet);
  // This rank has no more data: it takes part in the others' allreduces with zeros until every
  // rank has joined. The handle's join_last_rank() is the last rank that joined. Join is of the
  // global set only, as in Horovod. `device`, as Horovod's: the CUDA device whose zeros this
  // rank contributes to the others' device collectives, when it has not used one yet; -1: the
  // device it has used (a rank that has used none then fails the others' device collectives).
  HandlePtr Join(int device = kCpuDevice);

  EngineImpl* impl() { return impl_.get(); }  // for tests and the benchmark

 private:
  explicit Engine(std::unique_ptr<EngineImpl> impl);
  std::unique_ptr<EngineImpl> impl_;
};

}  // namespace hvd
