#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>

#include "bootstrap/slurm.h"
#include "common/logging.h"
#include "hvd/options.h"

namespace hvd {

namespace {

// The longest duration a knob takes (11.6 days): as hvdrun's flags, and far from where a
// deadline in nanoseconds would overflow.
constexpr double kMaxSeconds = 1e6;
// The integer knobs' ranges, the same from the environment and in Options::Validate (a caller
// that fills Options itself). Up to 4 Mi cached names: each costs up to about 200 bytes once
// taken, and every rank keeps 24 bytes per bit of the capacity from the start.
constexpr long kMaxCacheCapacity = 1L << 22;
constexpr long kMaxBytesKnob = 1L << 40;  // fusion threshold, staging piece
constexpr long kMaxSpinMicroseconds = 1000000;
constexpr long kMaxWarmupSamples = 1000;
constexpr long kMaxStepsPerSample = 100000;
constexpr double kMinTimeoutSeconds = 1;  // HVD_TIMEOUT_SECONDS

// The value of HVD_<name>, or of its Horovod alias HOROVOD_<name>; nullptr if neither is set.
const char* Knob(const char* name, std::string* which) {
  const std::string ours = std::string("HVD_") + name, horovods = std::string("HOROVOD_") + name;
  const char* v = std::getenv(ours.c_str());
  const char* alias = std::getenv(horovods.c_str());
  if (v != nullptr && alias != nullptr && std::string(v) != alias) {
    HVD_LOG(kWarning) << ours << "='" << v << "' and " << horovods << "='" << alias
                      << "' are both set: " << ours << " is taken";
  }
  if (v != nullptr) {
    *which = ours;
    return v;
  }
  if (alias != nullptr) *which = horovods;
  return alias;
}

Status BadValue(const std::string& var, const char* value, const char* expected) {
  return Status::InvalidArgument(var + "='" + value + "': expected " + expected);
}

Status ParseInt(const std::string& var, const char* v, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  // (strtol would skip leading blanks: the value is taken as written or refused.)
  if (errno || end == v || *end != '\0' || std::isspace(static_cast<unsigned char>(*v)) ||
      x < lo || x > hi) {
    std::string expected = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return BadValue(var, v, expected.c_str());
  }
  *out = x;
  return Status::OK();
}

// A number in [lo, hi]. Durations are bounded (kMaxSeconds) so that no deadline overflows.
Status ParseDouble(const std::string& var, const char* v, double lo, double hi, double* out) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v, &end);
  // Decimal only, as written: strtod would also skip leading blanks and read hexadecimal
  // ("0x10" seconds).
  const bool plain = !std::isspace(static_cast<unsigned char>(*v)) &&
                     std::strpbrk(v, "xX") == nullptr;
  if (errno || end == v || *end != '\0' || !plain || !(x >= lo) || !(x <= hi)) {
    std::ostringstream expected;
    expected << "a number from " << lo << " to " << hi;
    return BadValue(var, v, expected.str().c_str());
  }
  *out = x;
  return Status::OK();
}

// A switch's value in any case ("True", "ON"), as users write them.
std::string Lower(const char* v) {
  std::string t = v;
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

Status ParseToggle(const std::string& var, const char* v, Options::Toggle* out) {
  const std::string t = Lower(v);
  if (t == "auto") {
    *out = Options::Toggle::kAuto;
  } else if (t == "1" || t == "on" || t == "true") {
    *out = Options::Toggle::kOn;
  } else if (t == "0" || t == "off" || t == "false") {
    *out = Options::Toggle::kOff;
  } else {
    return BadValue(var, v, "auto, 1 (on, true) or 0 (off, false)");
  }
  return Status::OK();
}

Status ParseBool(const std::string& var, const char* v, bool* out) {
  const std::string t = Lower(v);
  if (t == "1" || t == "on" || t == "true") {
    *out = true;
  } else if (t == "0" || t == "off" || t == "false" || t.empty()) {
    *out = false;
  } else {
    return BadValue(var, v, "1 (on, true) or 0 (off, false)");
  }
  return Status::OK();
}

// Reads an integer identity variable from the first of `names` that is set; *which names it.
Status IdentityInt(std::initializer_list<const char*> names, int* out, bool* found,
                   const char** which = nullptr) {
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) {
      long x;
      HVD_RETURN_IF_ERROR(ParseInt(n, v, 0, 1 << 24, &x));
      *out = static_cast<int>(x);
      *found = true;
      if (which) *which = n;
      return Status::OK();
    }
  }
  return Status::OK();
}

