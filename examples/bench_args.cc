// Flag parsing for hvd_bench. Every value is checked; a bad one gives a message naming the flag.
#include "bench_args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace hvd_bench {
namespace {

// "4", "64K", "16M", "1G" (binary multiples) -> bytes.
bool ParseSize(const std::string& s, size_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno || end == s.c_str() || s[0] == '-') return false;
  std::string suffix(end);
  unsigned shift = 0;
  if (suffix == "K" || suffix == "k") shift = 10;
  else if (suffix == "M" || suffix == "m") shift = 20;
  else if (suffix == "G" || suffix == "g") shift = 30;
  else if (!suffix.empty()) return false;
  if (v > (~0ull >> shift)) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

bool ParseInt(const std::string& s, int lo, int* out) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (errno || s.empty() || *end || v < lo || v > 1000000000L) return false;
  *out = static_cast<int>(v);
  return true;
}

bool ParseCollective(const std::string& s, hvd::RawCollective* out) {
  for (auto c : {hvd::RawCollective::kAllreduce, hvd::RawCollective::kAllgather,
                 hvd::RawCollective::kBroadcast, hvd::RawCollective::kAlltoall,
                 hvd::RawCollective::kReducescatter}) {
    if (s == CollectiveName(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

bool IsValueFlag(const std::string& f) {
  static const char* const kFlags[] = {"--coll", "-b", "--min-bytes", "-e", "--max-bytes", "-f",
                                       "--factor", "-n", "--iters", "-w", "--warmup", "-B",
                                       "--budget-mb", "-d", "--dtype", "-o", "--op", "--tensors",
                                       "--sets"};
  for (const char* k : kFlags)
    if (f == k) return true;
  return false;
}

// Applies one flag that takes a value. Returns an error message, empty on success.
std::string ApplyValueFlag(const std::string& flag, const std::string& v, BenchArgs* a) {
  const std::string bad = "bad value '" + v + "' for " + flag + ": ";
  if (flag == "--coll") {
    if (!ParseCollective(v, &a->coll))
      return bad + "expected allreduce|allgather|broadcast|alltoall|reducescatter";
  } else if (flag == "-b" || flag == "--min-bytes") {
    if (!ParseSize(v, &a->min_bytes)) return bad + "expected bytes, e.g. 4, 64K, 16M, 1G";
  } else if (flag == "-e" || flag == "--max-bytes") {
    if (!ParseSize(v, &a->max_bytes)) return bad + "expected bytes, e.g. 4, 64K, 16M, 1G";
  } else if (flag == "-f" || flag == "--factor") {
    int f = 0;
    if (!ParseInt(v, 2, &f)) return bad + "expected an integer >= 2";
    a->factor = static_cast<size_t>(f);
  } else if (flag == "-n" || flag == "--iters") {
    if (!ParseInt(v, 1, &a->iters)) return bad + "expected an integer >= 1";
  } else if (flag == "-w" || flag == "--warmup") {
    if (!ParseInt(v, 0, &a->warmup)) return bad + "expected an integer >= 0";
  } else if (flag == "-B" || flag == "--budget-mb") {
    char* end = nullptr;
    a->budget_mb = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(a->budget_mb > 0) || !std::isfinite(a->budget_mb))
      return bad + "expected a positive number of MiB";
  } else if (flag == "-d" || flag == "--dtype") {
    if (!hvd::ParseDataType(v, &a->dtype))
      return bad + "expected uint8|int8|int16|uint16|int32|int64|float16|bfloat16|float32|float64|bool";
  } else if (flag == "-o" || flag == "--op") {
    if (!hvd::ParseReduceOp(v, &a->op) || a->op == hvd::ReduceOp::kAdasum)
      return bad + "expected sum|average|min|max|product";
  } else if (flag == "--tensors") {
    if (!ParseInt(v, 1, &a->tensors) || a->tensors > 100000)
      return bad + "expected an integer from 1 to 100000";
  } else if (flag == "--sets") {
    if (!ParseInt(v, 1, &a->sets) || a->sets > 1024) return bad + "expected an integer from 1 to 1024";
  } else {
    return "unknown flag '" + flag + "'";
  }
  return "";
}

}  // namespace

const char* CollectiveName(hvd::RawCollective c) {
  switch (c) {
    case hvd::RawCollective::kAllreduce: return "allreduce";
    case hvd::RawCollective::kAllgather: return "allgather";
    case hvd::RawCollective::kBroadcast: return "broadcast";
    case hvd::RawCollective::kAlltoall: return "alltoall";
    case hvd::RawCollective::kReducescatter: return "reducescatter";
  }
  return "?";
}

bool ParseBenchArgs(int argc, char** argv, BenchArgs* out, std::string* error) {
  BenchArgs a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") a.help = true;
    else if (flag == "--raw") a.raw = true;
    else if (flag == "--csv") a.csv = true;
    else if (flag == "--paired") a.paired = true;
    else if (flag == "--grouped") a.grouped = true;
    else if (flag == "--check") a.check = true;
    else if (flag == "--no-check") a.check = false;
    else {
      std::string value;
      size_t eq = flag.find('=');
      if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
        value = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
      } else if (i + 1 < argc && IsValueFlag(flag)) {
        value = argv[++i];
      } else {
        *error = IsValueFlag(flag) ? "flag '" + flag + "' needs a value"
                                   : "unknown flag '" + flag + "'";
        return false;
      }
      std::string err = ApplyValueFlag(flag, value, &a);
      if (!err.empty()) {
        *error = err;
        return false;
      }
    }
  }
  if (a.tensors > 1 && (a.coll != hvd::RawCollective::kAllreduce || a.raw)) {
    *error = "--tensors is for engine allreduces (--coll allreduce, without --raw)";
    return false;
  }
  if (a.paired && a.tensors < 2) {
    *error = "--paired compares a step of --tensors N (N >= 2) with one tensor of its bytes";
    return false;
  }
  if (a.grouped && a.tensors < 2) {
    *error = "--grouped submits a step of --tensors N (N >= 2) as one group";
    return false;
  }
  if (a.sets > 1 && a.raw) {
    *error = "--sets is for engine collectives (without --raw)";
    return false;
  }
  if (a.min_bytes == 0) a.min_bytes = 1;
  if (a.max_bytes < a.min_bytes) {
    *error = "-e (max bytes) is smaller than -b (min bytes)";
    return false;
  }
  *out = a;
  return true;
}

