// The typed configuration of one hvd process: who it is in the job and the engine's knobs.
// Read once, from the environment contract (DESIGN.md), by Options::FromEnvironment.
//
// Thread-safety: a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hvd/export.h"
#include "hvd/status.h"

namespace hvd {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

struct HVD_EXPORT Options {
  // Identity (HVD_RANK, HVD_SIZE, ...; or OMPI_COMM_WORLD_*, PMI_*, SLURM_*).
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  std::string hostname;

  // How the ranks of a job with size > 1 find each other; decided from where the identity came.
  enum class Bootstrap {
    kStore,  // the rendezvous store at rendezvous_addr:rendezvous_port, hosted by hvdrun
    kMpi,    // MPI_Allgather of the ranks' addresses (mpirun, no HVD_RENDEZVOUS_ADDR given)
    kSlurm,  // rank 0 hosts the store at rendezvous_addr:rendezvous_port (srun, no hvdrun);
             // the address defaults to the step's first node, the port to one derived from
             // SLURM_JOB_ID and SLURM_STEP_ID
  };
  Bootstrap bootstrap = Bootstrap::kStore;
  // kSlurm: the step, "SLURM_JOB_ID.SLURM_STEP_ID". Every connection of the job proves a key
  // derived from it and the secret, so that steps on one port never join each other's job.
  std::string slurm_step;

  // Rendezvous store (HVD_RENDEZVOUS_ADDR / HVD_RENDEZVOUS_PORT). Required when size > 1 and
  // bootstrap is kStore.
  std::string rendezvous_addr;
  int rendezvous_port = 0;
  std::string secret;  // HVD_SECRET: the job's secret (may be empty for now)

  // Knobs.
  size_t fusion_threshold_bytes = 64u << 20;  // HVD_FUSION_THRESHOLD; 0 disables fusion
  // HVD_CYCLE_TIME (ms): how long rank 0 holds tensors that are ready before sending them out,
  // so that more can be fused with them. 0 answers at once (every loop wakes on enqueue).
  double cycle_time_ms = 0.0;
  // Whether the environment set the two above (autotune then holds them constant, as Horovod's).
  bool fusion_threshold_set = false;
  bool cycle_time_set = false;
  int cache_capacity = 1024;                  // HVD_CACHE_CAPACITY; 0 disables the cache
  double timeout_seconds = 30.0;              // HVD_TIMEOUT_SECONDS
  double start_timeout_seconds = 30.0;        // HVD_START_TIMEOUT: connecting at start-up
  // HVD_SPIN_MICROSECONDS: how long the background thread polls (yielding the core each
  // round) after work and inside collectives before sleeping in the kernel; -1 = default (100).
  int spin_microseconds = -1;
  double stall_check_seconds = 60.0;          // HVD_STALL_CHECK_TIME_SECONDS; 0 disables
  double stall_shutdown_seconds = 0.0;        // HVD_STALL_SHUTDOWN_TIME_SECONDS; 0 disables
  // HVD_TIMELINE (HOROVOD_TIMELINE): the timeline's file ("%r": the rank's), or DYNAMIC for none
  // until Engine::StartTimeline; HVD_TIMELINE_MARK_CYCLES: CYCLE_START marks in it.
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  LogLevel log_level = LogLevel::kWarning;    // HVD_LOG_LEVEL
  std::string bind_addr = "127.0.0.1";        // HVD_BIND_ADDR: where this rank listens

  // HVD_CPU_OPERATIONS (HOROVOD_CPU_OPERATIONS): what runs the collectives on CPU tensors.
  //   tcp (also "gloo"): hvd's own algorithms over its TCP connections.
  //   mpi: MPI's collectives (MPI_Allreduce, ...); needs a build with MPI and mpirun.
  enum class CpuOperations { kTcp, kMpi };
  CpuOperations cpu_operations = CpuOperations::kTcp;

