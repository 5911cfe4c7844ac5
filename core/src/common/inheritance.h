// What a process started from a rank inherits of hvd.
//
// A program the rank starts with exec (a shell, a tool run through os.system) gets none of hvd's
// sockets: KeepFromChildren marks them close-on-exec (Asio opens and accepts sockets without).
//
// A child forked without exec (a DataLoader worker, a multiprocessing pool with the fork start
// method, os.fork) shares them. While it lived, a peer would see no end of stream when the rank
// died, and wait for HVD_TIMEOUT_SECONDS instead of failing at once. So in each child forked
// after the first KeepFromChildren or WatchForks, every registered descriptor that still refers
// to the socket it was registered for is pointed at /dev/null: the child's reference goes, the
// rank's stays, and the number stays taken (the child's copy of the engine is never torn down,
// see below, and closes nothing). A fork on another thread in the moment between a socket's
// opening (by Asio) and its KeepFromChildren leaves the child that one socket as it is.
//
// Such a child has none of the engine's threads either: an operation there would wait forever,
// and tearing its copy of the engine down would touch what the rank still uses. ForkGeneration()
// lets the engine tell (engine.cc): it refuses operations in the child, fails the wait of a
// handle the rank started before the fork, and leaves its state alone at shutdown.
//
// Thread-safety: every function may be called from any thread. The registry's lock is held
// across fork (pthread_atfork), so the child sees it whole.
#pragma once

#include <cstdint>

namespace hvd {

// Marks `fd` close-on-exec and has it dropped in children forked without exec. For hvd's own
// sockets; a negative fd is ignored.
void KeepFromChildren(int fd);

// Installs the fork handlers (once per process); from then on ForkGeneration() counts forks.
void WatchForks();

// How many forks without exec lie between this process and the one that called WatchForks: 0
// there, one more in each forked child. An object that records it at creation is in a forked
// child when it differs.
uint64_t ForkGeneration();

}  // namespace hvd
