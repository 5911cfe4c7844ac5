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

// A waiter counts itself in sleepers_ under mu_ before it sleeps, and Complete reads the count
// after setting done_ under mu_: either the waiter sees done_, or Complete sees the waiter.
Status Handle::Wait() const {
  // Once finished_ is seen, status_ is final (Complete sets it before, and never again).
  if (finished_.load(std::memory_order_acquire)) return status_;
  if (helper_ != nullptr) HelpProgress(helper_, *this, spin_, Clock::time_point::max());
  if (Spin(std::chrono::steady_clock::time_point::max())) return status_;
  std::unique_lock<std::mutex> l(mu_);
  if (!done_) {
    ++sleepers_;
    cv_.wait(l, [this] { return done_; });
    --sleepers_;
  }
  return status_;
}

Status Handle::WaitFor(std::chrono::milliseconds timeout) const {
  const auto until = std::chrono::steady_clock::now() + timeout;
  if (helper_ != nullptr && !finished_.load(std::memory_order_acquire)) {
    HelpProgress(helper_, *this, spin_, until);
  }
  Spin(until);
  std::unique_lock<std::mutex> l(mu_);
  ++sleepers_;
  const bool done = cv_.wait_until(l, until, [this] { return done_; });
  --sleepers_;
  if (!done) {
    return Status::Timeout("operation still pending after " + std::to_string(timeout.count()) +
                           " ms");
  }
  return status_;
}

Status Handle::status() const {
  std::lock_guard<std::mutex> l(mu_);
  return status_;
}

void Handle::Complete(Status status) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (done_) return;
    status_ = std::move(status);
    done_ = true;
    finished_.store(true, std::memory_order_release);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
}

Status Handle::StreamWait(void* stream) const {
  if (!cuda_event_) return Status::OK();
  DeviceRuntime* rt = GetDeviceRuntime();
  if (rt == nullptr) return Status::FailedPrecondition("this build has no CUDA");
  return rt->StreamWaitEvent(stream, cuda_event_.get());
}

}  // namespace hvd
