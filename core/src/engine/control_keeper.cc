#include "engine/control_keeper.h"

#include <system_error>

#include "common/logging.h"

namespace hvd {

ControlKeeper::~ControlKeeper() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

uint64_t ControlKeeper::polls() const {
  std::lock_guard<std::mutex> l(mu_);
  return polls_;
}

void ControlKeeper::Enter() {
  std::lock_guard<std::mutex> l(mu_);
  if (!thread_.joinable() && !no_thread_) {
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error& e) {
      // Out of threads (a process or cgroup limit): the calls run unwatched, as before the
      // keeper, rather than fail.
      no_thread_ = true;
      HVD_LOG(kWarning) << "the control keeper's thread could not start (" << e.what()
                        << "): heartbeats wait while a framework's allocator or CUDA runs";
    }
  }
  in_call_ = true;
  since_ = Clock::now();
  ++calls_;
  if (asleep_) cv_.notify_one();
}

void ControlKeeper::Leave() {
  std::lock_guard<std::mutex> l(mu_);  // (waits for a poll in progress)
  in_call_ = false;
  last_end_ = Clock::now();
}

void ControlKeeper::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    const auto now = Clock::now();
    if (!in_call_) {
      if (now - last_end_ >= kWatch) {
        asleep_ = true;
        cv_.wait(l, [this] { return stop_ || in_call_; });
        asleep_ = false;
      } else {
        // Awake a while after a call: the next one starts without a wake-up, and is seen
        // within a grace of its start.
        cv_.wait_for(l, kGrace);
      }
      continue;
    }
    if (now - since_ < kGrace) {
      cv_.wait_until(l, since_ + kGrace);
      continue;
    }
    if (now - since_ >= limit_) {
      HVD_LOG(kWarning) << "code that is not hvd's (a framework's output allocator, or CUDA "
                           "allocating or freeing memory) has run for "
                        << std::chrono::duration<double>(now - since_).count()
                        << " s (HVD_TIMEOUT_SECONDS): this rank is taken as stuck, and its "
                           "heartbeats stop until it returns";
      if (give_up_) give_up_(now - since_);
      const uint64_t stuck = calls_;
      asleep_ = true;
      cv_.wait(l, [&] { return stop_ || calls_ != stuck; });
      asleep_ = false;
      continue;
    }
    poll_();
    ++polls_;
    cv_.wait_for(l, kEvery);
  }
}

}  // namespace hvd
