// A mutex for critical sections of a few microseconds that two threads take at a high rate
// (a caller enqueuing tensors, the thread running the engine's work completing them). A waiter
// spins briefly before it sleeps in the kernel: with std::mutex it sleeps at once, and the
// holder pays a futex wake on unlock, so a step of many tensors spent about a tenth of its
// time in futex calls between the two threads. glibc's adaptive mutex does the spinning; a
// build against another C library gets a plain mutex.
//
// Thread-safety: a mutex (Lockable); not for use with std::condition_variable.
#pragma once

#include <pthread.h>

namespace hvd {

class ShortMutex {
 public:
  ShortMutex() {
#if defined(PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP)
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&m_, &a);
    pthread_mutexattr_destroy(&a);
#else
    pthread_mutex_init(&m_, nullptr);
#endif
  }
  ~ShortMutex() { pthread_mutex_destroy(&m_); }
  ShortMutex(const ShortMutex&) = delete;
  ShortMutex& operator=(const ShortMutex&) = delete;

  void lock() { pthread_mutex_lock(&m_); }
  bool try_lock() { return pthread_mutex_trylock(&m_) == 0; }
  void unlock() { pthread_mutex_unlock(&m_); }

 private:
  pthread_mutex_t m_;
};

}  // namespace hvd