// Who said who this process is; decides how the ranks find each other (Options::Bootstrap).
enum class IdentitySource { kNone, kHvd, kMpi, kSlurm };

// Under srun without hvdrun or mpirun: the identity from SLURM_* (bootstrap/slurm.h).
Status ReadSlurmIdentity(Options* o, IdentitySource* source, std::optional<SlurmTask>* task) {
  auto t = ReadSlurmTask([](const char* n) -> const char* { return std::getenv(n); });
  if (!t.ok()) return t.status();
  if (!t->has_value()) return Status::OK();
  *task = std::move(*t);
  const SlurmTask& st = **task;
  o->rank = st.rank;
  o->size = st.size;
  o->local_rank = st.local_rank;
  o->local_size = st.local_size;
  o->cross_rank = st.node_id;
  o->cross_size = st.num_nodes;
  *source = IdentitySource::kSlurm;
  return Status::OK();
}

Status ReadIdentity(Options* o, IdentitySource* source, std::optional<SlurmTask>* slurm) {
  bool have_rank = false, have_size = false, ignored = false;
  const char* rank_var = nullptr;
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"},
                                  &o->rank, &have_rank, &rank_var));
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"},
                                  &o->size, &have_size));
  if (have_rank != have_size) {
    return Status::InvalidArgument(std::string("the environment sets ") +
                                   (have_rank ? "a rank (HVD_RANK) but no size (HVD_SIZE)"
                                              : "a size (HVD_SIZE) but no rank (HVD_RANK)"));
  }
  // srun's own PMI (--mpi=pmi2, or MpiDefault=pmi2) sets PMI_RANK and PMI_SIZE beside the
  // task's SLURM_* identity, which also has its local rank and node: such a task is Slurm's,
  // not mpirun's. (An MPI launcher that starts its ranks as srun's tasks, one per node, gives
  // the same identity both ways.)
  std::optional<SlurmTask> pmi_task;
  Options as_slurm = *o;
  IdentitySource slurm_source = IdentitySource::kNone;
  const bool srun_pmi = have_rank && std::string(rank_var) == "PMI_RANK" &&
                        ReadSlurmIdentity(&as_slurm, &slurm_source, &pmi_task).ok() && pmi_task &&
                        pmi_task->rank == o->rank && pmi_task->size == o->size;
  if (srun_pmi) {
    *o = std::move(as_slurm);
    *source = slurm_source;
    *slurm = std::move(pmi_task);
  } else if (have_rank) {
    bool from_hvd = std::string(rank_var).rfind("HVD_", 0) == 0 ||
                    std::string(rank_var).rfind("HOROVOD_", 0) == 0;
    *source = from_hvd ? IdentitySource::kHvd : IdentitySource::kMpi;
    o->local_rank = o->rank;
    o->local_size = o->size;
  } else {
    HVD_RETURN_IF_ERROR(ReadSlurmIdentity(o, source, slurm));
    const char* tasks = std::getenv("SLURM_NTASKS");
    if (*source == IdentitySource::kNone && tasks != nullptr && std::atol(tasks) > 1 &&
        std::getenv("SLURM_JOB_ID") != nullptr) {
      // A batch script's own process (sbatch -n 4 without srun): a world of one.
      HVD_LOG(kWarning) << "this process runs alone (size 1): its Slurm job has SLURM_NTASKS="
                        << tasks << " tasks, but srun did not start it (no SLURM_STEP_ID); "
                        << "start the ranks with srun";
    }
  }
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_LOCAL_RANK", "HOROVOD_LOCAL_RANK",
                                   "OMPI_COMM_WORLD_LOCAL_RANK"}, &o->local_rank, &ignored));
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE"}, &o->local_size, &ignored));
  if (*source != IdentitySource::kSlurm) {
    o->cross_rank = o->local_size > 0 ? o->rank / o->local_size : 0;
    o->cross_size = o->local_size > 0 ? (o->size + o->local_size - 1) / o->local_size : 1;
  }
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_CROSS_RANK", "HOROVOD_CROSS_RANK"}, &o->cross_rank, &ignored));
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_CROSS_SIZE", "HOROVOD_CROSS_SIZE"}, &o->cross_size, &ignored));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  o->hostname = host;
  if (const char* h = std::getenv("HVD_HOSTNAME")) o->hostname = h;
  return Status::OK();
}

