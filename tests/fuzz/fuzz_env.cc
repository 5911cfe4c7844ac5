// Fuzzes the environment contract as Options::FromEnvironment reads it (common/options.cc):
// every variable hvd reads (HVD_ and HOROVOD_ knobs, the launcher's contract, OMPI_/PMI_ and
// SLURM_ identities, Slurm's node lists) set to bytes from the input. Each line of the input is
// one variable: its first byte picks the name, the rest is the value. Parsing either yields
// options that validate, or a status that names what was wrong.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "hvd/options.h"

namespace {

const char* const kNames[] = {
    "HVD_RANK", "HVD_SIZE", "HVD_LOCAL_RANK", "HVD_LOCAL_SIZE", "HVD_CROSS_RANK",
    "HVD_CROSS_SIZE", "HVD_HOSTNAME", "HVD_RENDEZVOUS_ADDR", "HVD_RENDEZVOUS_PORT", "HVD_SECRET",
    "HVD_FUSION_THRESHOLD", "HVD_CYCLE_TIME", "HVD_CACHE_CAPACITY", "HVD_TIMEOUT_SECONDS",
    "HVD_TIMELINE", "HVD_TIMELINE_MARK_CYCLES", "HVD_STALL_CHECK_TIME_SECONDS",
    "HVD_STALL_SHUTDOWN_TIME_SECONDS", "HVD_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_DISABLE",
    "HVD_START_TIMEOUT", "HVD_SPIN_MICROSECONDS", "HVD_CPU_OPERATIONS", "HVD_BIND_ADDR",
    "HVD_HIERARCHICAL_ALLREDUCE", "HVD_SHM",
    "HVD_LOG_LEVEL", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY",
    "HOROVOD_TIMELINE", "HOROVOD_LOG_LEVEL", "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
    "SLURMD_NODENAME", "SLURM_STEP_NUM_TASKS", "SLURM_NODELIST", "SLURM_STEP_NUM_NODES",
    "SLURM_NTASKS_PER_NODE", "SLURM_STEP_ID", "SLURM_JOB_ID", "SLURM_NPROCS", "HOROVOD_RANK",
    "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE", "HOROVOD_START_TIMEOUT", "HOROVOD_TIMEOUT_SECONDS", "HOROVOD_GLOO_TIMEOUT_SECONDS",
    "HVD_STAGING_PIECE_BYTES"};
constexpr size_t kCount = sizeof(kNames) / sizeof(kNames[0]);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const char* n : kNames) unsetenv(n);
  size_t pos = 0;
  while (pos < size) {
    size_t end = pos;
    while (end < size && data[end] != '\n') ++end;
    if (end > pos) {
      std::string value(reinterpret_cast<const char*>(data + pos + 1), end - pos - 1);
      if (value.find('\0') == std::string::npos) setenv(kNames[data[pos] % kCount], value.c_str(), 1);
    }
    pos = end + 1;
  }
  auto o = hvd::Options::FromEnvironment();
  if (o.ok()) {
    if (!o->Validate().ok()) std::abort();
  } else if (o.status().message().empty()) {
    std::abort();
  }
  for (const char* n : kNames) unsetenv(n);
  return 0;
}
