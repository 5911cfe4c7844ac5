#include "common/inheritance.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace hvd {

namespace {

// A registered descriptor and the file it referred to then: a number closed and reused for
// another file since is left alone in the child.
struct Registered {
  int fd;
  dev_t dev;
  ino_t ino;
};

// Never destroyed: a fork may come at any time, static destruction included.
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::vector<Registered>& Registry() {  // guarded by RegistryMutex()
  static auto* list = new std::vector<Registered>();
  return *list;
}
std::atomic<uint64_t> g_generation{0};

bool Refers(const Registered& r) {
  struct stat st;
  return ::fstat(r.fd, &st) == 0 && st.st_dev == r.dev && st.st_ino == r.ino;
}

void BeforeFork() { RegistryMutex().lock(); }
void InParent() { RegistryMutex().unlock(); }

// Runs in the child, which has one thread: only async-signal-safe calls (fstat, open, dup3,
// close) besides the vector's walk.
void InChild() {
  g_generation.fetch_add(1, std::memory_order_relaxed);
  int null = -1;
  for (const Registered& r : Registry()) {
    if (!Refers(r)) continue;
    if (null < 0) null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || ::dup3(null, r.fd, O_CLOEXEC) < 0) ::close(r.fd);
  }
  if (null >= 0) ::close(null);
  Registry().clear();  // what is left refers to /dev/null; the child's own sockets come later
  RegistryMutex().unlock();
}

}  // namespace

void WatchForks() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Made here, not first in a child (where allocating is not async-signal-safe).
    RegistryMutex();
    Registry().reserve(64);
    ::pthread_atfork(BeforeFork, InParent, InChild);
  });
}

uint64_t ForkGeneration() { return g_generation.load(std::memory_order_relaxed); }

void KeepFromChildren(int fd) {
  if (fd < 0) return;
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0 && (flags & FD_CLOEXEC) == 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  struct stat st;
  if (::fstat(fd, &st) != 0) return;
  WatchForks();
  std::lock_guard<std::mutex> l(RegistryMutex());
  auto& list = Registry();
  // One entry per number: a number registered before was closed since (it is this file's now),
  // so its entry is this one's. Entries are not checked here against the files they name: a
  // number another thread may be closing or reusing at this moment is not this thread's to
  // look at (the child checks each, alone). The list holds at most the numbers ever in use.
  for (Registered& r : list) {
    if (r.fd == fd) {
      r = Registered{fd, st.st_dev, st.st_ino};
      return;
    }
  }
  list.push_back(Registered{fd, st.st_dev, st.st_ino});
}

}  // namespace hvd