// Picks the bootstrap from the identity's source (see Options::Bootstrap); under Slurm fills in
// the rendezvous address and port that were not given, and the step's name.
Status ChooseBootstrap(Options* o, IdentitySource source, const std::optional<SlurmTask>& slurm) {
  switch (source) {
    case IdentitySource::kNone:
    case IdentitySource::kHvd:
      o->bootstrap = Options::Bootstrap::kStore;
      break;
    case IdentitySource::kMpi:
      o->bootstrap = o->rendezvous_addr.empty() ? Options::Bootstrap::kMpi : Options::Bootstrap::kStore;
      break;
    case IdentitySource::kSlurm:
      o->bootstrap = Options::Bootstrap::kSlurm;
      o->slurm_step = slurm->job_id + "." + slurm->step_id;
      if (o->rendezvous_addr.empty() && !slurm->nodes.empty()) {
        o->rendezvous_addr = slurm->nodes[0];
        // Rank 0 hosts the store, where the others look for it: on the step's first node, as
        // srun's block, cyclic and plane distributions place it, but not always an arbitrary
        // one (-m arbitrary, SLURM_HOSTFILE). There the others would wait out the start
        // timeout; rank 0 says why at once.
        const char* here = std::getenv("SLURMD_NODENAME");
        if (o->rank == 0 && o->size > 1 && here != nullptr && *here != '\0' &&
            o->rendezvous_addr != here) {
          return Status::InvalidArgument(
              "under Slurm rank 0 hosts the rendezvous store, and the other ranks look for it on "
              "the step's first node, " + o->rendezvous_addr + ", but rank 0 runs on " + here +
              " (a task distribution such as -m arbitrary): set HVD_RENDEZVOUS_ADDR=" + here +
              " for every task");
        }
      }
      if (o->rendezvous_port == 0) o->rendezvous_port = SlurmStorePort(slurm->job_id, slurm->step_id);
      break;
  }
  return Status::OK();
}

