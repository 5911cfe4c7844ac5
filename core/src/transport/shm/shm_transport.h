// Shared memory between the ranks of one host, and the router that sends each peer's bytes
// over shared memory or TCP.
//
// Memory. Each rank owns one segment: a memfd (never a name in /dev/shm) holding a doorbell and
// one ring per other rank of its host, into which that rank writes the bytes it sends. Ranks
// pass their segment and an eventfd (the doorbell's bell) to each other over abstract Unix
// sockets (no file either), then close the sockets. When every process that mapped a segment
// has exited, the kernel frees it: a killed job leaves nothing behind.
//
// Rings. A ring is a single-producer, single-consumer byte stream: the sender copies into it
// as space allows and advances `head`; the receiver copies out and advances `tail`. Bytes keep
// their order per peer and a receive of n bytes takes exactly the next n, as over TCP, so every
// algorithm in collectives/ runs unchanged.
//
// Waits. A wait moves bytes on every pending request, shared memory and TCP alike, and runs
// the io_context (heartbeats, control messages, TCP data) between rounds: it polls for the
// spin window, yielding the core on empty rounds, then sleeps in the io_context. A rank about
// to sleep raises its doorbell flag; a peer that moves bytes it waits for rings its eventfd,
// which the io_context is reading, so the sleeper wakes at once.
//
// Failure. The io_context watches each shared-memory peer's process (a pidfd). Once it has
// exited, what its ring still holds is taken, and a request that still cannot complete fails
// the router with PeerLost naming that rank (a peer that finished its part and exited is not
// lost). Its TCP connection is idle and its closing goes unnoticed. A peer that stops making
// progress fails waits at their deadline, stretched while bytes move (as TCP's). Abort fails
// everything, on both paths.
//
// Collectives. When every rank of the job shares this host, allreduce skips the rings: each
// rank publishes its input in its own segment and the others read it there (ShmCollectives in
// the .cc). The other collectives run hvd's algorithms over the rings.
//
// Control. The engine's control links to the ranks of its host go through the segments too
// (ShmControlPlane): no syscall while both ends poll, and the same order and failure reports
// as over TCP.
//
// Thread-safety: as Transport: one thread, the one that runs the io_context.
#pragma once

#include <asio.hpp>
#include <memory>

#include "hvd/options.h"
#include "transport/control.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace hvd {

// Control links over shared memory to the ranks of this host (the .cc says how they work).
class ShmControlPlane : public ControlPoller {
 public:
  // Whether links to `peer` can go over shared memory (it shares this host's segments).
  virtual bool Has(int peer) const = 0;
  // The link to `peer` (once per peer), reporting as a TCP ControlChannel does; null if !Has.
  virtual std::shared_ptr<ControlLink> Link(int peer, ControlLink::MessageFn on_message,
                                            ControlLink::ErrorFn on_error) = 0;
};

// The control plane of a transport that ConnectSharedMemory returned, or null (TCP only).
std::shared_ptr<ShmControlPlane> SharedMemoryControl(Transport& transport);

// Sets up shared memory among the ranks of each host that `tcp` connects and returns the
// router over both, or `tcp` itself when no two ranks share a host or HVD_SHM=off. Every rank
// of the job calls it (it exchanges with all of them over `tcp`). With HVD_SHM=on a rank that
// cannot set it up fails every rank's set-up naming it; with auto such pairs stay on TCP. When
// a peer's connection broke during the set-up, *lost_peer names it. `tcp` is taken (moved from)
// only on success: on failure the caller still holds the connections, so it can leave its
// reason in the store before its peers see them close.
StatusOr<std::unique_ptr<Transport>> ConnectSharedMemory(std::unique_ptr<TcpTransport>& tcp,
                                                         const Options& options,
                                                         Deadline deadline, int* lost_peer);

}  // namespace hvd
