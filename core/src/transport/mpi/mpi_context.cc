#include "transport/mpi/mpi_context.h"

#include <chrono>
#include <thread>

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

StatusOr<std::unique_ptr<MpiContext>> MpiContext::Create(const Options& options, bool need_threads) {
  std::unique_ptr<MpiContext> ctx(new MpiContext());
  int finalized = 0, initialized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Finalized(&finalized);
  if (finalized) {
    return Status::FailedPrecondition("MPI has already been finalized in this process (MPI cannot "
                                      "be initialised twice; an hvd engine shut down under mpirun "
                                      "cannot be started again)");
  }
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return Status::Internal("MPI_Init_thread failed: " + ErrorString(rc));
    ctx->finalize_ = true;
  }
  ctx->provided_ = provided;
  if (need_threads && provided < MPI_THREAD_SERIALIZED) {
    return Status::FailedPrecondition(
        std::string("HVD_CPU_OPERATIONS=mpi runs MPI from hvd's background thread and needs "
                    "MPI_THREAD_SERIALIZED or better, but MPI provides ") +
        MpiThreadLevelName(provided) +
        (initialized ? " (the program initialised MPI itself: ask MPI_Init_thread for "
                       "MPI_THREAD_MULTIPLE)" : ""));
  }
  HVD_RETURN_IF_ERROR(ctx->Check(MPI_Comm_dup(MPI_COMM_WORLD, &ctx->comm_), "MPI_Comm_dup"));
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
  HVD_LOG(kDebug) << "MPI ready: " << MpiThreadLevelName(provided)
                  << (ctx->finalize_ ? ", initialised by hvd" : ", initialised by the program");
  return ctx;
}

void MpiContext::FinishEarly() {
  if (!CanFinishEarly()) return;
  finished_ = true;
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  MPI_Finalize();
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
  if (finalize_) MPI_Finalize();
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
