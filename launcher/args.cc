#include "args.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>
#include <sstream>

// A flag of std::vector type keeps each occurrence whole (hvdrun splits lists itself, with
// its own errors): cxxopts would split them at commas. argv strings hold no NUL.
#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>

#include "config_file.h"
#include "hvd/options.h"

namespace hvd {
namespace launcher {
namespace {

cxxopts::Options BuildOptions() {
  cxxopts::Options o("hvdrun", "Starts the ranks of an hvd job and supervises them.");
  o.custom_help("[options] COMMAND [ARGS...]");
  auto s = [] { return cxxopts::value<std::string>(); };
  // A flag whose every occurrence counts (cxxopts keeps only a string flag's last), each
  // occurrence one string: the caller splits any lists itself.
  auto v = [] { return cxxopts::value<std::vector<std::string>>(); };
  o.add_options("Job")
      ("n,np", "Number of ranks to start (default: the total slots of -H/--hostfile). "
               "Also accepted as -np.", s(), "N")
      ("H,hosts", "Hosts and slots, in placement order: host:slots,host:slots,...", s(),
       "LIST")
      ("hostfile", "File with one 'host slots=N' per line ('#' comments)", s(), "FILE")
      ("start-timeout", "Seconds a rank may take to start and reach the rendezvous store; "
                        "exported as HVD_START_TIMEOUT; also ssh's connect timeout for the "
                        "check of remote hosts (default 30)", s(), "SEC")
      ("p,ssh-port", "Port of sshd on the remote hosts (default: ssh's own)", s(), "PORT")
      ("i,ssh-identity-file", "Private key ssh uses for the remote hosts", s(), "FILE")
      ("ssh-config", "ssh configuration file for the remote hosts (ssh -F FILE)", s(), "FILE")
      ("network-interface", "Interface whose IPv4 address the ranks and the rendezvous store "
                            "listen on and publish, the same name on every host; of a "
                            "comma-separated list (or the flag given several times), the first "
                            "that hvdrun's host has", v(), "IFACE")
      ("grace-seconds", "After the first rank fails, seconds the others get to finish "
                        "before SIGTERM (default 3)", s(), "SEC")
      ("kill-after-seconds", "Seconds between SIGTERM and SIGKILL when stopping ranks "
                             "(default 5)", s(), "SEC")
      ("no-prefix", "Do not prefix output lines with [rank]<stream>:")
      ("prefix-output-with-timestamp", "Start each output line with the time it was read "
                                       "(also -prefix-timestamp)")
      ("verbose", "Print what hvdrun does to stderr")
      ("mpi", "Run the job through Open MPI's mpirun with the equivalent flags")
      ("h,help", "Print this help");
  o.add_options("Engine knobs (exported to every rank)")
      ("fusion-threshold-mb", "Fusion buffer size in MiB -> HVD_FUSION_THRESHOLD (bytes); "
                              "0 disables fusion", s(), "MB")
      ("cycle-time-ms", "How long rank 0 holds ready tensors to fuse more with them (0: send at once) -> HVD_CYCLE_TIME", s(),
       "MS")
      ("cache-capacity", "Response cache entries -> HVD_CACHE_CAPACITY; 0 disables", s(), "N")
      ("timeout", "Seconds before a silent peer counts as lost -> HVD_TIMEOUT_SECONDS", s(),
       "SEC")
      ("stall-check-seconds", "Report tensors waiting longer than this "
                              "-> HVD_STALL_CHECK_TIME_SECONDS; 0 disables", s(), "SEC")
      ("log-level", "trace|debug|info|warning|error|fatal -> HVD_LOG_LEVEL", s(), "LEVEL")
      ("timeline", "Write a timeline to FILE -> HVD_TIMELINE", s(), "FILE");
  o.add_options("horovodrun's spellings (a launch line works unchanged)")
      ("num-proc", "As -np", s(), "N")
      ("timeline-filename", "As --timeline", s(), "FILE")
      ("output-filename", "Also write each rank's output to DIR/rank.N/stdout and stderr "
                          "(N zero-padded)", s(), "DIR")
      ("check-build", "Print what this build has and exit (also -cb)")
      ("v,version", "Print hvd's version and exit")
      ("network-interfaces", "As --network-interface", v(), "LIST")
      ("disable-cache", "Accepted; hvdrun keeps no cache of its start-up checks (hvd's "
                        "response cache is --cache-capacity)")
      ("hierarchical-allreduce", "-> HVD_HIERARCHICAL_ALLREDUCE=1")
      ("no-hierarchical-allreduce", "-> HVD_HIERARCHICAL_ALLREDUCE=0")
      ("hierarchical-allgather", "-> HVD_HIERARCHICAL_ALLGATHER=1")
      ("no-hierarchical-allgather", "-> HVD_HIERARCHICAL_ALLGATHER=0")
      ("autotune", "-> HVD_AUTOTUNE=1")
      ("autotune-log-file", "-> HVD_AUTOTUNE_LOG", s(), "FILE")
      ("autotune-warmup-samples", "-> HVD_AUTOTUNE_WARMUP_SAMPLES", s(), "N")
      ("autotune-steps-per-sample", "-> HVD_AUTOTUNE_STEPS_PER_SAMPLE", s(), "N")
      ("autotune-bayes-opt-max-samples", "Accepted; hvd's autotune samples a fixed grid", s(), "N")
      ("autotune-gaussian-process-noise", "Accepted; hvd's autotune samples a fixed grid", s(), "X")
      ("no-stall-check", "-> HVD_STALL_CHECK_DISABLE=1: no stall warnings or shutdown, "
                         "whatever their times")
      ("stall-check", "The stall check on (the default) -> HVD_STALL_CHECK_DISABLE=0")
      ("no-autotune", "Autotune off (the default; undoes --autotune)")
      ("no-timeline-mark-cycles", "Undoes --timeline-mark-cycles")
      ("no-mpi-threads-disable", "Accepted; hvd does not call MPI from several threads")
      ("log-with-timestamp", "Accepted; hvd's log lines have no timestamps")
      ("no-log-hide-timestamp", "As --log-with-timestamp")
      ("stall-check-warning-time-seconds", "As --stall-check-seconds", s(), "SEC")
      ("stall-check-shutdown-time-seconds", "-> HVD_STALL_SHUTDOWN_TIME_SECONDS", s(), "SEC")
      ("gloo", "hvd's own controller over TCP and shared memory (the default)")
      ("tcp", "TCP only: -> HVD_SHM=off")
      ("mpi-args", "Words for mpirun (implies --mpi)", s(), "ARGS")
      ("binding-args", "As --mpi-args", s(), "ARGS")
      ("timeline-mark-cycles",
       "Mark the engine's cycles in the timeline -> HVD_TIMELINE_MARK_CYCLES=1")
      ("mpi-threads-disable", "Accepted; hvd does not call MPI from several threads")
      ("num-nccl-streams", "Accepted; hvd runs one NCCL stream per rank", s(), "N")
      ("thread-affinity", "Accepted; hvd does not pin its background thread", s(), "CPU")
      ("gloo-timeout-seconds", "As --timeout", s(), "SEC")
      ("log-without-timestamp", "Accepted; hvd's log lines have no timestamps")
      ("log-hide-timestamp", "As --log-without-timestamp")
      ("config-file", "horovodrun's YAML file of settings (controller, params, autotune, "
                      "timeline, stall_check, library_options, logging), read as the flags "
                      "they stand for; flags on the command line win", s(), "FILE")
      ("jsrun", "Refused: hvd starts ranks itself, over ssh or mpirun")
      ("min-np", "Elastic: fewest ranks the job goes on with (default: -np); also "
                 "--min-num-proc", s(), "N")
      ("max-np", "Elastic: most ranks the job grows to (default: every slot); also "
                 "--max-num-proc", s(), "N")
      ("slots-per-host", "Elastic: slots of a discovered host printed without ':slots' "
                         "(default 1)", s(), "N")
      ("elastic-timeout", "Elastic: seconds to wait for --min-np slots before the job fails "
                          "(default 600, or HVD_ELASTIC_TIMEOUT / HOROVOD_ELASTIC_TIMEOUT)", s(), "SEC")
      ("reset-limit", "Elastic: most new worlds the job forms after the first (0: none; "
                      "default: no bound)", s(), "N")
      ("blacklist-cooldown-range", "Elastic: 'MIN MAX' seconds a failing host stays "
                                   "blacklisted, doubling per failure (default: for good)", s(),
       "RANGE")
      ("host-discovery-script", "Elastic: a script printing the usable 'host:slots', run every "
                                "second", s(), "FILE");
  return o;
}

// Every flag name (short and long) and whether it takes a value, read from the option table
// itself, so that the table is the one list of flags.
const std::map<std::string, bool>& FlagTakesValue() {
  static const std::map<std::string, bool> flags = [] {
    std::map<std::string, bool> m;
    const cxxopts::Options o = BuildOptions();
    for (const std::string& group : o.groups()) {
      for (const cxxopts::HelpOptionDetails& d : o.group_help(group).options) {
        if (!d.s.empty()) m[d.s] = !d.is_boolean;
        for (const std::string& name : d.l) m[name] = !d.is_boolean;
      }
    }
    return m;
  }();
  return flags;
}

std::string FlagName(const std::string& arg, bool* inline_value) {
  size_t eq = arg.find('=');
  if (arg.rfind("--", 0) == 0) {
    *inline_value = eq != std::string::npos;
    return arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
  }
  if (arg == "-cb") {
    *inline_value = false;
    return "check-build";
  }
  if (arg == "-prefix-timestamp") {
    *inline_value = false;
    return "prefix-output-with-timestamp";
  }
  if (arg == "-hostfile" || arg.rfind("-hostfile=", 0) == 0) {
    *inline_value = eq != std::string::npos;
    return "hostfile";
  }
  if (arg == "-np" || arg.rfind("-np=", 0) == 0) {
    *inline_value = eq != std::string::npos;
    return "np";
  }
  *inline_value = arg.size() > 2;  // -n4, -Hlocalhost:2
  return arg.substr(1, 1);
}

// Splits argv into hvdrun's flags (normalised for cxxopts) and the command. `last_value`: where
// the flags end with a flag and its value as two words, those words (the value may have been
// meant as the command: `hvdrun -np ./train`).
void SplitArgs(int argc, const char* const* argv, std::vector<std::string>* flags,
               std::vector<std::string>* command, std::string* last_value) {
  flags->push_back("hvdrun");
  int i = 1;
  for (; i < argc; ++i) {
    last_value->clear();
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;
    bool inline_value = false;
    std::string name = FlagName(a, &inline_value);
    if (a.rfind("-np", 0) == 0) a = "-" + a;  // cxxopts spells it --np
    if (a == "-cb") a = "--check-build";
    if (a == "-prefix-timestamp") a = "--prefix-output-with-timestamp";
    if (a.rfind("-hostfile", 0) == 0) a = "-" + a;
    // horovodrun's long spellings of the elastic bounds.
    for (const char* bound : {"min", "max"}) {
      if (name == std::string(bound) + "-num-proc") {
        a = "--" + std::string(bound) + "-np" + a.substr(2 + name.size());
        name = std::string(bound) + "-np";
      }
    }
    auto known = FlagTakesValue().find(name);
    if (known == FlagTakesValue().end()) {
      throw LaunchError("unknown flag '" + std::string(argv[i]) + "' (see hvdrun --help)");
    }
    const bool takes_value = known->second;
    if (!takes_value && inline_value) {
      throw LaunchError("flag '" + std::string(argv[i]) + "' takes no value");
    }
    flags->push_back(a);
    if (takes_value && !inline_value) {
      if (i + 1 >= argc) throw LaunchError("flag '" + a + "' needs a value");
      std::string value = argv[++i];
      // horovodrun's spelling takes two words: --blacklist-cooldown-range MIN MAX.
      if (name == "blacklist-cooldown-range" && i + 1 < argc &&
          std::string(argv[i + 1]).find_first_not_of("0123456789.") == std::string::npos) {
        value += std::string(" ") + argv[++i];
      }
      flags->push_back(value);
      if (value.find_first_not_of("0123456789.,: ") != std::string::npos) {  // not a count
        *last_value = "'" + value + "' was taken as the value of " + argv[i - 1];
      }
    }
  }
  for (; i < argc; ++i) command->push_back(argv[i]);
}

double ParseDouble(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  // Decimal only, as the ranks read their knobs (strtod would take 0x10 as 16).
  const bool hex = text.find_first_of("xX") != std::string::npos;
  if (text.empty() || hex || end != text.c_str() + text.size() || errno != 0 ||
      !std::isfinite(v)) {
    throw LaunchError("bad value '" + text + "' for " + flag + " (expected a number)");
  }
  return v;
}

std::string Str(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

void ParseHosts(const cxxopts::ParseResult& r, LaunchOptions* out) {
  if (r.count("hosts") && r.count("hostfile")) {
    throw LaunchError("give either -H or --hostfile, not both");
  }
  if (r.count("hosts")) {
    out->hosts = ParseHostList(r["hosts"].as<std::string>());
  } else if (r.count("hostfile")) {
    std::string path = r["hostfile"].as<std::string>();
    std::istringstream in(ReadUserFile("--hostfile", path));
    out->hosts = ParseHostfile(in, path);
  }
  if (r.count("np") || r.count("num-proc")) {
    const char* flag = r.count("np") ? "np" : "num-proc";
    out->np = ParseCount(r.count("np") ? "-np" : "--num-proc", r[flag].as<std::string>());
  } else if (!out->hosts.empty()) {
    out->np = TotalSlots(out->hosts);
  } else if (r.count("min-np")) {  // an elastic job starts with its minimum
    out->np = ParseCount("--min-np", r["min-np"].as<std::string>());
  } else {
    throw LaunchError("missing -np (or -H/--hostfile to take the number of ranks from)");
  }
  if (out->hosts.empty()) out->hosts.push_back(HostSlots{"localhost", out->np});
  if (out->np > TotalSlots(out->hosts)) {
    throw LaunchError("-np " + std::to_string(out->np) + " is larger than the " +
                      std::to_string(TotalSlots(out->hosts)) + " slot(s) of the host list");
  }
}

// A whole number in [0, max] (a ceiling the ranks also hold to), refused naming the flag.
int ParseWholeUpTo(const std::string& flag, const std::string& text, int max) {
  double n = ParseNonNegative(flag, text);
  if (n != std::floor(n) || n > max) {
    throw LaunchError("bad value '" + text + "' for " + flag + " (expected a whole number in [0, " +
                      std::to_string(max) + "])");
  }
  return static_cast<int>(n);
}

// Seconds for hvdrun's own timers and the ranks': at most a million, so deadlines cannot overflow.
double ParseSeconds(const std::string& flag, const std::string& text, bool zero_ok) {
  double v = zero_ok ? ParseNonNegative(flag, text) : ParsePositive(flag, text);
  if (v > 1e6) throw LaunchError("bad value '" + text + "' for " + flag + " (at most 1e6 s)");
  return v;
}

void ParseKnobs(const cxxopts::ParseResult& r, LaunchOptions* out) {
  auto has = [&](const char* f) { return r.count(f) > 0; };
  auto get = [&](const char* f) { return r[f].as<std::string>(); };
  if (has("fusion-threshold-mb")) {
    double mb = ParseNonNegative("--fusion-threshold-mb", get("fusion-threshold-mb"));
    if (mb > 1024.0 * 1024.0) throw LaunchError("--fusion-threshold-mb is too large");
    out->knobs["HVD_FUSION_THRESHOLD"] = std::to_string(std::llround(mb * 1048576.0));
  }
  if (has("cycle-time-ms")) {
    const double ms = ParseNonNegative("--cycle-time-ms", get("cycle-time-ms"));
    if (ms > 1e9) {  // the ranks' ceiling for HVD_CYCLE_TIME: 10^6 s, as every duration
      throw LaunchError("bad value '" + get("cycle-time-ms") + "' for --cycle-time-ms (at most 1e9 ms)");
    }
    out->knobs["HVD_CYCLE_TIME"] = Str(ms);
  }
  if (has("cache-capacity")) {
    out->knobs["HVD_CACHE_CAPACITY"] =  // the ranks' ceiling for HVD_CACHE_CAPACITY
        std::to_string(ParseWholeUpTo("--cache-capacity", get("cache-capacity"), 4194304));
  }
  if (has("timeout")) {
    const double v = ParseSeconds("--timeout", get("timeout"), false);
    if (v < 1) throw LaunchError("bad value '" + get("timeout") + "' for --timeout (at least 1 s)");
    out->knobs["HVD_TIMEOUT_SECONDS"] = Str(v);
  }
  if (has("stall-check-seconds")) {
    out->knobs["HVD_STALL_CHECK_TIME_SECONDS"] =
        Str(ParseSeconds("--stall-check-seconds", get("stall-check-seconds"), true));
  }
  if (has("log-level")) {
    LogLevel level;
    if (!ParseLogLevel(get("log-level"), &level)) {
      throw LaunchError("bad value '" + get("log-level") +
                        "' for --log-level (expected trace, debug, info, warning, error or fatal)");
    }
    out->knobs["HVD_LOG_LEVEL"] = LogLevelName(level);
  }
  if (has("timeline")) {
    if (get("timeline").empty()) throw LaunchError("--timeline needs a file name");
    out->knobs["HVD_TIMELINE"] = get("timeline");
  }
}

void ParseJobFlags(const cxxopts::ParseResult& r, LaunchOptions* out) {
  out->verbose = r.count("verbose") > 0;
  out->mpi = r.count("mpi") > 0;
  out->prefix_output = r.count("no-prefix") == 0;
  out->prefix_timestamp = r.count("prefix-output-with-timestamp") > 0;
  if (r.count("grace-seconds")) {
    out->grace_seconds = ParseSeconds("--grace-seconds", r["grace-seconds"].as<std::string>(), true);
  }
  if (r.count("kill-after-seconds")) {
    out->kill_after_seconds =
        ParseSeconds("--kill-after-seconds", r["kill-after-seconds"].as<std::string>(), true);
  }
  // The flag, else the environment's value (as the ranks read it), else the default; hvdrun
  // waits as long as the ranks do.
  if (r.count("start-timeout")) {
    out->start_timeout_seconds =
        ParseSeconds("--start-timeout", r["start-timeout"].as<std::string>(), false);
  } else {
    for (const char* var : {"HVD_START_TIMEOUT", "HOROVOD_START_TIMEOUT"}) {
      const char* v = std::getenv(var);
      if (v == nullptr) continue;
      out->start_timeout_seconds = ParseSeconds(var, v, false);
      break;
    }
  }
  out->knobs["HVD_START_TIMEOUT"] = Str(out->start_timeout_seconds);
}

std::vector<std::string> Words(const std::string& flag, const std::string& text);

// Elastic flags (launcher/elastic.h), after ParseHosts: -np is known.
void ParseElasticFlags(const cxxopts::ParseResult& r, LaunchOptions* out) {
  auto has = [&](const char* f) { return r.count(f) > 0; };
  auto get = [&](const char* f) { return r[f].as<std::string>(); };
  out->elastic = has("min-np") || has("max-np") || has("host-discovery-script");
  for (const char* f : {"slots-per-host", "elastic-timeout", "reset-limit",
                        "blacklist-cooldown-range"}) {
    if (has(f) && !out->elastic) {
      throw LaunchError(std::string("--") + f + " applies to elastic jobs only: give --min-np, "
                        "--max-np or --host-discovery-script too");
    }
  }
  if (!out->elastic) return;
  if (out->mpi) throw LaunchError("elastic jobs are started by hvdrun itself; drop --mpi");
  out->min_np = has("min-np") ? ParseCount("--min-np", get("min-np")) : out->np;
  if (has("max-np")) out->max_np = ParseCount("--max-np", get("max-np"));
  if (out->min_np > out->np) {
    throw LaunchError("--min-np " + std::to_string(out->min_np) + " is larger than -np " +
                      std::to_string(out->np));
  }
  if (out->max_np > 0 && out->max_np < out->np) {
    throw LaunchError("--max-np " + std::to_string(out->max_np) + " is smaller than -np " +
                      std::to_string(out->np));
  }
  if (has("host-discovery-script")) {
    out->discovery_script = get("host-discovery-script");
    if (out->discovery_script.empty()) throw LaunchError("--host-discovery-script needs a file");
  }
  if (has("slots-per-host")) out->slots_per_host = ParseCount("--slots-per-host", get("slots-per-host"));
  // HVD_ELASTIC_TIMEOUT, else HOROVOD_ELASTIC_TIMEOUT, as every knob's two spellings.
  for (const char* name : {"HOROVOD_ELASTIC_TIMEOUT", "HVD_ELASTIC_TIMEOUT"}) {
    if (const char* v = std::getenv(name)) {
      out->elastic_timeout_seconds = ParseSeconds(name, v, false);
    }
  }
  if (has("elastic-timeout")) {
    out->elastic_timeout_seconds = ParseSeconds("--elastic-timeout", get("elastic-timeout"), false);
  }
  if (has("reset-limit")) {
    // As Horovod's: 0 lets the job form no world after its first.
    const std::string v = get("reset-limit");
    out->reset_limit = v == "0" ? 0 : ParseCount("--reset-limit (0 or more)", v);
  }
  if (has("blacklist-cooldown-range")) {
    std::vector<std::string> w = Words("--blacklist-cooldown-range", get("blacklist-cooldown-range"));
    if (w.size() == 1 && w[0].find(',') != std::string::npos) {
      w = {w[0].substr(0, w[0].find(',')), w[0].substr(w[0].find(',') + 1)};
    }
    if (w.size() != 2) {
      throw LaunchError("--blacklist-cooldown-range takes two numbers of seconds, MIN MAX");
    }
    out->cooldown_min_seconds = ParseSeconds("--blacklist-cooldown-range", w[0], false);
    out->cooldown_max_seconds = ParseSeconds("--blacklist-cooldown-range", w[1], false);
    if (out->cooldown_max_seconds < out->cooldown_min_seconds) {
      throw LaunchError("--blacklist-cooldown-range: MAX is smaller than MIN");
    }
  }
}

void RequireReadable(const std::string& flag, const std::string& path) {
  ReadUserFile(flag, path);
}

void ParseSshFlags(const cxxopts::ParseResult& r, LaunchOptions* out) {
  if (r.count("ssh-port")) {
    std::string text = r["ssh-port"].as<std::string>();
    out->ssh_port = ParseCount("--ssh-port", text);
    if (out->ssh_port > 65535) {
      throw LaunchError("bad value '" + text + "' for --ssh-port (expected 1 to 65535)");
    }
  }
  if (r.count("ssh-identity-file")) {
    out->ssh_identity_file = r["ssh-identity-file"].as<std::string>();
    RequireReadable("--ssh-identity-file", out->ssh_identity_file);
  }
  if (r.count("ssh-config")) {
    out->ssh_config_file = r["ssh-config"].as<std::string>();
    RequireReadable("--ssh-config", out->ssh_config_file);
  }
  // Every occurrence of either flag, each a comma-separated list: as horovodrun, where the flag
  // may be given once per interface. Each spelling's in the order given, --network-interface's
  // first (cxxopts keeps no order across two options).
  for (const char* flag : {"network-interface", "network-interfaces"}) {
    if (!r.count(flag)) continue;
    auto lists = r[flag].as<std::vector<std::string>>();
    if (lists.size() < r.count(flag)) lists.emplace_back();  // an empty one (cxxopts drops it)
    for (const std::string& list : lists) {
      std::stringstream names(list);
      for (std::string name; std::getline(names, name, ',');) {
        // It goes into the remote probe's command line: allow what Linux allows in practice.
        if (name.empty() || name.size() > 15 ||
            name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   "0123456789_.-@") != std::string::npos) {
          throw LaunchError("bad interface name '" + name + "' in '" + list + "' for --" + flag +
                            " (expected names such as eth0, comma-separated)");
        }
        out->network_interface += (out->network_interface.empty() ? "" : ",") + name;
      }
      if (list.empty() || list.back() == ',') {
        throw LaunchError("bad interface list '" + list + "' for --" + flag);
      }
    }
  }
}

// Splits an --mpi-args value into words (spaces and tabs separate; quotes group).
std::vector<std::string> Words(const std::string& flag, const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  char quote = 0;
  bool any = false;
  for (char c : text) {
    if (quote) {
      if (c == quote) {
        quote = 0;
      } else {
        word.push_back(c);
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      any = true;
    } else if (c == ' ' || c == '\t') {
      if (any || !word.empty()) words.push_back(word);
      word.clear();
      any = false;
    } else {
      word.push_back(c);
    }
  }
  if (quote) throw LaunchError("unbalanced quote in " + flag + " '" + text + "'");
  if (any || !word.empty()) words.push_back(word);
  return words;
}

// horovodrun's flags: each maps to hvd's own, is accepted with a warning saying why it has no
// effect, or is refused saying what hvd does instead.
void ParseHorovodFlags(const cxxopts::ParseResult& r, LaunchOptions* out) {
  auto has = [&](const char* f) { return r.count(f) > 0; };
  auto get = [&](const char* f) { return r[f].as<std::string>(); };
  if (has("jsrun")) {
    throw LaunchError("--jsrun: hvdrun starts the ranks itself (locally, over ssh) or through "
                      "mpirun (--mpi); it does not use jsrun");
  }
  if (has("gloo") && out->mpi) throw LaunchError("give either --gloo or --mpi, not both");
  // horovodrun's pairs of a flag and its opposite (argparse's mutually exclusive groups).
  for (const auto& [on, off] : {std::pair<const char*, const char*>{"stall-check", "no-stall-check"},
                                {"autotune", "no-autotune"},
                                {"timeline-mark-cycles", "no-timeline-mark-cycles"},
                                {"mpi-threads-disable", "no-mpi-threads-disable"},
                                {"log-with-timestamp", "log-without-timestamp"},
                                {"log-with-timestamp", "log-hide-timestamp"},
                                {"no-log-hide-timestamp", "log-without-timestamp"},
                                {"no-log-hide-timestamp", "log-hide-timestamp"}}) {
    if (has(on) && has(off)) {
      throw LaunchError(std::string("give either --") + on + " or --" + off + ", not both");
    }
  }
  if (has("timeline-mark-cycles")) out->knobs["HVD_TIMELINE_MARK_CYCLES"] = "1";
  if (has("no-timeline-mark-cycles")) out->knobs["HVD_TIMELINE_MARK_CYCLES"] = "0";
  if (has("timeline-filename")) {
    if (has("timeline")) throw LaunchError("give either --timeline or --timeline-filename");
    if (get("timeline-filename").empty()) throw LaunchError("--timeline-filename needs a file name");
    out->knobs["HVD_TIMELINE"] = get("timeline-filename");
  }
  if (has("output-filename")) {
    out->output_dir = get("output-filename");
    if (out->output_dir.empty()) throw LaunchError("--output-filename needs a directory");
  }
  for (const auto& [on, var] : {std::pair<std::string, std::string>{"hierarchical-allreduce",
                                                                     "HVD_HIERARCHICAL_ALLREDUCE"},
                                 {"hierarchical-allgather", "HVD_HIERARCHICAL_ALLGATHER"}}) {
    const std::string off = "no-" + on;
    if (has(on.c_str()) && has(off.c_str())) {
      throw LaunchError("give either --" + on + " or --" + off + ", not both");
    }
    if (has(on.c_str())) out->knobs[var] = "1";
    if (has(off.c_str())) out->knobs[var] = "0";
  }
  if (has("autotune")) out->knobs["HVD_AUTOTUNE"] = "1";
  if (has("no-autotune")) out->knobs["HVD_AUTOTUNE"] = "0";
  if (has("autotune-log-file")) out->knobs["HVD_AUTOTUNE_LOG"] = get("autotune-log-file");
  if (has("autotune-warmup-samples")) {
    out->knobs["HVD_AUTOTUNE_WARMUP_SAMPLES"] = std::to_string(  // the ranks' bounds for it
        ParseWholeUpTo("--autotune-warmup-samples", get("autotune-warmup-samples"), 1000));
  }
  if (has("autotune-steps-per-sample")) {
    const int n = ParseCount("--autotune-steps-per-sample", get("autotune-steps-per-sample"));
    if (n > 100000) {  // the ranks' ceiling for HVD_AUTOTUNE_STEPS_PER_SAMPLE
      throw LaunchError("bad value '" + get("autotune-steps-per-sample") +
                        "' for --autotune-steps-per-sample (expected an integer in [1, 100000])");
    }
    out->knobs["HVD_AUTOTUNE_STEPS_PER_SAMPLE"] = std::to_string(n);
  }
  // As horovodrun: --no-stall-check exports HVD_STALL_CHECK_DISABLE, which wins over the times.
  if (has("no-stall-check")) out->knobs["HVD_STALL_CHECK_DISABLE"] = "1";
  if (has("stall-check")) out->knobs["HVD_STALL_CHECK_DISABLE"] = "0";
  if (has("stall-check-warning-time-seconds")) {
    out->knobs["HVD_STALL_CHECK_TIME_SECONDS"] = Str(ParseSeconds(
        "--stall-check-warning-time-seconds", get("stall-check-warning-time-seconds"), true));
  }
  if (has("stall-check-shutdown-time-seconds")) {
    out->knobs["HVD_STALL_SHUTDOWN_TIME_SECONDS"] = Str(ParseSeconds(
        "--stall-check-shutdown-time-seconds", get("stall-check-shutdown-time-seconds"), true));
  }
  if (has("gloo-timeout-seconds") && !has("timeout")) {
    const double v = ParseSeconds("--gloo-timeout-seconds", get("gloo-timeout-seconds"), false);
    if (v < 1) {
      throw LaunchError("bad value '" + get("gloo-timeout-seconds") +
                        "' for --gloo-timeout-seconds (at least 1 s)");
    }
    out->knobs["HVD_TIMEOUT_SECONDS"] = Str(v);
  }
  if (has("tcp")) out->knobs["HVD_SHM"] = "off";
  for (const char* f : {"mpi-args", "binding-args"}) {
    if (!has(f)) continue;
    if (has("gloo")) throw LaunchError(std::string("--") + f + " runs the job through mpirun; drop --gloo");
    for (auto& w : Words(std::string("--") + f, get(f))) out->mpi_args.push_back(w);
    out->mpi = true;
  }
  const struct {
    const char* flag;
    const char* why;
  } no_effect[] = {
      {"autotune-bayes-opt-max-samples", "hvd's autotune samples a fixed grid of settings"},
      {"disable-cache", "hvdrun keeps no cache of its start-up checks (hvd's response cache "
                        "is --cache-capacity)"},
      {"autotune-gaussian-process-noise", "hvd's autotune samples a fixed grid of settings"},
      {"mpi-threads-disable", "hvd does not call MPI from several threads"},
      {"no-mpi-threads-disable", "hvd does not call MPI from several threads"},
      {"log-with-timestamp", "hvd's log lines have no timestamps"},
      {"no-log-hide-timestamp", "hvd's log lines have no timestamps"},
      {"num-nccl-streams", "hvd runs one NCCL stream per rank"},
      {"thread-affinity", "hvd does not pin its background thread"},
      {"log-without-timestamp", "hvd's log lines have no timestamps"},
      {"log-hide-timestamp", "hvd's log lines have no timestamps"},
  };
  for (const auto& n : no_effect) {
    if (has(n.flag)) out->warnings.push_back(std::string("--") + n.flag + " has no effect: " + n.why);
  }
  // Their values are still horovodrun's to check: a launch line horovodrun refuses is refused.
  for (const char* f : {"autotune-bayes-opt-max-samples", "num-nccl-streams"}) {
    if (has(f)) ParseCount(std::string("--") + f, get(f));
  }
  if (has("autotune-gaussian-process-noise")) {
    ParseNonNegative("--autotune-gaussian-process-noise", get("autotune-gaussian-process-noise"));
  }
}

}  // namespace

double ParseNonNegative(const std::string& flag, const std::string& text) {
  double v = ParseDouble(flag, text);
  if (v < 0) throw LaunchError("bad value '" + text + "' for " + flag + " (expected >= 0)");
  return v;
}

double ParsePositive(const std::string& flag, const std::string& text) {
  double v = ParseDouble(flag, text);
  if (v <= 0) throw LaunchError("bad value '" + text + "' for " + flag + " (expected > 0)");
  return v;
}

int ParseCount(const std::string& flag, const std::string& text) {
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos || std::atoi(text.c_str()) <= 0) {
    throw LaunchError("bad value '" + text + "' for " + flag +
                      " (expected a positive integer below 1000000000)");
  }
  return std::atoi(text.c_str());
}

namespace {

// --config-file (once at most): its settings as flags, before the command line's (flags[0] is
// the program), leaving out those the command line sets.
ConfigFlags AddConfigFile(std::vector<std::string>* flags) {
  std::set<std::string> given;
  std::string path;
  int files = 0;
  for (size_t i = 1; i < flags->size(); ++i) {
    bool inline_value = false;
    const std::string name = FlagName((*flags)[i], &inline_value);
    given.insert(name);
    auto known = FlagTakesValue().find(name);
    const bool takes_value = known != FlagTakesValue().end() && known->second;
    if (name == "config-file") {
      ++files;
      const std::string& a = (*flags)[i];
      path = inline_value ? a.substr(a.find('=') + 1) : (i + 1 < flags->size() ? (*flags)[i + 1] : "");
    }
    if (takes_value && !inline_value) ++i;  // its value
  }
  if (files > 1) throw LaunchError("give --config-file once");
  // (--help, --check-build and --version start nothing: the file is not read.)
  for (const char* only : {"h", "help", "check-build", "v", "version"}) {
    if (given.count(only)) files = 0;
  }
  if (files == 0) return ConfigFlags{};
  ConfigFlags config = ReadConfigFile(path, given);
  flags->insert(flags->begin() + 1, config.flags.begin(), config.flags.end());
  return config;
}

// A refusal that names a flag the configuration file set says where it came from.
std::string NameConfigOrigin(const std::string& message, const ConfigFlags& config) {
  for (const auto& [flag, where] : config.origin) {
    const std::string spelled = "--" + flag;
    for (size_t at = message.find(spelled); at != std::string::npos;
         at = message.find(spelled, at + 1)) {
      const size_t end = at + spelled.size();
      if (end < message.size() && (std::isalnum(static_cast<unsigned char>(message[end])) ||
                                   message[end] == '-')) {
        continue;  // a longer flag's name
      }
      return message + " (set by " + where + ")";
    }
  }
  return message;
}

// `last_value`: SplitArgs's, for a missing command.
void ParseFlags(const std::vector<std::string>& flags, const std::string& last_value,
                LaunchOptions* out) {
  std::vector<const char*> ptrs;
  for (const auto& f : flags) ptrs.push_back(f.c_str());
  cxxopts::Options spec = BuildOptions();
  try {
    cxxopts::ParseResult r = spec.parse(static_cast<int>(ptrs.size()), ptrs.data());
    if (r.count("help")) {
      out->help = true;
      return;
    }
    if (r.count("version") && !out->command.empty()) {
      // horovodrun's -v prints the version and exits; a launch line with a command that
      // meant --verbose must not end there silently, with 0.
      throw LaunchError("-v (--version) prints hvd's version and starts nothing, as "
                        "horovodrun's does; for what hvdrun does, use --verbose");
    }
    if (r.count("check-build") || r.count("version")) {
      out->check_build = r.count("check-build") > 0;
      out->version = r.count("version") > 0;
      return;
    }
    if (r.count("num-proc")) {
      if (r.count("np")) throw LaunchError("give either -np or --num-proc, not both");
    }
    if (out->command.empty()) {
      throw LaunchError("missing COMMAND" + (last_value.empty() ? "" : ": " + last_value) +
                        " (usage: hvdrun -np N [options] COMMAND [ARGS...]; see hvdrun --help)");
    }
    ParseJobFlags(r, out);
    ParseHorovodFlags(r, out);  // first: its refusals say more than a missing -np would
    ParseHosts(r, out);
    ParseElasticFlags(r, out);
    ParseSshFlags(r, out);
    ParseKnobs(r, out);
  } catch (const cxxopts::exceptions::exception& e) {
    throw LaunchError(e.what());
  }
}

}  // namespace

LaunchOptions ParseArgs(int argc, const char* const* argv) {
  std::vector<std::string> flags;
  LaunchOptions out;
  std::string last_value;
  SplitArgs(argc, argv, &flags, &out.command, &last_value);
  const ConfigFlags config = AddConfigFile(&flags);
  try {
    ParseFlags(flags, last_value, &out);
  } catch (const LaunchError& e) {
    throw LaunchError(NameConfigOrigin(e.what(), config));
  }
  if (out.help || out.check_build || out.version) return out;
  // A setting of the file that has no effect is named as the file has it.
  for (std::string& w : out.warnings) {
    for (const auto& [flag, where] : config.origin) {
      const std::string spelled = "--" + flag + " ";
      if (w.rfind(spelled, 0) == 0) w = where + w.substr(spelled.size() - 1);
    }
  }
  out.warnings.insert(out.warnings.end(), config.warnings.begin(), config.warnings.end());
  return out;
}

std::string HelpText() {
  std::string text = BuildOptions().help({"Job", "Engine knobs (exported to every rank)",
                                           "horovodrun's spellings (a launch line works unchanged)"});
  text +=
      "\nHosts: localhost, 127.0.0.1, this machine's name and its interfaces' addresses start\n"
      "ranks here; every other host is reached with ssh (BatchMode: keys or an agent, never a\n"
      "password prompt). Before any rank starts, every remote host is checked at once; hosts\n"
      "that fail are listed with ssh's own message and nothing is started. Remote ranks run in the same working\n"
      "directory with hvdrun's environment (less HOME, USER, SSH_*, ... which describe the\n"
      "login there) and the variables below; they travel over ssh's stdin, never argv.\n"
      "Ranks listen on (HVD_BIND_ADDR) and publish the address the --network-interface has\n"
      "on their host, or by default the address hvdrun's ssh reached that host on.\n"
      "Several local names (e.g. -H localhost:2,127.0.0.1:2) act as separate hosts.\n"
      "\nElastic mode (--min-np, --max-np or --host-discovery-script; docs/ELASTIC.md): a rank\n"
      "that fails blacklists its host and the others go on in a new world (they roll back to\n"
      "their last commit with hvd.elastic.run); hosts the discovery script adds join at the\n"
      "next commit; the job fails when fewer than --min-np ranks are possible for\n"
      "--elastic-timeout seconds. Ranks get HVD_ELASTIC=1, HVD_ELASTIC_ID and\n"
      "HVD_ELASTIC_TIMEOUT; their rank and size come from the world they join. Output lines\n"
      "carry the worker's number ([N]: its order of start), not its rank.\n"
      "\nEnvironment of every rank (besides hvdrun's own environment):\n"
      "  HVD_RANK, HVD_SIZE               this rank and the number of ranks\n"
      "  HVD_LOCAL_RANK, HVD_LOCAL_SIZE   rank and rank count on this host\n"
      "  HVD_CROSS_RANK, HVD_CROSS_SIZE   host index and host count (for this local rank)\n"
      "  HVD_HOSTNAME                     the host name from the host list\n"
      "  HOROVOD_RANK, ..._HOSTNAME       the same seven, under horovodrun's names\n"
      "  HVD_RENDEZVOUS_ADDR/_PORT        the rendezvous store hosted by hvdrun\n"
      "  HVD_SECRET                       the job's random secret (64 hex digits)\n"
      "  HVD_BIND_ADDR                    (multi-host jobs) where this rank listens\n"
      "  HVD_START_TIMEOUT and the knob variables above, when given\n"
      "\nOutput lines are written as [RANK]<stdout>:TEXT and [RANK]<stderr>:TEXT.\n"
      "\nExit status: 0 when every rank exits 0; otherwise the exit code of the first rank\n"
      "that failed (128+N when it was killed by signal N; a rank that failed only because\n"
      "another did gives way to that one); 128+N when hvdrun gets signal N\n"
      "(SIGINT, SIGTERM, SIGHUP); 2 for a usage error; 1 when the job cannot be started.\n"
      "\nExamples:\n"
      "  hvdrun -np 4 python3 train.py --lr 0.1\n"
      "  hvdrun -H localhost:2 --fusion-threshold-mb 32 --log-level info ./bench\n"
      "  hvdrun -np 8 -H node1:4,node2:4 -p 2222 -i ~/.ssh/id_ed25519 python3 train.py\n"
      "  hvdrun --hostfile hosts.txt --network-interface eth0 ./train\n"
      "  hvdrun -np 4 --min-np 2 --host-discovery-script ./hosts.sh python3 train.py\n";
  return text;
}

}  // namespace launcher
}  // namespace hvd
