// Setting up a job's connections: how the ranks find each other (Options::bootstrap) and what
// runs the collectives (Options::cpu_operations). This is the one place that knows which
// optional backends the build has.
//
// Steps (every rank of a job with size > 1):
//   1. MPI, when the bootstrap or the collectives need it: MPI_Init_thread unless the program
//      did it, a private communicator, and a check that MPI's world is hvd's.
//   2. A store to meet at:
//        kStore  the rendezvous store at rendezvous_addr:rendezvous_port (hvdrun's);
//        kSlurm  the same, but rank 0 first starts it (all interfaces, rendezvous_port) and
//                keeps it until the engine shuts down;
//        kMpi    MpiAddressStore (an MPI_Allgather); without HVD_SECRET, rank 0 draws the job's
//                secret and broadcasts it over MPI.
//   3. The TCP mesh through that store (transport/tcp/tcp_mesh.h). On a multi-node job whose
//      bind address was left at the loopback default, each rank listens on the address that
//      routes to rank 0's host (Slurm) or that its host name resolves to (MPI).
//   4. With HVD_CPU_OPERATIONS=mpi, MpiCollectives becomes the transport's CollectiveOffload.
//
// Thread-safety: ConnectJob runs on the thread that creates the engine and uses `io` until it
// returns.
#pragma once

#include <asio.hpp>
#include <memory>

#include "hvd/options.h"
#include "transport/collective_offload.h"
#include "transport/tcp/tcp_mesh.h"

namespace hvd {

// What set-up leaves running for the engine: the store rank 0 hosts under Slurm, MPI and its
// collectives. Destroying it stops them (and calls MPI_Finalize if hvd initialised MPI), so the
// engine keeps it until its transport is gone.
class JobBackends {
 public:
  virtual ~JobBackends() = default;
  // The collectives backend for the transport, owned by this object; null: hvd's algorithms.
  virtual CollectiveOffload* offload() = 0;
};

struct JobConnections {
  std::unique_ptr<TcpMesh> mesh;
  std::unique_ptr<JobBackends> backends;  // never null
};

StatusOr<JobConnections> ConnectJob(asio::io_context& io, const Options& options,
                                    Deadline deadline);

}  // namespace hvd
