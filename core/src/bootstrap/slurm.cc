#include "bootstrap/slurm.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace hvd {

namespace {

constexpr size_t kMaxHosts = 1 << 20;  // a list that expands further is taken as an error

Status BadList(const std::string& list, const std::string& why) {
  return Status::InvalidArgument("Slurm node list '" + list + "': " + why);
}

// Splits at the commas outside brackets.
StatusOr<std::vector<std::string>> SplitTopLevel(const std::string& list) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) return BadList(list, "']' without '['");
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (depth != 0) return BadList(list, "'[' without ']'");
  parts.push_back(cur);
  for (const auto& p : parts) {
    if (p.empty()) return BadList(list, "empty host name");
  }
  return parts;
}

bool ParseDigits(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  uint64_t x = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    x = x * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = x;
  return true;
}

std::string Padded(uint64_t x, size_t width) {
  std::string s = std::to_string(x);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// Expands the inside of one bracket group ("01-03,07") into the numbers as strings.
Status ExpandRanges(const std::string& list, const std::string& body,
                    std::vector<std::string>* out) {
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    std::string item = body.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = item.find('-');
    std::string lo_s = item.substr(0, dash);
    std::string hi_s = dash == std::string::npos ? lo_s : item.substr(dash + 1);
    uint64_t lo, hi;
    if (!ParseDigits(lo_s, &lo) || !ParseDigits(hi_s, &hi) || hi < lo) {
      return BadList(list, "bad range '" + item + "' (expected N or N-M with N <= M)");
    }
    if (hi - lo >= kMaxHosts || out->size() + (hi - lo) >= kMaxHosts) {
      return BadList(list, "expands to more than " + std::to_string(kMaxHosts) + " hosts");
    }
    for (uint64_t x = lo; x <= hi; ++x) out->push_back(Padded(x, lo_s.size()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return Status::OK();
}

// Expands one host expression ("gpu-a[1-2]", "r[1-2]n[1-2]", "login3").
Status ExpandName(const std::string& list, const std::string& name, std::vector<std::string>* out) {
  size_t open = name.find('[');
  if (open == std::string::npos) {
    out->push_back(name);
    return Status::OK();
  }
  size_t close = name.find(']', open);
  if (close == std::string::npos) return BadList(list, "'[' without ']'");
  std::vector<std::string> numbers, rests;
  HVD_RETURN_IF_ERROR(ExpandRanges(list, name.substr(open + 1, close - open - 1), &numbers));
  HVD_RETURN_IF_ERROR(ExpandName(list, name.substr(close + 1), &rests));
  if (numbers.size() * rests.size() + out->size() > kMaxHosts) {
    return BadList(list, "expands to more than " + std::to_string(kMaxHosts) + " hosts");
  }
  const std::string prefix = name.substr(0, open);
  for (const auto& n : numbers) {
    for (const auto& r : rests) out->push_back(prefix + n + r);
  }
  return Status::OK();
}

// The first of `names` that `get` has, with the name it was found under.
const char* First(const EnvGetter& get, std::initializer_list<const char*> names,
                  const char** which) {
  for (const char* n : names) {
    if (const char* v = get(n)) {
      *which = n;
      return v;
    }
  }
  return nullptr;
}

Status ParseCount(const char* var, const char* v, int lo, int* out) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno || end == v || *end != '\0' || x < lo || x > (1 << 24)) {
    return Status::InvalidArgument(std::string(var) + "='" + v + "': expected an integer >= " +
                                   std::to_string(lo));
  }
  *out = static_cast<int>(x);
  return Status::OK();
}

// Reads the optional variable from `names` into *out; leaves *out alone if none is set.
Status OptionalCount(const EnvGetter& get, std::initializer_list<const char*> names, int lo,
                     int* out, bool* found = nullptr) {
  const char* which = nullptr;
  const char* v = First(get, names, &which);
  if (found) *found = v != nullptr;
  return v ? ParseCount(which, v, lo, out) : Status::OK();
}

// Fills the per-node part of `t` (nodes, node count, local size) and checks it against size.
Status ReadNodes(const EnvGetter& get, SlurmTask* t) {
  const char* which = nullptr;
  if (const char* v = First(get, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &which)) {
    auto nodes = ExpandSlurmNodeList(v);
    if (!nodes.ok()) return nodes.status().WithContext(which);
    t->nodes = std::move(*nodes);
  }
  t->num_nodes = t->nodes.empty() ? 1 : static_cast<int>(t->nodes.size());
  HVD_RETURN_IF_ERROR(OptionalCount(get, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"},
                                    1, &t->num_nodes));
  HVD_RETURN_IF_ERROR(OptionalCount(get, {"SLURM_NODEID"}, 0, &t->node_id));
  if (t->node_id >= t->num_nodes) {
    return Status::InvalidArgument("SLURM_NODEID=" + std::to_string(t->node_id) + " but the step has " +
                                   std::to_string(t->num_nodes) + " node(s)");
  }
  const char* per = First(get, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}, &which);
  if (per == nullptr) {
    // Without a per-node count, assume the tasks are spread evenly (as --ntasks-per-node does).
    t->local_size = (t->size + t->num_nodes - 1) / t->num_nodes;
    return Status::OK();
  }
  auto counts = ExpandSlurmTasksPerNode(per);
  if (!counts.ok()) return counts.status().WithContext(which);
  if (counts->size() == 1) {
    t->local_size = (*counts)[0];  // the same count on every node
    return Status::OK();
  }
  int sum = 0;
  for (int c : *counts) sum += c;
  if (static_cast<int>(counts->size()) != t->num_nodes || sum != t->size) {
    return Status::InvalidArgument(std::string(which) + "='" + per + "' lists " +
                                   std::to_string(counts->size()) + " node(s) and " +
                                   std::to_string(sum) + " task(s); the step has " +
                                   std::to_string(t->num_nodes) + " and " + std::to_string(t->size));
  }
  t->local_size = (*counts)[t->node_id];
  return Status::OK();
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandSlurmNodeList(const std::string& list) {
  if (list.empty()) return BadList(list, "empty");
  auto parts = SplitTopLevel(list);
  if (!parts.ok()) return parts.status();
  std::vector<std::string> hosts;
  for (const auto& p : *parts) HVD_RETURN_IF_ERROR(ExpandName(list, p, &hosts));
  return hosts;
}

StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(const std::string& list) {
  std::vector<int> out;
  size_t start = 0;
  auto bad = [&](const std::string& item) {
    return Status::InvalidArgument("tasks per node '" + list + "': bad item '" + item +
                                   "' (expected N or N(xM))");
  };
  while (true) {
    size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    uint64_t n, m = 1;
    size_t paren = item.find('(');
    if (paren == std::string::npos) {
      if (!ParseDigits(item, &n)) return bad(item);
    } else {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')' ||
          !ParseDigits(item.substr(0, paren), &n) ||
          !ParseDigits(item.substr(paren + 2, item.size() - paren - 3), &m) || m == 0) {
        return bad(item);
      }
    }
    if (n > (1 << 20) || out.size() + m > kMaxHosts) return bad(item);
    out.insert(out.end(), m, static_cast<int>(n));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

StatusOr<std::optional<SlurmTask>> ReadSlurmTask(const EnvGetter& get) {
  const char* which = nullptr;
  const char* procid = get("SLURM_PROCID");
  const char* step = First(get, {"SLURM_STEP_ID", "SLURM_STEPID"}, &which);
  if (procid == nullptr || step == nullptr) return std::optional<SlurmTask>();
  SlurmTask t;
  t.step_id = step;
  if (const char* job = First(get, {"SLURM_JOB_ID", "SLURM_JOBID"}, &which)) t.job_id = job;
  HVD_RETURN_IF_ERROR(ParseCount("SLURM_PROCID", procid, 0, &t.rank));
  bool have_size = false;
  HVD_RETURN_IF_ERROR(OptionalCount(get, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, 1,
                                    &t.size, &have_size));
  if (!have_size) {
    return Status::InvalidArgument("SLURM_PROCID is set but none of SLURM_STEP_NUM_TASKS, "
                                   "SLURM_NTASKS, SLURM_NPROCS is");
  }
  if (t.rank >= t.size) {
    return Status::InvalidArgument("SLURM_PROCID=" + std::to_string(t.rank) + " is not below the " +
                                   "step's " + std::to_string(t.size) + " task(s)");
  }
  HVD_RETURN_IF_ERROR(ReadNodes(get, &t));
  bool have_local = false;
  HVD_RETURN_IF_ERROR(OptionalCount(get, {"SLURM_LOCALID"}, 0, &t.local_rank, &have_local));
  if (!have_local && t.num_nodes == 1) t.local_rank = t.rank;
  if (t.local_rank >= t.local_size) {
    return Status::InvalidArgument("SLURM_LOCALID=" + std::to_string(t.local_rank) + " is not below the " +
                                   std::to_string(t.local_size) + " task(s) on node " +
                                   std::to_string(t.node_id));
  }
  return std::optional<SlurmTask>(std::move(t));
}

int SlurmStorePort(const std::string& job_id, const std::string& step_id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over "job.step"
  for (char c : job_id + "." + step_id) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return 20000 + static_cast<int>(h % 10000);
}

}  // namespace hvd
