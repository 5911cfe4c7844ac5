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
//   4. The data plane: a TcpTransport over the mesh's data connections; with
//      HVD_CPU_OPERATIONS=mpi, MpiCollectives becomes its CollectiveOffload. Then shared memory
//      among the ranks of each host (HVD_SHM): a router sends those peers' bytes through it
//      and the rest over TCP (transport/shm/shm_transport.h).
//   5. The control plane: one ControlLink per control connection, started; to a peer that
//      shares this host's memory the link goes through it (ShmControlPlane) instead. When
//      every rank shares it, each worker also links to each other worker through it.
// Between 3 and 4 the ranks gather their layout (host of each rank). A rank that fails after
// the mesh leaves its reason in the store, as the mesh does, and a rank that sees a peer's
// connection close passes on the reason that peer left.
// A world of one rank skips every step: its transport has no peers and no control links.
//
// Thread-safety: ConnectJob runs on the thread that creates the engine and uses `io` until it
// returns.
#pragma once

#include <asio.hpp>
#include <memory>

#include "bootstrap/store.h"
#include "hvd/options.h"
#include "transport/collective_offload.h"
#include "transport/control.h"
#include "transport/group_view.h"
#include "transport/transport.h"

namespace hvd {

// What set-up leaves running for the engine: the store rank 0 hosts under Slurm, MPI and its
// collectives. Destroying it stops them (and calls MPI_Finalize if hvd initialised MPI), so the
// engine keeps it until its transport is gone.
class JobBackends {
 public:
  virtual ~JobBackends() = default;
  // The collectives backend for the transport, owned by this object; null: hvd's algorithms.
  virtual CollectiveOffload* offload() = 0;
  // The engine's shutdown has ended on every rank: lets MPI finish now if hvd started it
  // (MpiContext::FinishEarly), on the calling thread. Nothing may use the backends afterwards.
  virtual void FinishEarly() {}
  // Whether FinishEarly would finalize MPI now.
  virtual bool FinishesEarly() const { return false; }
  // The job failed (a peer lost or silent, an abort): MPI, where hvd started it, is left
  // unfinalized, since MPI_Finalize could wait for a lost or stopped peer forever; mpirun then
  // ends the job as that rank exits.
  virtual void JobFailed(const Status& why) { (void)why; }
};

struct JobConnections {
  std::unique_ptr<JobBackends> backends;  // never null; must outlive `transport`
  std::unique_ptr<Transport> transport;
  std::vector<std::shared_ptr<ControlLink>> control;  // rank 0: [peer]; a worker: [0]
  // A worker of a job with all_linked: [peer] a link to each other worker (for the symmetric
  // fast path, engine/rounds.cc), through shared memory or TCP; null at 0 and itself.
  // Otherwise empty.
  std::vector<std::shared_ptr<ControlLink>> peers;
  // Every other rank is linked to this one directly (control or peers): the ranks of one host
  // sharing memory, a job of two, or, with HVD_SYMMETRIC_NEGOTIATION=on, a job of up to
  // kWorkerLinksUpTo ranks (transport/tcp/mesh_hello.h), whose workers link to each other over
  // TCP too. Every rank of a job finds the same.
  bool all_linked = false;
  // Every link to another rank is in shared memory (one host).
  bool links_in_memory = false;
  // Polled by the engine for the links that the io_context alone does not drive; may be null.
  std::shared_ptr<ControlPoller> poller;
  bool control_over_tcp = false;  // some link is a TCP ControlChannel (read by the io_context)
  // Every rank's host as the launcher placed them (GatherTopology): when it does not describe
  // hosts of equal size, the ranks grouped by the machine they run on, and layout_note says why.
  Topology topology;
  std::string layout_note;
  // hvdrun's store (Bootstrap::kStore), kept for the note a rank leaves when another rank's
  // failure ends its job (FailureNoteKey); null under mpirun and Slurm, where no launcher
  // reads it.
  std::unique_ptr<StoreClient> store;
};

// The process sets given at start (Options::process_sets) that the engine adds, in order: each
// sorted; one whose ranks are the world's or an earlier one's is left out, as in Horovod (it
// names that set and takes no id).
std::vector<std::vector<int>> InitialProcessSets(const Options& o);

// How long a rank polls after work, and inside data waits, before it sleeps in the kernel
// (HVD_SPIN_MICROSECONDS; 100 µs by default).
std::chrono::microseconds SpinWindow(const Options& options);

// Where the options name the job's world as an MPI communicator (Options::mpi_comm,
// mpi_world_ranks): rank, size, local and cross identity from it (MpiContext::TakeIdentity),
// before anything else uses them. Otherwise does nothing. In a process no MPI launcher
// started, a list of every launched rank in order is dropped (the world as launched) and any
// other list refused; a communicator or a list there, in a build without MPI, fails.
Status TakeIdentityFromMpi(Options* options);

// Whether MPI is initialised (and not finalized) in this process with MPI_THREAD_MULTIPLE.
bool MpiThreadMultiple();

// `on_message` and `on_error` receive the control links' traffic (transport/control.h).
StatusOr<JobConnections> ConnectJob(asio::io_context& io, const Options& options,
                                    Deadline deadline, ControlLink::MessageFn on_message,
                                    ControlLink::ErrorFn on_error);

}  // namespace hvd
