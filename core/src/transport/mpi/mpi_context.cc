#include "transport/mpi/mpi_context.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <limits>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/logging.h"

namespace hvd {

namespace {

// Yield (no sleep) while a collective is young: up to ~1 MiB finishes in that time, and sleeping
// between MPI_Test calls would stall MPI's progress. Measured on 2 shared cores, 2 ranks: 1 MiB
// allreduce 370 us with 1 ms of yielding vs 500 us with 0.2 ms; for 16 MiB sleeping sooner wins
// (the yielding rank takes CPU from the one reducing).
constexpr auto kYieldPhase = std::chrono::microseconds(1000);
constexpr auto kPollSleep = std::chrono::microseconds(50);
// How often a wait also polls the engine's control plane (an epoll syscall and the handlers it
// runs): rarely enough that a small collective does not pay for it.
constexpr auto kWaitPollEvery = std::chrono::microseconds(50);

std::string ErrorString(int rc) {
  char buf[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(buf, static_cast<size_t>(len));
}

}  // namespace

const char* MpiThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown MPI thread level";
}

namespace {

// Whether hvd called MPI_Init_thread (then it finalizes MPI). MPI starts once per process.
bool g_hvd_initialised_mpi = false;

// The contexts alive in this process (a program may hold two engines): MPI is finalized as the
// last one ends, not under the others. A broken context stays counted (MPI is then never
// finalized: a collective may be pending on a lost peer).
std::mutex g_live_mu;
int g_live = 0;

// A tag of hvd's own for MPI_Comm_create_group.
constexpr int kCreateGroupTag = 0x6876;

Status StartMpi(int* provided) {
  int finalized = 0, initialized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    return Status::FailedPrecondition("MPI has already been finalized in this process (MPI cannot "
                                      "be initialised twice; an hvd engine shut down under mpirun "
                                      "cannot be started again)");
  }
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(provided);
    return Status::OK();
  }
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, provided);
  if (rc != MPI_SUCCESS) return Status::Internal("MPI_Init_thread failed: " + ErrorString(rc));
  g_hvd_initialised_mpi = true;
  return Status::OK();
}

Status MpiFailed(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return Status::OK();
  return Status::Internal(what + " failed: " + ErrorString(rc));
}

