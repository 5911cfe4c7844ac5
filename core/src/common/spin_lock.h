// A lock for critical sections of a pointer's push or pop, or a few field writes, that threads
// take at a high rate: an exchange to take it and a plain store to leave it, where a mutex costs
// two atomic operations and two calls. A waiter yields the core (the holder may have lost its
// own) instead of sleeping, so the holder never pays for a wake-up.
//
// Thread-safety: a lock (Lockable); not for std::condition_variable, nor for sections that
// wait or last long.
#pragma once

#include <sched.h>

#include <atomic>

namespace hvd {

class SpinLock {
 public:
  SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  void lock() {
    while (held_.exchange(true, std::memory_order_acquire)) {
      while (held_.load(std::memory_order_relaxed)) sched_yield();
    }
  }
  bool try_lock() {
    return !held_.load(std::memory_order_relaxed) &&
           !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

}  // namespace hvd
