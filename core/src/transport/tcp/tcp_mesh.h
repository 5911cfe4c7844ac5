// Connection set-up for a job over TCP, through the rendezvous store.
//
// Steps (every rank):
//   1. Listen on an ephemeral port of the bind address; publish "host:port" under
//      "hvd/addr/<rank>" in the store.
//   2. For every lower rank j: read j's address from the store, connect, and run the
//      authentication handshake (bootstrap/auth.h) whose context is the hello (magic, rank,
//      kind): one data connection per pair, and one control connection from each worker to
//      rank 0; in a job of up to kWorkerLinksUpTo ranks (mesh_hello.h), one control
//      connection per pair (the symmetric fast path's links between workers).
//   3. Accept until every higher rank's data connection (and, on rank 0 or with links between
//      workers, its control connection) has arrived with a valid proof of the job's secret and
//      hello, or the deadline passes. A connection that fails the handshake (no secret, a
//      wrong one, a replay, garbage, silence until the start deadline) is dropped and logged;
//      set-up goes on. A peer that closes a connection it made stops the wait at once: it
//      died, or it gave up (then its reason, which it left in the store, is passed on).
//   4. Close the listener.
// A rank that fails set-up leaves its reason under "hvd/gave-up/<rank>" (not under MPI, whose
// store writes are collective). On a timeout the error names the ranks that never published an
// address: with sequential set-up, the rank this one waits for may itself wait on another.
//
// Thread-safety: Create runs on one thread and uses `io` until it returns.
#pragma once

#include <asio.hpp>
#include <memory>
#include <vector>

#include "bootstrap/store.h"
#include "hvd/options.h"

namespace hvd {

struct TcpMesh {
  std::vector<std::unique_ptr<asio::ip::tcp::socket>> data;     // [peer]; null for self
  // [peer]: rank 0 to every worker; a worker to rank 0, and to every other worker where
  // WorkerLinks(size) (mesh_hello.h); null elsewhere (sized 1 on a worker without them).
  std::vector<std::unique_ptr<asio::ip::tcp::socket>> control;

  static StatusOr<std::unique_ptr<TcpMesh>> Create(asio::io_context& io, const Options& options,
                                                   StoreClient& store, Deadline deadline);

 private:
  // Create's steps; Create adds the reason a rank that gives up leaves in the store.
  static StatusOr<std::unique_ptr<TcpMesh>> Form(asio::io_context& io, const Options& options,
                                                 StoreClient& store, Deadline deadline);
};

// For the set-up steps after the mesh (transport_factory.cc), as Create does: leaves this rank's
// reason for giving up in the store, and turns "peer closed its connection" into the reason the
// peer left there, when it left one within half a second (`what` otherwise). A provisional note
// (its writer is still finding out why its own peer went) is waited on a little longer for its
// final version. Both do nothing with a collective store (MPI).
void LeaveGaveUpNote(StoreClient& store, int rank, const Status& why, bool provisional = false);
Status ExplainLostPeer(StoreClient& store, int peer, const Status& what);

}  // namespace hvd
