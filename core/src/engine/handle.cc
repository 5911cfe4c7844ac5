#include "hvd/engine.h"

namespace hvd {

bool Handle::Poll() const {
  std::lock_guard<std::mutex> l(mu_);
  return done_;
}

Status Handle::Wait() const {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [this] { return done_; });
  return status_;
}

Status Handle::WaitFor(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, timeout, [this] { return done_; })) {
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
  }
  cv_.notify_all();
}

}  // namespace hvd
