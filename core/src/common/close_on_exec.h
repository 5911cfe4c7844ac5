// Marks a descriptor close-on-exec. Every socket hvd opens gets it: a connection inherited by
// a program the training script starts (a shell, a tool run through os.system) would stay open
// after the rank dies, and its peers, seeing no end of stream, would wait for
// HVD_TIMEOUT_SECONDS instead of failing at once. Asio opens and accepts sockets without it.
//
// Thread-safety: stateless.
#pragma once

#include <fcntl.h>

namespace hvd {

inline void CloseOnExec(int fd) {
  if (fd < 0) return;
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0 && (flags & FD_CLOEXEC) == 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

}  // namespace hvd
