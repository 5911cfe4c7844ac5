#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

#include "device/device.h"
#include "engine/engine_impl.h"
#include "hvd/engine.h"

namespace hvd {

namespace {

// The futex calls on a handle's state word (a std::atomic<uint32_t> is one 32-bit word).
void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected, const timespec* timeout) {
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected,
          timeout, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

// A caller blocked in a handle's wait, counted for the engine (ProgressHelper::blocked).
class BlockedScope {
 public:
  explicit BlockedScope(ProgressHelper* p) : p_(p) {
    if (p_) p_->blocked.fetch_add(1, std::memory_order_relaxed);
  }
  ~BlockedScope() {
    if (p_) p_->blocked.fetch_sub(1, std::memory_order_relaxed);
  }
  BlockedScope(const BlockedScope&) = delete;
  BlockedScope& operator=(const BlockedScope&) = delete;

 private:
  ProgressHelper* const p_;
};

// A pending handle seen in a child forked after it was made: the engine's threads that would
// finish it stayed in the parent.
Status ForkedWait() {
  return Status::FailedPrecondition(
      "this operation was started before this process was forked from the rank; a forked child "
      "has none of hvd's threads and cannot see it finish: wait for it in the rank's own process");
}

}  // namespace

const Handle::Results& Handle::results() const {
  static const Results kNone;
  return results_ ? *results_ : kNone;
}

bool Handle::Spin(std::chrono::steady_clock::time_point limit) const {
  if (Finished()) return true;
  if (spin_.count() <= 0) return false;
  const auto end = std::min(limit, std::chrono::steady_clock::now() + spin_);
  for (;;) {
    if (Finished()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    sched_yield();
  }
}

bool Handle::Finished() const {
  return (state_.load(std::memory_order_acquire) & kFinished) != 0;
}

bool Handle::Poll() const {
  if (Finished()) return true;
  if (fork_generation_ != ForkGeneration()) return true;  // never here: Wait says why
  sched_yield();
  return Finished();
}

// A waiter raises kSleeping with a compare-and-swap from a state without kFinished, and sleeps
// only while the word is still that state; Complete raises kFinished with one atomic
// read-modify-write and wakes the word if it saw kSleeping. So either the waiter's swap comes
// first, and Complete wakes it (or the futex call sees the word changed and returns at once), or
// Complete's comes first, and the waiter sees kFinished.
bool Handle::Sleep(std::chrono::steady_clock::time_point limit) const {
  for (;;) {
    uint32_t s = state_.load(std::memory_order_acquire);
    if (s & kFinished) return true;
    if (!(s & kSleeping)) {
      if (!state_.compare_exchange_weak(s, s | kSleeping, std::memory_order_acq_rel)) continue;
      s |= kSleeping;
    }
    if (limit == std::chrono::steady_clock::time_point::max()) {
      FutexWait(&state_, s, nullptr);
      continue;
    }
    const auto left = limit - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return Finished();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec t;
    t.tv_sec = static_cast<time_t>(ns / 1000000000);
    t.tv_nsec = static_cast<long>(ns % 1000000000);  // NOLINT(runtime/int): timespec's type
    FutexWait(&state_, s, &t);
  }
}

Status Handle::Wait() const {
  // Once finished, status_ is final (Complete sets it before, and never again).
  if (Finished()) return status_;
  if (fork_generation_ != ForkGeneration()) return ForkedWait();
  if (helper_ != nullptr && helps_) HelpProgress(helper_, *this, spin_, Clock::time_point::max());
  BlockedScope blocked(Finished() ? nullptr : helper_);
  if (!Spin(std::chrono::steady_clock::time_point::max())) {
    Sleep(std::chrono::steady_clock::time_point::max());
  }
  return status_;
}

Status Handle::WaitFor(std::chrono::milliseconds timeout) const {
  // A timeout the clock cannot add (about 292 years in nanoseconds) is no limit: it would wrap
  // into the past and time out at once.
  const auto now = std::chrono::steady_clock::now();
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::time_point::max() - now);
  if (timeout >= room) return Wait();
  if (!Finished() && fork_generation_ != ForkGeneration()) return ForkedWait();
  const auto until = now + timeout;
  if (helper_ != nullptr && helps_ && !Finished()) HelpProgress(helper_, *this, spin_, until);
  BlockedScope blocked(Finished() ? nullptr : helper_);
  if (Spin(until) || Sleep(until)) return status_;
  sched_yield();  // as Poll: a loop of short waits leaves the engine's threads their time
  return Status::Timeout("operation still pending after " + std::to_string(timeout.count()) +
                         " ms");
}

Status Handle::status() const { return Finished() ? status_ : Status(); }

void Handle::Complete(Status status) {
  uint32_t s = state_.load(std::memory_order_relaxed);
  if (status.ok()) {
    // status_ is OK from the start and only Complete writes it: claiming and finishing are one
    // step (one atomic operation for each of a step's many handles).
    do {
      if (s & kClaimed) return;
    } while (!state_.compare_exchange_weak(s, s | kClaimed | kFinished,
                                           std::memory_order_acq_rel));
    if (s & kSleeping) FutexWakeAll(&state_);
    return;
  }
  if (state_.fetch_or(kClaimed, std::memory_order_acq_rel) & kClaimed) return;
  status_ = std::move(status);
  if (state_.fetch_or(kFinished, std::memory_order_acq_rel) & kSleeping) FutexWakeAll(&state_);
}

Status Handle::StreamWait(void* stream) const {
  const std::shared_ptr<void>& event = results().cuda_event;
  if (!event) return Status::OK();
  DeviceRuntime* rt = GetDeviceRuntime();
  if (rt == nullptr) return Status::FailedPrecondition("this build has no CUDA");
  return rt->StreamWaitEvent(stream, event.get());
}

}  // namespace hvd