  // HVD_HIERARCHICAL_ALLREDUCE (HOROVOD_HIERARCHICAL_ALLREDUCE): allreduce as a reduce-scatter
  // among each host's ranks, an allreduce across hosts, and an allgather inside each host.
  //   auto (default, also unset): for buffers of 64 KiB and more when the job has more than
  //     one host and the same number of ranks, more than one, on each.
  //   1 / on / true: whenever the layout allows it. 0 / off / false: never.
  // A layout that does not allow it (one host, one rank per host, unequal hosts) runs the flat
  // algorithms whatever the setting.
  enum class Toggle { kAuto, kOn, kOff };
  Toggle hierarchical_allreduce = Toggle::kAuto;
  // HVD_HIERARCHICAL_ALLGATHER (HOROVOD_HIERARCHICAL_ALLGATHER): allgather as an exchange
  // inside each host, an allgather of each rank's share across hosts, and an allgather inside
  // each host, so each byte crosses the network once per host. auto: for outputs of 256 KiB
  // and more on the same layouts as above; on, off as above.
  Toggle hierarchical_allgather = Toggle::kAuto;

  // HVD_GPU_OPERATIONS (HOROVOD_GPU_OPERATIONS): what runs the collectives on CUDA tensors.
  //   nccl (default): NCCL, where every rank's GPU is its own and the build has NCCL; else
  //     the tensors are staged through host memory.
  //   cpu (also tcp, gloo, mpi): always staged: copied to pinned host memory, reduced there
  //     by the CPU operations, copied back.
  enum class GpuOperations { kNccl, kCpu };
  GpuOperations gpu_operations = GpuOperations::kNccl;
  // HVD_ENABLE_ASYNC_COMPLETION (HOROVOD_ENABLE_ASYNC_COMPLETION), 1 or 0 (default): a device
  // operation that runs on NCCL finishes as soon as its work is queued on the engine's stream,
  // with an event the caller's stream waits for (Handle::StreamWait), instead of once the work
  // is done. A failure the device reports later fails the operations after it.
  bool async_completion = false;
  // HVD_STAGING_PIECE_BYTES (HOROVOD_), default 4 MiB: a staged allreduce (CUDA tensors through
  // pinned host memory) runs in pieces of at least this many bytes (and at most 16 pieces), so
  // that the copies of the next piece to the host and of the last one back overlap the host
  // collective of this one. 0: one piece. Rank 0's value holds on every rank.
  size_t staging_piece_bytes = 4u << 20;

  // HVD_DYNAMIC_PROCESS_SETS (HOROVOD_DYNAMIC_PROCESS_SETS), 1 or 0 (default): process sets
  // may be added and removed after the engine started (Engine::AddProcessSet). Without it only
  // the sets in `process_sets` exist, added as the engine starts.
  bool dynamic_process_sets = false;

  // HVD_AUTOTUNE (HOROVOD_AUTOTUNE), 1 or 0 (default): rank 0 tunes the fusion threshold and the
  // cycle time while the job runs (planner/autotune.h); HVD_AUTOTUNE_LOG: a CSV file of its
  // samples; HVD_AUTOTUNE_WARMUP_SAMPLES (3) and HVD_AUTOTUNE_STEPS_PER_SAMPLE (10).
  bool autotune = false;
  std::string autotune_log;
  int autotune_warmup_samples = 3;
  int autotune_steps_per_sample = 10;
  // HVD_AUTOTUNE_HOLD_SET, 1 (default) or 0: autotune holds constant the fusion threshold and
  // cycle time the environment set, as Horovod's does; 0: they are only where its search starts.
  bool autotune_hold_set = true;
  // Process sets every rank adds as the engine starts (ids 1, 2, ... in this order); each is a
  // list of distinct ranks. As in Horovod's engine, one whose ranks (in any order) are the
  // world's or an earlier one's is skipped and takes no id (hvd.init then raises, as Horovod's
  // Python layer does). Set by the caller, not read from the environment.
  std::vector<std::vector<int>> process_sets;