Status ReadKnobs(Options* o) {
  std::string var;
  long x;
  if (const char* v = Knob("RENDEZVOUS_ADDR", &var)) o->rendezvous_addr = v;
  if (const char* v = Knob("RENDEZVOUS_PORT", &var)) {
    HVD_RETURN_IF_ERROR(ParseInt(var, v, 1, 65535, &x));
    o->rendezvous_port = static_cast<int>(x);
  }
  if (const char* v = Knob("SECRET", &var)) o->secret = v;
  if (const char* v = Knob("BIND_ADDR", &var)) o->bind_addr = v;
  if (const char* v = Knob("FUSION_THRESHOLD", &var)) {
    HVD_RETURN_IF_ERROR(ParseInt(var, v, 0, kMaxBytesKnob, &x));
    o->fusion_threshold_bytes = static_cast<size_t>(x);
    o->fusion_threshold_set = true;
  }
  if (const char* v = Knob("CYCLE_TIME", &var)) {
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, 0.0, kMaxSeconds * 1000, &o->cycle_time_ms));
    o->cycle_time_set = true;
  }
  if (const char* v = Knob("CACHE_CAPACITY", &var)) {
    HVD_RETURN_IF_ERROR(ParseInt(var, v, 0, kMaxCacheCapacity, &x));
    o->cache_capacity = static_cast<int>(x);
  }
  if (const char* v = Knob("TIMEOUT_SECONDS", &var)) {
    // At least a second: heartbeats go out every quarter of it (at most 1 s), and a shorter
    // limit takes an ordinary pause in the scheduler for a lost peer.
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, kMinTimeoutSeconds, kMaxSeconds, &o->timeout_seconds));
  } else if (const char* g = std::getenv("HOROVOD_GLOO_TIMEOUT_SECONDS")) {
    // Horovod's timeout of its Gloo controller (horovodrun --gloo-timeout-seconds): hvd's
    // controller has this one timeout, which takes it where neither spelling above is set.
    HVD_RETURN_IF_ERROR(ParseDouble("HOROVOD_GLOO_TIMEOUT_SECONDS", g, kMinTimeoutSeconds,
                                    kMaxSeconds, &o->timeout_seconds));
  }
  if (const char* v = Knob("SPIN_MICROSECONDS", &var)) {
    HVD_RETURN_IF_ERROR(ParseInt(var, v, -1, kMaxSpinMicroseconds, &x));
    o->spin_microseconds = static_cast<int>(x);
  }
  if (const char* v = Knob("START_TIMEOUT", &var)) {
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, 0.001, kMaxSeconds, &o->start_timeout_seconds));
  }
  if (const char* v = Knob("STALL_SHUTDOWN_TIME_SECONDS", &var)) {
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, 0.0, kMaxSeconds, &o->stall_shutdown_seconds));
  }
  if (const char* v = Knob("STALL_CHECK_TIME_SECONDS", &var)) {
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, 0.0, kMaxSeconds, &o->stall_check_seconds));
  }
  if (const char* v = Knob("STALL_CHECK_DISABLE", &var)) {
    // As Horovod's: a number above 0 turns the stall check off, its warnings and its
    // shutdown both, whatever their times say (hvdrun --no-stall-check sets it).
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);  // NOLINT(runtime/int): strtol's type
    bool off = false;
    if (end != v && *end == '\0') {
      off = n > 0;
    } else {
      HVD_RETURN_IF_ERROR(ParseBool(var, v, &off));
    }
    if (off) {
      o->stall_check_seconds = 0;
      o->stall_shutdown_seconds = 0;
    }
  }
  if (const char* v = Knob("CPU_OPERATIONS", &var)) {
    std::string c = v;  // any case, as Horovod reads it (its docs write MPI, GLOO)
    for (auto& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (c == "tcp" || c == "gloo") {
      o->cpu_operations = Options::CpuOperations::kTcp;
    } else if (c == "mpi") {
      o->cpu_operations = Options::CpuOperations::kMpi;
    } else {
      return BadValue(var, v, "tcp (hvd's algorithms; 'gloo' means the same) or mpi");
    }
  }
  if (const char* v = Knob("GPU_OPERATIONS", &var)) {
    std::string c = v;
    for (auto& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (c == "nccl") {
      o->gpu_operations = Options::GpuOperations::kNccl;
    } else if (c == "cpu" || c == "tcp" || c == "gloo" || c == "mpi") {
      o->gpu_operations = Options::GpuOperations::kCpu;
    } else {
      return BadValue(var, v, "nccl, or cpu (staged through host memory; also tcp, gloo, mpi)");
    }
  }
  if (const char* v = Knob("ENABLE_ASYNC_COMPLETION", &var)) {
    HVD_RETURN_IF_ERROR(ParseBool(var, v, &o->async_completion));
  }
  if (const char* v = Knob("STAGING_PIECE_BYTES", &var)) {
    HVD_RETURN_IF_ERROR(ParseInt(var, v, 0, kMaxBytesKnob, &x));
    o->staging_piece_bytes = static_cast<size_t>(x);
  }
  if (const char* v = Knob("DYNAMIC_PROCESS_SETS", &var)) {
    HVD_RETURN_IF_ERROR(ParseBool(var, v, &o->dynamic_process_sets));
  }
  if (const char* v = Knob("AUTOTUNE", &var)) HVD_RETURN_IF_ERROR(ParseBool(var, v, &o->autotune));
  if (const char* v = Knob("AUTOTUNE_LOG", &var)) o->autotune_log = v;
  long n = 0;
  if (const char* v = Knob("AUTOTUNE_WARMUP_SAMPLES", &var)) {
    HVD_RETURN_IF_ERROR(ParseInt(var, v, 0, kMaxWarmupSamples, &n));
    o->autotune_warmup_samples = static_cast<int>(n);
  }
  if (const char* v = Knob("AUTOTUNE_STEPS_PER_SAMPLE", &var)) {
    // 1 is horovodrun's too; a sample's score needs two lists, so it counts as 2.
    HVD_RETURN_IF_ERROR(ParseInt(var, v, 1, kMaxStepsPerSample, &n));
    o->autotune_steps_per_sample = static_cast<int>(n);
  }
  if (const char* v = Knob("AUTOTUNE_HOLD_SET", &var)) {
    HVD_RETURN_IF_ERROR(ParseBool(var, v, &o->autotune_hold_set));
  }
  if (const char* v = Knob("HIERARCHICAL_ALLREDUCE", &var)) {
    HVD_RETURN_IF_ERROR(ParseToggle(var, v, &o->hierarchical_allreduce));
  }
  if (const char* v = Knob("HIERARCHICAL_ALLGATHER", &var)) {
    HVD_RETURN_IF_ERROR(ParseToggle(var, v, &o->hierarchical_allgather));
  }
  if (const char* v = Knob("SHM", &var)) HVD_RETURN_IF_ERROR(ParseToggle(var, v, &o->shm));
  if (const char* v = Knob("SYMMETRIC_NEGOTIATION", &var)) {
    HVD_RETURN_IF_ERROR(ParseToggle(var, v, &o->symmetric_negotiation));
  }
  if (const char* v = Knob("TIMELINE", &var)) o->timeline_path = v;
  if (const char* v = Knob("TIMELINE_MARK_CYCLES", &var)) {
    HVD_RETURN_IF_ERROR(ParseBool(var, v, &o->timeline_mark_cycles));
  }
  if (const char* v = Knob("ELASTIC", &var)) HVD_RETURN_IF_ERROR(ParseBool(var, v, &o->elastic));
  if (const char* v = Knob("ELASTIC_ID", &var)) o->elastic_id = v;
  if (const char* v = Knob("ELASTIC_TIMEOUT", &var)) {
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, 0.001, kMaxSeconds, &o->elastic_timeout_seconds));
  }
  if (const char* v = Knob("LOG_LEVEL", &var)) {
    if (!ParseLogLevel(v, &o->log_level)) {
      return BadValue(var, v, "one of trace, debug, info, warning, error, fatal");
    }
  }
  return Status::OK();
}

}  // namespace

