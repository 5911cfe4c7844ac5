#include <sched.h>

#include "device/device.h"
#include "engine/engine_impl.h"
#include "hvd/engine.h"

namespace hvd {

bool Handle::Spin(std::chrono::steady_clock::time_point limit) const {
  if (finished_.load(std::memory_order_acquire)) return true;
  if (spin_.count() <= 0) return false;
  const auto end = std::min(limit, std::chrono::steady_clock::now() + spin_);
  for (;;) {
    if (finished_.load(std::memory_order_acquire)) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    sched_yield();
  }
}

bool Handle::Poll() const { return finished_.load(std::memory_order_acquire); }

// A waiter counts itself in sleepers_ before it looks at finished_ under mu_ and sleeps, and
// Complete raises finished_ before it reads the count (both sequentially consistent): either
// the waiter sees finished_, or Complete sees the waiter and notifies under mu_, which the
// waiter holds from its look until it sleeps.
Status Handle::Wait() const {
  // Once finished_ is seen, status_ is final (Complete sets it before, and never again).
  if (finished_.load(std::memory_order_acquire)) return status_;
  if (helper_ != nullptr) HelpProgress(helper_, *this, spin_, Clock::time_point::max());
  if (Spin(std::chrono::steady_clock::time_point::max())) return status_;
  sleepers_.fetch_add(1);
  {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return finished_.load(); });
  }
  sleepers_.fetch_sub(1);
  return status_;
}

Status Handle::WaitFor(std::chrono::milliseconds timeout) const {
  const auto until = std::chrono::steady_clock::now() + timeout;
  if (helper_ != nullptr && !finished_.load(std::memory_order_acquire)) {
    HelpProgress(helper_, *this, spin_, until);
  }
  if (Spin(until)) return status_;
  sleepers_.fetch_add(1);
  bool done;
  {
    std::unique_lock<std::mutex> l(mu_);
    done = cv_.wait_until(l, until, [this] { return finished_.load(); });
  }
  sleepers_.fetch_sub(1);
  if (!done) {
    return Status::Timeout("operation still pending after " + std::to_string(timeout.count()) +
                           " ms");
  }
  return status_;
}

Status Handle::status() const {
  return finished_.load(std::memory_order_acquire) ? status_ : Status();
}

void Handle::Complete(Status status) {
  if (claimed_.exchange(true, std::memory_order_acq_rel)) return;
  status_ = std::move(status);
  finished_.store(true);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> l(mu_);
    cv_.notify_all();
  }
}

Status Handle::StreamWait(void* stream) const {
  if (!cuda_event_) return Status::OK();
  DeviceRuntime* rt = GetDeviceRuntime();
  if (rt == nullptr) return Status::FailedPrecondition("this build has no CUDA");
  return rt->StreamWaitEvent(stream, cuda_event_.get());
}

}  // namespace hvd
