// Keeps the control plane moving while the thread that runs the engine's work is inside code
// that is not hvd's and has no deadline: a framework's output allocator, which may wait on a
// memory pool, another stream or a lock of its own for as long as it likes; CUDA's allocations
// and frees of device and pinned host memory (a free waits for every stream of the device, the
// framework's long kernels included; pinning takes seconds a GiB).
//
// Protocol:
//   1. The thread that holds the engine's work (ProgressHelper::run) calls the foreign code
//      through Call(). Enter marks the call as in progress, with its start time.
//   2. The keeper thread (started by the first call, then asleep while no call is in progress)
//      waits out kGrace from the start. A call that returns within it costs two lock
//      round trips and, when the keeper sleeps, one wake-up.
//   3. Past the grace, the keeper runs `poll` every kEvery until the call returns: heartbeats
//      go out, the peers' messages are read, an abort is relayed, and rank 0 answers the
//      process sets it is not a member of (as from inside a data-plane wait). It polls under
//      the keeper's lock, and Leave takes that lock: the engine's thread goes on only once a
//      poll in progress has finished, and the poll sees everything that thread wrote before
//      the call. So the engine's state has one user at a time, as always: the run lock's
//      holder, or the keeper on its behalf while the holder is away.
//   4. `poll` is what the engine already runs between slices of long host work (at the same
//      points of an execution), so what it may change is what those polls may change.
//   5. A call that lasts `limit` (HVD_TIMEOUT_SECONDS) is taken as stuck: the keeper runs
//      `give_up` once, under its lock as a poll (the engine tells every rank that this one is
//      stuck and fails the job: its peers' data-plane waits, which stalled as long, would
//      otherwise each blame the neighbour they wait on), then stops polling, with a warning.
//      Polling resumes with the next call.
//
// Thread-safety: Call() from the thread that holds the engine's work only; the destructor
// after the last Call() has returned.
#pragma once

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "common/time.h"

namespace hvd {

class ControlKeeper {
 public:
  static constexpr auto kGrace = std::chrono::milliseconds(20);
  static constexpr auto kEvery = std::chrono::milliseconds(1);
  // How long the keeper stays awake after a call (a burst of allocations wakes it once).
  static constexpr auto kWatch = std::chrono::seconds(1);

  ControlKeeper(std::function<void()> poll, Clock::duration limit,
                std::function<void(Clock::duration)> give_up = nullptr)
      : poll_(std::move(poll)), give_up_(std::move(give_up)), limit_(limit) {}
  ~ControlKeeper();
  ControlKeeper(const ControlKeeper&) = delete;
  ControlKeeper& operator=(const ControlKeeper&) = delete;

  // Runs f(), exceptions included, with the control plane kept moving while it takes long.
  template <class F>
  decltype(auto) Call(F&& f) {
    Enter();
    struct Leaver {
      ControlKeeper* k;
      ~Leaver() { k->Leave(); }
    } leaver{this};
    return f();
  }

  // Polls run on the caller's behalf so far (for tests).
  uint64_t polls() const;

 private:
  void Enter();
  void Leave();
  void Run();

  const std::function<void()> poll_;
  const std::function<void(Clock::duration)> give_up_;  // with how long the call has run
  const Clock::duration limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;             // started by the first Enter
  bool no_thread_ = false;         // guarded by mu_: it could not start (calls run unwatched)
  bool in_call_ = false;           // guarded by mu_
  bool asleep_ = false;            // guarded by mu_: the keeper waits for a call, untimed
  bool stop_ = false;              // guarded by mu_
  Clock::time_point since_;        // guarded by mu_: the call's start
  uint64_t calls_ = 0;             // guarded by mu_: calls entered so far
  Clock::time_point last_end_;     // guarded by mu_: the last call's end
  uint64_t polls_ = 0;             // guarded by mu_
};

}  // namespace hvd