int ItersForSize(const BenchArgs& args, size_t bytes) {
  if (args.iters > 0) return args.iters;
  double want = args.budget_mb * 1024.0 * 1024.0 / static_cast<double>(std::max<size_t>(bytes, 1));
  return static_cast<int>(std::clamp(want, 5.0, 100.0));
}

std::string BenchUsage(const char* argv0) {
  std::ostringstream o;
  o << "usage: hvdrun -np N " << argv0 << " [options]\n"
    << "  --coll C           allreduce|allgather|broadcast|alltoall|reducescatter (default allreduce)\n"
    << "  -b, --min-bytes N  smallest per-rank input in bytes, K/M/G suffix ok (default 4)\n"
    << "  -e, --max-bytes N  largest per-rank input in bytes (default 64M)\n"
    << "  -f, --factor F     size multiplier between steps (default 4)\n"
    << "  -n, --iters N      timed iterations per size (default: clamp(budget/size, 5, 100))\n"
    << "  -B, --budget-mb MB per-size data budget for the default iteration count (default 2048)\n"
    << "  -w, --warmup N     untimed warmup iterations per size (default 3)\n"
    << "  -d, --dtype T      uint8|int8|int16|uint16|int32|int64|float16|bfloat16|float32|\n"
    << "                     float64|bool (default float32)\n"
    << "  -o, --op OP        sum|average|min|max|product (default sum; allreduce, reducescatter)\n"
    << "  --raw              time the bare collective (hvd::RunRawCollective: transport and\n"
    << "                     algorithm after a transport barrier, no negotiation)\n"
    << "  --tensors N        allreduce: N tensors of the size per step, under the same names\n"
    << "                     every step (a training step's gradients); time per step, GB/s over\n"
    << "                     all N (default 1)\n"
    << "  --paired           with --tensors: each step is preceded by one allreduce of one\n"
    << "                     tensor of the step's bytes; a second row times it, and the ratio\n"
    << "                     of the two (the median of each pair's) is printed: the pairs see\n"
    << "                     the same state of the machine\n"
    << "  --grouped          with --tensors: each step is one GroupedAllreduce of its N tensors\n"
    << "                     (negotiated and run together) instead of N allreduces\n"
    << "  --sets K           split the ranks into K process sets (rank % K; the world size must\n"
    << "                     be a multiple of K, larger than K) that run the sweep at the same\n"
    << "                     time, each on its own; ranks and busbw count in a set, time is the\n"
    << "                     slowest set's\n"
    << "  --csv              print only CSV: label,ranks,bytes,count,iters,median_us,min_us,\n"
    << "                     algbw_GBps,busbw_GBps,check\n"
    << "  --check/--no-check verify every element after each size (default on)\n"
    << "exit status: 0 ok, 1 wrong results or an hvd failure, 2 bad flags\n";
  return o.str();
}

}  // namespace hvd_bench
