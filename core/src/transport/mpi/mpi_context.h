// MPI as hvd uses it: initialisation (unless the program has done it already), a private
// duplicate of the job's world (MPI_COMM_WORLD, or the communicator or ranks of it that
// Options::mpi_comm / mpi_world_ranks name), and the one wrapper through which MPI's error
// codes become a Status.
//
// Threads: MPI is initialised by the thread that creates the engine, and used afterwards by the
// thread running the engine's work (collectives: the background thread, or a caller waiting on a
// small operation in its place, one at a time), and at the end by the background thread as the
// job's shutdown ends (FinishEarly, where hvd initialised MPI) or else by the thread that destroys
// the engine. That needs MPI_THREAD_SERIALIZED or better when the collectives run over MPI; hvd
// asks for MPI_THREAD_MULTIPLE so that the program may use MPI too. Only the bootstrap (on the
// creating thread) and MPI_Finalize run when MPI merely bootstraps the TCP mesh; then any level
// does.
//
// Waiting: every non-blocking MPI call is completed by Wait, which polls MPI_Test until the
// request completes or the deadline passes: it yields for the first ~1 ms (collectives of up
// to ~1 MiB finish in that time) and then sleeps 50 us between polls, so that ranks sharing
// cores do not starve each other. A request that outlives its deadline cannot be cancelled
// (MPI cannot cancel collectives): the context is then broken, every later call fails at once
// with that Timeout, and MPI_Finalize is skipped (it could wait for the lost peer forever).
// Between polls of MPI it calls the wait poll (SetWaitPoll) at most every kWaitPollEvery: the
// engine's control plane. A failure it returns (the engine aborted) breaks the context the same
// way.
//
// Thread-safety: not thread-safe; one thread at a time (see above).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

#include "common/time.h"
#include "hvd/options.h"
#include "hvd/status.h"

namespace hvd {

class MpiContext {
 public:
  // Where the options name the job's world as an MPI communicator (Options::mpi_comm or
  // mpi_world_ranks; else it does nothing): initialises MPI unless the program has, takes
  // rank, size, local rank and size (the members sharing this host's memory) and cross rank
  // and size from that communicator, and sets the bootstrap to kMpi. Fails where the launcher's
  // world is not MPI's (a process started without mpirun), or where this process is not one of
  // mpi_world_ranks. (A list in a process no MPI launcher started never gets here:
  // TakeIdentityFromMpi, transport/transport_factory.h.)
  static Status TakeIdentity(Options* options);
  // Initialises MPI if it is not yet, and checks that the job's MPI world is hvd's: the same
  // size and this process at options.rank. need_threads: the background thread will call MPI
  // (fail with FailedPrecondition when MPI provides less than MPI_THREAD_SERIALIZED).
  static StatusOr<std::unique_ptr<MpiContext>> Create(const Options& options, bool need_threads);
  // Frees the communicator and calls MPI_Finalize if hvd initialised MPI, nothing broke and no
  // other context is alive in the process (a second engine).
  ~MpiContext();
  // The same, now and from any thread, where hvd initialised MPI (at a level that allows it):
  // the engine calls it as its shutdown ends on every rank, as Horovod's background thread
  // finalizes MPI, so that a rank that ends first (its program failed) does not wait in
  // MPI_Finalize until every other rank's program ends; mpirun then sees it exit. So, as in
  // Horovod, a program that uses MPI itself after hvd shuts down (on any rank) initialises MPI
  // before hvd does; then hvd leaves it alone. MPI asks for MPI_Finalize on the thread that
  // initialised it; Open MPI (MPI_THREAD_MULTIPLE, which hvd asks for) takes it from another.
  // Nothing may use MPI through this context afterwards. Idempotent. With another context alive
  // (a second engine in the process) it frees the communicator only: the last one finalizes.
  void FinishEarly();
  // Whether FinishEarly finalizes (else it does nothing, and MPI is left to the destructor).
  bool CanFinishEarly() const {
    return !finished_ && finalize_ && provided_ >= MPI_THREAD_SERIALIZED && broken_.ok();
  }

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // OK, or the Status of the first failure so far (the communicator is gone).
  const Status& broken() const { return broken_; }
  // The job failed elsewhere (hvd's own links found a peer lost or silent): broken as if an
  // MPI call had failed, so that MPI_Finalize is skipped.
  void Abandon(const Status& why) { Break(why); }

  // Turns an MPI return code into a Status naming `what`; a failure breaks the context.
  Status Check(int rc, const std::string& what);
  // Completes `req` (see Waiting above).
  Status Wait(MPI_Request* req, Deadline deadline, const std::string& what);
  void SetWaitPoll(std::function<Status()> poll) { poll_ = std::move(poll); }

 private:
  MpiContext() = default;
  Status Break(Status why);
  // Leaves the process's count of live contexts; whether none is left (MPI may finalize).
  bool Leave();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool finalize_ = false;  // hvd called MPI_Init_thread, so it calls MPI_Finalize
  int provided_ = 0;       // the thread level MPI provides
  bool finished_ = false;  // FinishEarly has freed the communicator (and finalized, if last)
  bool counted_ = false;   // among the live contexts (Create succeeded; not yet left)
  Status broken_;
  std::function<Status()> poll_;
};

// The name of an MPI thread level, for messages.
const char* MpiThreadLevelName(int level);

}  // namespace hvd