StatusOr<Options> Options::FromEnvironment() {
  Options o;
  IdentitySource source = IdentitySource::kNone;
  std::optional<SlurmTask> slurm;
  Status s = ReadIdentity(&o, &source, &slurm);
  if (s.ok()) s = ReadKnobs(&o);
  if (s.ok()) s = ChooseBootstrap(&o, source, slurm);
  o.launched_by_mpi = source == IdentitySource::kMpi;
  if (s.ok()) s = o.Validate();
  if (!s.ok()) return s;
  return o;
}

Status Options::Validate() const {
  if (size < 1) return Status::InvalidArgument("size " + std::to_string(size) + ": expected >= 1");
  if (rank < 0 || rank >= size) {
    return Status::InvalidArgument("rank " + std::to_string(rank) + " is outside [0, " +
                                   std::to_string(size) + ")");
  }
  if (local_rank < 0 || local_size < 1 || local_rank >= local_size) {
    return Status::InvalidArgument("local rank " + std::to_string(local_rank) +
                                   " is outside [0, local size " + std::to_string(local_size) + ")");
  }
  if (size > 1 && bootstrap == Bootstrap::kStore &&
      (rendezvous_addr.empty() || rendezvous_port == 0)) {
    return Status::InvalidArgument(
        "size is " + std::to_string(size) +
        " but HVD_RENDEZVOUS_ADDR / HVD_RENDEZVOUS_PORT are not set: start the job with hvdrun, "
        "mpirun or srun (or set them to the address of a running rendezvous store)");
  }
  if (elastic && (bootstrap != Bootstrap::kStore || rendezvous_addr.empty() ||
                  rendezvous_port == 0 || elastic_id.empty())) {
    return Status::InvalidArgument(
        "HVD_ELASTIC=1 needs the rendezvous store of hvdrun's elastic mode (HVD_RENDEZVOUS_ADDR, "
        "HVD_RENDEZVOUS_PORT and HVD_ELASTIC_ID, which hvdrun --min-np/--max-np/"
        "--host-discovery-script sets): start the job with those flags");
  }
  const struct {
    const char* what;
    double value, lo, hi;
  } durations[] = {
      {"timeout_seconds (HVD_TIMEOUT_SECONDS)", timeout_seconds, kMinTimeoutSeconds, kMaxSeconds},
      {"start_timeout_seconds (HVD_START_TIMEOUT)", start_timeout_seconds, 0.001, kMaxSeconds},
      {"elastic_timeout_seconds (HVD_ELASTIC_TIMEOUT)", elastic_timeout_seconds, 0.001, kMaxSeconds},
      {"stall_check_seconds (HVD_STALL_CHECK_TIME_SECONDS)", stall_check_seconds, 0, kMaxSeconds},
      {"stall_shutdown_seconds (HVD_STALL_SHUTDOWN_TIME_SECONDS)", stall_shutdown_seconds, 0,
       kMaxSeconds},
      {"cycle_time_ms (HVD_CYCLE_TIME)", cycle_time_ms, 0, kMaxSeconds * 1000},
  };
  for (const auto& d : durations) {
    if (!(d.value >= d.lo) || !(d.value <= d.hi)) {
      std::ostringstream os;
      os << d.what << " is " << d.value << ": expected a number from " << d.lo << " to " << d.hi;
      return Status::InvalidArgument(os.str());
    }
  }
  const struct {
    const char* what;
    long value, lo, hi;
  } integers[] = {
      {"cache_capacity (HVD_CACHE_CAPACITY)", cache_capacity, 0, kMaxCacheCapacity},
      {"spin_microseconds (HVD_SPIN_MICROSECONDS; -1: the default)", spin_microseconds, -1,
       kMaxSpinMicroseconds},
      {"autotune_warmup_samples (HVD_AUTOTUNE_WARMUP_SAMPLES)", autotune_warmup_samples, 0,
       kMaxWarmupSamples},
      {"autotune_steps_per_sample (HVD_AUTOTUNE_STEPS_PER_SAMPLE)", autotune_steps_per_sample, 1,
       kMaxStepsPerSample},
      {"rendezvous_port (HVD_RENDEZVOUS_PORT; 0: none)", rendezvous_port, 0, 65535},
  };
  for (const auto& d : integers) {
    if (d.value < d.lo || d.value > d.hi) {
      return Status::InvalidArgument(std::string(d.what) + " is " + std::to_string(d.value) +
                                     ": expected an integer in [" + std::to_string(d.lo) + ", " +
                                     std::to_string(d.hi) + "]");
    }
  }
  const struct {
    const char* what;
    size_t value;
  } sizes[] = {
      {"fusion_threshold_bytes (HVD_FUSION_THRESHOLD)", fusion_threshold_bytes},
      {"staging_piece_bytes (HVD_STAGING_PIECE_BYTES)", staging_piece_bytes},
  };
  for (const auto& d : sizes) {
    if (d.value > static_cast<size_t>(kMaxBytesKnob)) {
      return Status::InvalidArgument(std::string(d.what) + " is " + std::to_string(d.value) +
                                     ": expected at most " + std::to_string(kMaxBytesKnob) +
                                     " bytes (1 TiB)");
    }
  }
  if (mpi_comm.has_value() && !mpi_world_ranks.empty()) {
    return Status::InvalidArgument("the job's MPI world is named twice: a communicator "
                                   "(mpi_comm) and a list of ranks (mpi_world_ranks); give one");
  }
  for (size_t i = 0; i < mpi_world_ranks.size(); ++i) {
    const int r = mpi_world_ranks[i];
    if (r < 0 || std::find(mpi_world_ranks.begin(), mpi_world_ranks.begin() + i, r) !=
                     mpi_world_ranks.begin() + i) {
      return Status::InvalidArgument(
          "the ranks of MPI_COMM_WORLD that form the job (hvd.init(comm=[...])) must be distinct "
          "and not negative; entry " + std::to_string(i) + " is " + std::to_string(r));
    }
  }
  if (MpiWorldGiven() && elastic) {
    return Status::InvalidArgument("an elastic job (HVD_ELASTIC=1) takes its world from hvdrun, "
                                   "not from an MPI communicator (hvd.init(comm=...))");
  }
  if (size > 1 && bootstrap == Bootstrap::kSlurm && rendezvous_addr.empty()) {
    return Status::InvalidArgument(
        "under Slurm with size " + std::to_string(size) + ", rank 0 hosts the rendezvous store, "
        "but SLURM_STEP_NODELIST / SLURM_JOB_NODELIST are not set: set HVD_RENDEZVOUS_ADDR to "
        "rank 0's host");
  }
  return Status::OK();
}

}  // namespace hvd
