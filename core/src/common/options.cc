#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "hvd/options.h"

namespace hvd {

namespace {

// The value of HVD_<name>, or of its Horovod alias HOROVOD_<name>; nullptr if neither is set.
const char* Knob(const char* name, std::string* which) {
  for (const char* prefix : {"HVD_", "HOROVOD_"}) {
    std::string var = std::string(prefix) + name;
    if (const char* v = std::getenv(var.c_str())) {
      *which = var;
      return v;
    }
  }
  return nullptr;
}

Status BadValue(const std::string& var, const char* value, const char* expected) {
  return Status::InvalidArgument(var + "='" + value + "': expected " + expected);
}

Status ParseInt(const std::string& var, const char* v, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end != '\0' || x < lo || x > hi) {
    std::string expected = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return BadValue(var, v, expected.c_str());
  }
  *out = x;
  return Status::OK();
}

Status ParseDouble(const std::string& var, const char* v, double lo, double* out) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v, &end);
  if (errno || end == v || *end != '\0' || !(x >= lo)) {
    std::string expected = "a number >= " + std::to_string(lo);
    return BadValue(var, v, expected.c_str());
  }
  *out = x;
  return Status::OK();
}

// Reads an integer identity variable from the first of `names` that is set.
Status IdentityInt(std::initializer_list<const char*> names, int* out, bool* found) {
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) {
      long x;
      HVD_RETURN_IF_ERROR(ParseInt(n, v, 0, 1 << 24, &x));
      *out = static_cast<int>(x);
      *found = true;
      return Status::OK();
    }
  }
  return Status::OK();
}

Status ReadIdentity(Options* o) {
  bool have_rank = false, have_size = false, ignored = false;
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                   "SLURM_PROCID"}, &o->rank, &have_rank));
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                   "SLURM_NTASKS"}, &o->size, &have_size));
  if (have_rank != have_size) {
    return Status::InvalidArgument(std::string("the environment sets ") +
                                   (have_rank ? "a rank (HVD_RANK) but no size (HVD_SIZE)"
                                              : "a size (HVD_SIZE) but no rank (HVD_RANK)"));
  }
  o->local_rank = o->rank;
  o->local_size = o->size;
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_LOCAL_RANK", "HOROVOD_LOCAL_RANK",
                                   "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"},
                                  &o->local_rank, &ignored));
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE"}, &o->local_size, &ignored));
  o->cross_rank = o->local_size > 0 ? o->rank / o->local_size : 0;
  o->cross_size = o->local_size > 0 ? (o->size + o->local_size - 1) / o->local_size : 1;
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_CROSS_RANK", "HOROVOD_CROSS_RANK"}, &o->cross_rank, &ignored));
  HVD_RETURN_IF_ERROR(IdentityInt({"HVD_CROSS_SIZE", "HOROVOD_CROSS_SIZE"}, &o->cross_size, &ignored));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  o->hostname = host;
  if (const char* h = std::getenv("HVD_HOSTNAME")) o->hostname = h;
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
    HVD_RETURN_IF_ERROR(ParseInt(var, v, 0, 1L << 40, &x));
    o->fusion_threshold_bytes = static_cast<size_t>(x);
  }
  if (const char* v = Knob("CYCLE_TIME", &var)) {
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, 0.0, &o->cycle_time_ms));
  }
  if (const char* v = Knob("CACHE_CAPACITY", &var)) {
    HVD_RETURN_IF_ERROR(ParseInt(var, v, 0, 1 << 24, &x));
    o->cache_capacity = static_cast<int>(x);
  }
  if (const char* v = Knob("TIMEOUT_SECONDS", &var)) {
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, 0.001, &o->timeout_seconds));
  }
  if (const char* v = Knob("START_TIMEOUT", &var)) {
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, 0.001, &o->start_timeout_seconds));
  }
  if (const char* v = Knob("STALL_CHECK_TIME_SECONDS", &var)) {
    HVD_RETURN_IF_ERROR(ParseDouble(var, v, 0.0, &o->stall_check_seconds));
  }
  if (const char* v = Knob("TIMELINE", &var)) o->timeline_path = v;
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
  Status s = ReadIdentity(&o);
  if (s.ok()) s = ReadKnobs(&o);
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
  if (size > 1 && (rendezvous_addr.empty() || rendezvous_port == 0)) {
    return Status::InvalidArgument(
        "size is " + std::to_string(size) +
        " but HVD_RENDEZVOUS_ADDR / HVD_RENDEZVOUS_PORT are not set: start the job with hvdrun "
        "(or set them to the address of a running rendezvous store)");
  }
  return Status::OK();
}

}  // namespace hvd