// A new communicator over the job's world: a duplicate of MPI_COMM_WORLD or of the given
// communicator, or the group of the given ranks of MPI_COMM_WORLD (collective over them only).
// Every argument is checked first: MPI_COMM_WORLD's errors end the process.
Status NewWorldComm(const Options& o, MPI_Comm* out) {
  if (o.mpi_comm.has_value()) {
    if (*o.mpi_comm < std::numeric_limits<MPI_Fint>::min() ||
        *o.mpi_comm > std::numeric_limits<MPI_Fint>::max()) {
      return Status::InvalidArgument("the MPI communicator given as the job's world has a "
                                     "Fortran handle out of range: " +
                                     std::to_string(*o.mpi_comm));
    }
    MPI_Comm given = MPI_Comm_f2c(static_cast<MPI_Fint>(*o.mpi_comm));
    if (given == MPI_COMM_NULL) {
      return Status::InvalidArgument("the MPI communicator given as the job's world "
                                     "(hvd.init(comm=...)) is MPI_COMM_NULL or not a communicator "
                                     "(Fortran handle " + std::to_string(*o.mpi_comm) + ")");
    }
    int inter = 0;
    HVD_RETURN_IF_ERROR(MpiFailed(MPI_Comm_test_inter(given, &inter), "MPI_Comm_test_inter"));
    if (inter) {
      return Status::InvalidArgument("the MPI communicator given as the job's world "
                                     "(hvd.init(comm=...)) is an intercommunicator; expected an "
                                     "intracommunicator");
    }
    return MpiFailed(MPI_Comm_dup(given, out), "MPI_Comm_dup of the given communicator");
  }
  if (o.mpi_world_ranks.empty()) {
    return MpiFailed(MPI_Comm_dup(MPI_COMM_WORLD, out), "MPI_Comm_dup");
  }
  int world_size = 0, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const std::string listed = RankList(o.mpi_world_ranks);
  for (int r : o.mpi_world_ranks) {
    if (r >= world_size) {
      return Status::InvalidArgument("hvd.init(comm=[" + listed + "]) names rank " +
                                     std::to_string(r) + ", but MPI_COMM_WORLD has " +
                                     std::to_string(world_size) + " processes");
    }
  }
  if (std::find(o.mpi_world_ranks.begin(), o.mpi_world_ranks.end(), world_rank) ==
      o.mpi_world_ranks.end()) {
    return Status::InvalidArgument(
        "this process is rank " + std::to_string(world_rank) + " of MPI_COMM_WORLD, which "
        "hvd.init(comm=[" + listed + "]) does not list: only the listed processes start hvd "
        "with that list");
  }
  MPI_Group world_group, group;
  HVD_RETURN_IF_ERROR(MpiFailed(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group"));
  Status s = MpiFailed(MPI_Group_incl(world_group, static_cast<int>(o.mpi_world_ranks.size()),
                                      o.mpi_world_ranks.data(), &group),
                       "MPI_Group_incl");
  if (s.ok()) {
    s = MpiFailed(MPI_Comm_create_group(MPI_COMM_WORLD, group, kCreateGroupTag, out),
                  "MPI_Comm_create_group");
    MPI_Group_free(&group);
  }
  MPI_Group_free(&world_group);
  return s;
}

// The identity of this process in the job's world `comm` (see TakeIdentity).
Status IdentityIn(MPI_Comm comm, Options* o) {
  MPI_Comm local = MPI_COMM_NULL;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  Status s = MpiFailed(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  if (s.ok()) s = MpiFailed(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  // The members that share this host's memory are its local ranks, in the communicator's
  // order (as Horovod's MPI controller splits them).
  if (s.ok()) {
    s = MpiFailed(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local),
                  "MPI_Comm_split_type");
  }
  if (s.ok()) s = MpiFailed(MPI_Comm_rank(local, &local_rank), "MPI_Comm_rank");
  if (s.ok()) s = MpiFailed(MPI_Comm_size(local, &local_size), "MPI_Comm_size");
  // A host is known by its first member (local rank 0), so that every member of a host gives
  // it the same number however the communicator orders the hosts' members. The cross rank is
  // this host's place among the hosts that have this local rank, in that order: Horovod's
  // where each host's members come in a block.
  int leader = rank;
  if (s.ok()) s = MpiFailed(MPI_Bcast(&leader, 1, MPI_INT, 0, local), "MPI_Bcast");
  std::vector<int> all(2 * static_cast<size_t>(size));
  int mine[2] = {leader, local_rank};
  if (s.ok()) {
    s = MpiFailed(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm), "MPI_Allgather");
  }
  if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
  if (!s.ok()) return s;
  std::set<int> hosts;  // the leaders of the hosts that have this local rank
  for (int i = 0; i < size; ++i) {
    if (all[2 * i + 1] == local_rank) hosts.insert(all[2 * i]);
  }
  o->rank = rank;
  o->size = size;
  o->local_rank = local_rank;
  o->local_size = local_size;
  o->cross_rank = static_cast<int>(std::distance(hosts.begin(), hosts.find(leader)));
  o->cross_size = static_cast<int>(hosts.size());
  o->bootstrap = Options::Bootstrap::kMpi;
  return Status::OK();
}

}  // namespace

Status MpiContext::TakeIdentity(Options* o) {
  if (!o->MpiWorldGiven()) return Status::OK();
  int provided = 0;
  HVD_RETURN_IF_ERROR(StartMpi(&provided));
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  Status s;
  if (world_size != o->size) {
    s = Status::FailedPrecondition(
        "hvd.init(comm=...) takes the job's world from MPI, but MPI_COMM_WORLD has " +
        std::to_string(world_size) + " process(es) and the launcher started " +
        std::to_string(o->size) + " (start the job with mpirun, or hvdrun --mpi)");
  }
  MPI_Comm comm = MPI_COMM_NULL;
  if (s.ok()) s = NewWorldComm(*o, &comm);
  if (s.ok()) s = IdentityIn(comm, o);
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  // MPI started here for a world that never formed stays initialised: MPI_Finalize would wait
  // for the other processes' MPI to end (and for ever for a member that never came), where the
  // failed process should report at once.
  return s;
}

StatusOr<std::unique_ptr<MpiContext>> MpiContext::Create(const Options& options, bool need_threads) {
  std::unique_ptr<MpiContext> ctx(new MpiContext());
  int provided = MPI_THREAD_SINGLE;
  HVD_RETURN_IF_ERROR(StartMpi(&provided));
  ctx->finalize_ = g_hvd_initialised_mpi;
  ctx->provided_ = provided;
  if (need_threads && provided < MPI_THREAD_SERIALIZED) {
    return Status::FailedPrecondition(
        std::string("HVD_CPU_OPERATIONS=mpi runs MPI from hvd's background thread and needs "
                    "MPI_THREAD_SERIALIZED or better, but MPI provides ") +
        MpiThreadLevelName(provided) +
        (!ctx->finalize_ ? " (the program initialised MPI itself: ask MPI_Init_thread for "
                           "MPI_THREAD_MULTIPLE)" : ""));
  }
  HVD_RETURN_IF_ERROR(NewWorldComm(options, &ctx->comm_));
  HVD_RETURN_IF_ERROR(ctx->Check(MPI_Comm_set_errhandler(ctx->comm_, MPI_ERRORS_RETURN),
                                 "MPI_Comm_set_errhandler"));
  MPI_Comm_rank(ctx->comm_, &ctx->rank_);
  MPI_Comm_size(ctx->comm_, &ctx->size_);
  if (ctx->size_ != options.size || ctx->rank_ != options.rank) {
    return Status::FailedPrecondition(
        "MPI's world is rank " + std::to_string(ctx->rank_) + " of " + std::to_string(ctx->size_) +
        " but hvd's identity is rank " + std::to_string(options.rank) + " of " +
        std::to_string(options.size) + " (MPI bootstrap and HVD_CPU_OPERATIONS=mpi need the job "
        "started by mpirun, with one process per rank)");
  }
  {
    std::lock_guard<std::mutex> l(g_live_mu);
    ++g_live;
    ctx->counted_ = true;
  }
  HVD_LOG(kDebug) << "MPI ready: " << MpiThreadLevelName(provided)
                  << (ctx->finalize_ ? ", initialised by hvd" : ", initialised by the program")
                  << (options.MpiWorldGiven()
                          ? ", the job's world is the communicator hvd.init(comm=...) gave"
                          : "");
  return ctx;
}

bool MpiContext::Leave() {
  std::lock_guard<std::mutex> l(g_live_mu);
  if (counted_) --g_live;
  counted_ = false;
  return g_live == 0;
}

void MpiContext::FinishEarly() {
  if (!CanFinishEarly()) return;
  finished_ = true;
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  if (Leave()) MPI_Finalize();
}

MpiContext::~MpiContext() {
  if (finished_) return;
  if (!broken_.ok()) {
    // A collective may still be pending on a lost peer: freeing the communicator or finalizing
    // could wait for it forever.
    HVD_LOG(kWarning) << "MPI is left unfinalized after a failure: " << broken_.ToString();
    return;
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  const bool last = Leave();
  if (finalize_ && last) MPI_Finalize();
}

Status MpiContext::Break(Status why) {
  if (broken_.ok()) broken_ = why;
  return why;
}

Status MpiContext::Check(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return Status::OK();
  return Break(Status::PeerLost(what + " failed on rank " + std::to_string(rank_) + ": " +
                                ErrorString(rc)));
}

Status MpiContext::Wait(MPI_Request* req, Deadline deadline, const std::string& what) {
  const Clock::time_point start = Clock::now();
  Clock::time_point polled = start;
  while (true) {
    int done = 0;
    HVD_RETURN_IF_ERROR(Check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what));
    if (done) return Status::OK();
    Clock::time_point now = Clock::now();
    if (poll_ && now - polled >= kWaitPollEvery) {
      polled = now;
      Status s = poll_();
      if (!s.ok()) return Break(s);
    }
    if (now >= deadline) {
      return Break(Status::Timeout(what + " on rank " + std::to_string(rank_) +
                                   " did not finish before its deadline (HVD_TIMEOUT_SECONDS); "
                                   "some rank stopped taking part"));
    }
    if (now - start < kYieldPhase) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollSleep);
    }
  }
}

}  // namespace hvd