  // The job's world as an MPI communicator, as Horovod's hvd.init(comm=...) names it. Set by
  // the caller, not read from the environment; needs a build with MPI. With either field,
  // Engine::Create takes rank, size, local and cross rank and size from the communicator
  // (local: the ranks that share this host's memory), the ranks meet through MPI on it
  // (bootstrap kMpi), and HVD_CPU_OPERATIONS=mpi runs on it. The launcher's world must be
  // MPI's: a communicator in a process no MPI launcher started is refused, and there a list is
  // taken only when it names every launched rank in order (the world as launched, no MPI).
  //   mpi_comm: the communicator's Fortran handle (MPI_Comm_c2f; mpi4py: Comm.py2f(); any
  //     value, negative ones included, as MPICH's are); every member calls Engine::Create
  //     with it. Empty: none.
  //   mpi_world_ranks: the world is these ranks of MPI_COMM_WORLD, hvd's rank i being MPI's
  //     rank mpi_world_ranks[i]; only they call Engine::Create. Empty: none.
  std::optional<int64_t> mpi_comm;
  std::vector<int> mpi_world_ranks;
  // Set by FromEnvironment: the identity came from an MPI launcher (OMPI_COMM_WORLD_*, PMI_*),
  // not from hvdrun's HVD_* / HOROVOD_* or Slurm's. Where it did not, mpi_world_ranks is taken
  // only as every launched rank in order (the world as launched, without MPI).
  bool launched_by_mpi = false;
  bool MpiWorldGiven() const { return mpi_comm.has_value() || !mpi_world_ranks.empty(); }

  // Elastic jobs (hvdrun --min-np / --max-np / --host-discovery-script; docs/ELASTIC.md).
  // HVD_ELASTIC (HOROVOD_ELASTIC), 1 or 0 (default): the identity above is only a first guess;
  // Engine::Create reads this process's place in the newest world hvdrun published in the
  // rendezvous store, waiting for it, and forms that world.
  bool elastic = false;
  std::string elastic_id;                // HVD_ELASTIC_ID: this worker's name in hvdrun's worlds
  double elastic_timeout_seconds = 600;  // HVD_ELASTIC_TIMEOUT: longest wait for a new world
  // Set by the caller, not read from the environment: join only a world newer than this
  // generation (the one this process last ran; Engine::Reset passes it on).
  int64_t elastic_after_generation = 0;
  // Set by Engine::Create for an elastic job: the generation of the world this engine formed,
  // and the store prefix its keys live under.
  int64_t elastic_generation = 0;
  std::string store_prefix;

  // HVD_SHM: ranks on the same host move their bytes through shared memory.
  //   auto (default): where it can be set up, TCP elsewhere. on: a rank that cannot set it up
  //   fails the job's start. off: TCP only.
  Toggle shm = Toggle::kAuto;
  // HVD_SYMMETRIC_NEGOTIATION: where every rank shares one host's memory, the global set agrees
  // on cached tensors by each rank sending its bits to every other, with no answer from rank 0
  // (engine/rounds.cc); elsewhere rank 0 ANDs the bits and answers.
  //   auto (default): when the host has a core per rank (oversubscribed, the extra messages
  //   cost more than rank 0's answer). on: on every such host. off: never.
  Toggle symmetric_negotiation = Toggle::kAuto;

  // Reads the environment. A process with no contract variables is a world of size 1.
  // Fails with InvalidArgument naming the variable and what was expected.
  static StatusOr<Options> FromEnvironment();

  // Checks the combination (rank < size, port range, ...).
  Status Validate() const;
};

HVD_EXPORT const char* LogLevelName(LogLevel level);
HVD_EXPORT bool ParseLogLevel(const std::string& s, LogLevel* out);

}  // namespace hvd
