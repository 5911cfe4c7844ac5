// hvdrun: starts the ranks of an hvd job, here and over ssh, and supervises them.
// See `hvdrun --help` and supervisor.h for the failure policy.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <exception>
#include <iostream>
#include <sstream>
#include <memory>

#include "args.h"
#include "elastic.h"
#include "hvd/config.h"
#include "mpi_launch.h"
#include "output.h"
#include "bootstrap/store.h"
#include "common/descriptors.h"
#include "common/logging.h"
#include "remote.h"
#include "spawn.h"
#include "supervisor.h"

namespace hvd {
namespace launcher {
namespace {

constexpr int kUsageError = 2;
constexpr int kStartError = 1;
constexpr int kCommandNotFound = 127;

// --check-build, in horovodrun's layout: what this build of hvd can run.
std::string CheckBuildText() {
  auto box = [](bool on) { return on ? "[X] " : "[ ] "; };
  std::string t = std::string("hvd v") + HVD_VERSION_STRING + ":\n\n";
  t += "Available Frameworks:\n";
  t += std::string("    ") + box(true) + "C++ (hvd::Engine) and C (hvd_c.h)\n";
  t += std::string("    ") + box(true) + "PyTorch and NumPy (hvd.torch, hvd.numpy, when the Python "
       "package is built)\n";
  t += "\nAvailable Controllers:\n";
  t += std::string("    ") + box(true) + "TCP and shared memory (hvd's own; horovodrun's --gloo)\n";
  t += std::string("    ") + box(HVD_HAVE_MPI) + "MPI\n";
  t += "\nAvailable Tensor Operations:\n";
  t += std::string("    ") + box(HVD_HAVE_NCCL) + "NCCL\n";
  t += std::string("    ") + box(HVD_HAVE_CUDA) + "CUDA (device fusion, host staging)\n";
  t += std::string("    ") + box(false) + "DDL\n";
  t += std::string("    ") + box(false) + "CCL\n";
  t += std::string("    ") + box(HVD_HAVE_MPI) + "MPI\n";
  t += std::string("    ") + box(true) + "TCP and shared memory\n";
  return t;
}

std::string Join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

// Where the store listens and which addresses each host's ranks get.
struct Addresses {
  bool multi_host = false;                       // any remote host
  std::string store_bind = "127.0.0.1";
  std::string local_addr = "127.0.0.1";          // rendezvous and bind address for local ranks
  std::map<std::string, std::string> rendezvous;  // remote host -> HVD_RENDEZVOUS_ADDR there
  std::map<std::string, std::string> bind;        // remote host -> HVD_BIND_ADDR there
};

// The ranks' timeout for a silent peer, as they read it (common/options.cc): the flag's, else
// HVD_TIMEOUT_SECONDS, HOROVOD_TIMEOUT_SECONDS, Horovod's HOROVOD_GLOO_TIMEOUT_SECONDS; 30 s.
double RanksTimeoutSeconds(const LaunchOptions& opts) {
  auto knob = opts.knobs.find("HVD_TIMEOUT_SECONDS");
  const char* text = knob != opts.knobs.end() ? knob->second.c_str() : nullptr;
  for (const char* var :
       {"HVD_TIMEOUT_SECONDS", "HOROVOD_TIMEOUT_SECONDS", "HOROVOD_GLOO_TIMEOUT_SECONDS"}) {
    if (text == nullptr) text = std::getenv(var);
  }
  if (text != nullptr) {
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    if (end != text && *end == '\0' && v > 0 && v <= 1e6) return v;
  }
  return 30;
}

SshOptions SshOptionsOf(const LaunchOptions& opts) {
  SshOptions ssh;
  ssh.port = opts.ssh_port;
  ssh.identity_file = opts.ssh_identity_file;
  ssh.config_file = opts.ssh_config_file;
  ssh.connect_timeout_seconds = opts.start_timeout_seconds;
  // A session silent for the ranks' timeout has lost its host, as its ranks have lost their
  // peers. At least 10 s: sshd on a busy host may take a few seconds to answer.
  ssh.alive_seconds = std::max(RanksTimeoutSeconds(opts), 10.0);
  return ssh;
}

std::vector<std::string> RemoteHosts(const std::vector<Placement>& placements) {
  std::vector<std::string> hosts;
  for (const Placement& p : placements) {
    if (!IsLocalHost(p.host) && (hosts.empty() || hosts.back() != p.host)) hosts.push_back(p.host);
  }
  return hosts;
}

// A job over several hosts cannot use loopback: it is on every host, so each host's check
// would pass, but no host reaches another there (every rank then failed at the start timeout).
void RefuseLoopbackAcrossHosts(const LaunchOptions& opts) {
  if (opts.network_interface.empty()) return;
  const std::string here = LocalInterfaceAddress(opts.network_interface);
  if (here.rfind("127.", 0) == 0) {
    throw std::runtime_error("interface " + opts.network_interface + " is loopback (" + here +
                             " here): the other hosts cannot reach this host's ranks or "
                             "rendezvous store there (--network-interface: name an interface "
                             "of the network the hosts share, as eth0)");
  }
}

// Step 1 of remote.h: probes the remote hosts and picks the addresses. Returns false, after
// naming every host that failed, when any did.
bool PlanAddresses(const LaunchOptions& opts, const std::vector<Placement>& placements,
                   Addresses* out) {
  std::vector<std::string> hosts = RemoteHosts(placements);
  if (hosts.empty()) {
    // Not needed on one host, but a name this host lacks is a mistake worth saying.
    if (!opts.network_interface.empty() && LocalInterfaceAddress(opts.network_interface).empty()) {
      throw std::runtime_error("no IPv4 address on interface " + opts.network_interface +
                               " on this host (--network-interface)");
    }
    return true;
  }
  out->multi_host = true;
  RefuseLoopbackAcrossHosts(opts);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<HostProbe> probes =
      ProbeHosts(hosts, SshOptionsOf(opts), opts.network_interface, opts.start_timeout_seconds);
  int failed = 0;
  for (const HostProbe& p : probes) {
    if (p.ok) continue;
    std::cerr << "hvdrun: host " << p.host << " failed the ssh check: " << p.error << "\n";
    ++failed;
  }
  if (failed > 0) {
    std::cerr << "hvdrun: " << failed << " of " << probes.size()
              << " remote host(s) cannot be used; no rank was started\n";
    return false;
  }
  if (!opts.network_interface.empty()) {
    out->local_addr = LocalInterfaceAddress(opts.network_interface);
    if (out->local_addr.empty()) {
      throw std::runtime_error("no IPv4 address on interface " + opts.network_interface +
                               " on this host (--network-interface)");
    }
    out->store_bind = out->local_addr;
  } else {
    out->local_addr = probes[0].client_addr;  // this host as the remote hosts see it
    out->store_bind = out->local_addr;
  }
  for (const HostProbe& p : probes) {
    out->rendezvous[p.host] = opts.network_interface.empty() ? p.client_addr : out->local_addr;
    out->bind[p.host] = p.host_addr;
    if (out->rendezvous[p.host] != out->local_addr) {  // reached over different networks
      out->store_bind = out->local_addr.find(':') == std::string::npos ? "0.0.0.0" : "::";
    }
  }
  if (opts.verbose) {
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << "hvdrun: ssh check of " << hosts.size() << " host(s) took " << ms << " ms\n";
    for (const HostProbe& p : probes) {
      std::cerr << "hvdrun: host " << p.host << ": ranks listen on " << p.host_addr
                << ", reach the store at " << out->rendezvous[p.host] << "\n";
    }
  }
  return true;
}

// Starts one rank, here or over ssh, with its share of the addresses.
RankProcess StartRank(const LaunchOptions& opts, const Placement& p,
                      const std::vector<std::string>& local_command, const JobEnvironment& job,
                      const Addresses& addrs) {
  JobEnvironment mine = job;
  bool remote = addrs.bind.count(p.host) > 0;
  if (addrs.multi_host) {
    mine.rendezvous_addr = remote ? addrs.rendezvous.at(p.host) : addrs.local_addr;
    mine.knobs["HVD_BIND_ADDR"] = remote ? addrs.bind.at(p.host) : addrs.local_addr;
  }
  if (!remote) {
    return SpawnRank(p, local_command, RankEnvironment(p, mine), opts.start_timeout_seconds);
  }
  return SpawnRemoteRank(p, SshOptionsOf(opts), opts.command, ContractVariables(p, mine),
                         opts.kill_after_seconds, opts.start_timeout_seconds);
}

// What every rank of the job shares: hvdrun's store and secret, and the knobs.
JobEnvironment JobOf(const LaunchOptions& opts, const Addresses& addrs, int store_port,
                     const std::string& secret) {
  JobEnvironment job;
  job.rendezvous_addr = addrs.local_addr;
  job.rendezvous_port = store_port;
  job.secret = secret;
  job.knobs = opts.knobs;
  return job;
}

// mkdir -p: every missing folder of `path`, which must end up a folder; false (errno set) where
// one cannot be made.
bool MakeFolders(const std::string& path) {
  for (size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    const std::string part = path.substr(0, at);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return false;
    if (at == std::string::npos) break;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return false;
  }
  return ::access(path.c_str(), W_OK | X_OK) == 0;
}

SupervisorOptions SupervisorOptionsOf(const LaunchOptions& opts, int ranks) {
  SupervisorOptions sopts;
  sopts.grace_seconds = opts.grace_seconds;
  sopts.kill_after_seconds = opts.kill_after_seconds;
  sopts.start_timeout_seconds = opts.start_timeout_seconds;
  sopts.prefix_output = opts.prefix_output;
  sopts.prefix_timestamp = opts.prefix_timestamp;
  sopts.output_dir = opts.output_dir;
  sopts.ranks = ranks;
  sopts.verbose = opts.verbose;
  return sopts;
}

int RunJob(const LaunchOptions& opts) {
  std::vector<Placement> placements = PlaceRanks(opts.hosts, opts.np);
  Addresses addrs;
  if (!PlanAddresses(opts, placements, &addrs)) return kStartError;
  // Resolved here for local ranks only; remote ranks find it on the PATH hvdrun forwards.
  std::vector<std::string> command = opts.command;
  bool any_local = false;
  for (const Placement& p : placements) any_local = any_local || addrs.bind.count(p.host) == 0;
  if (any_local) command[0] = ResolveProgram(command[0]);

  auto level = opts.knobs.find("HVD_LOG_LEVEL");  // also for the store's own messages
  LogLevel parsed;
  if (level != opts.knobs.end() && ParseLogLevel(level->second, &parsed)) SetLogLevel(parsed);

  // Before the store's thread starts: it inherits the mask.
  int signal_fd = SetUpSignals(opts.kill_after_seconds);
  const std::string secret = RandomSecret();  // proves every connection of the job
  // A rank has the whole start timeout to authenticate: on a loaded machine it may be slow.
  auto server = StoreServer::Start(addrs.store_bind, 0, secret, opts.start_timeout_seconds);
  if (!server.ok()) {
    std::cerr << "hvdrun: cannot start the rendezvous store: " << server.status().ToString()
              << (addrs.multi_host ? " (try --network-interface)" : "") << "\n";
    return kStartError;
  }
  JobEnvironment job = JobOf(opts, addrs, (*server)->port(), secret);

  Supervisor supervisor(SupervisorOptionsOf(opts, opts.np), signal_fd);
  // Read from hvdrun's own store directly when the first failure comes: however busy the store
  // is with the ranks' requests (a job of many ranks failing at once), each answer is exact.
  StoreServer* notes = server->get();
  supervisor.SetFailureNotes([notes](int rank, std::string* note, bool* started) {
    if (!notes->Lookup(FailureNoteKey(rank), note)) note->clear();
    std::string addr;
    *started = notes->Lookup(RankAddressKey(rank), &addr);
    return true;
  });
  if (opts.verbose) {
    std::cerr << "hvdrun: rendezvous store on " << addrs.store_bind << ":" << job.rendezvous_port
              << "\n";
  }
  for (const Placement& p : placements) {
    // A signal to hvdrun ends the job while it is still starting: the rest of a large -np is
    // not started first.
    if (!supervisor.KeepStarting()) break;
    try {
      RankProcess r = StartRank(opts, p, command, job, addrs);
      if (opts.verbose) {
        std::cerr << "hvdrun: started rank " << p.rank << (r.remote ? " over ssh" : "") << " (pid "
                  << r.pid << ") on " << p.host << ": " << Join(opts.command) << "\n";
      }
      supervisor.Add(r);
    } catch (const std::exception& e) {
      std::cerr << "hvdrun: cannot start rank " << p.rank << ": " << e.what() << "\n";
      supervisor.Abort(kStartError);
      break;
    }
  }
  int code = supervisor.Run();
  (*server)->Stop();
  ::close(signal_fd);
  return code;
}

ElasticOptions ElasticOptionsOf(const LaunchOptions& opts) {
  ElasticOptions eo;
  eo.np = opts.np;
  eo.min_np = opts.min_np;
  eo.max_np = opts.max_np;
  eo.hosts = opts.hosts;
  eo.discovery_script = opts.discovery_script;
  eo.slots_per_host = opts.slots_per_host;
  eo.elastic_timeout_seconds = opts.elastic_timeout_seconds;
  eo.reset_limit = opts.reset_limit;
  eo.cooldown_min_seconds = opts.cooldown_min_seconds;
  eo.cooldown_max_seconds = opts.cooldown_max_seconds;
  eo.verbose = opts.verbose;
  eo.hang_seconds = RanksTimeoutSeconds(opts) + 5;
  return eo;
}

// Starts one elastic worker. A host other than this machine is probed with ssh when it is first
// used; the store then has to listen where hosts that come later can reach it: the
// --network-interface's address.
RankProcess StartWorker(const LaunchOptions& opts, const Placement& p, const std::string& id,
                        int label, const std::vector<std::string>& command,
                        const JobEnvironment& job, Addresses* addrs) {
  if (!IsLocalHost(p.host) && addrs->bind.count(p.host) == 0) {
    if (opts.network_interface.empty()) {
      // The job goes on without it, as without a host that fails the ssh check.
      throw HostUnreachable("host " + p.host + " is not this machine: an elastic job with "
                            "other hosts needs --network-interface, so that hosts that come "
                            "later reach the rendezvous store");
    }
    RefuseLoopbackAcrossHosts(opts);
    std::vector<HostProbe> probe = ProbeHosts({p.host}, SshOptionsOf(opts),
                                              opts.network_interface, opts.start_timeout_seconds);
    if (!probe[0].ok) {
      throw HostUnreachable("host " + p.host + " failed the ssh check: " + probe[0].error);
    }
    addrs->multi_host = true;
    addrs->rendezvous[p.host] = addrs->local_addr;
    addrs->bind[p.host] = probe[0].host_addr;
  }
  JobEnvironment mine = job;
  mine.knobs["HVD_ELASTIC_ID"] = id;
  RankProcess r = StartRank(opts, p, command, mine, *addrs);
  r.label = label;
  if (opts.verbose) {
    std::cerr << "hvdrun: started worker " << id << (r.remote ? " over ssh" : "") << " (pid "
              << r.pid << "): " << Join(opts.command) << "\n";
  }
  return r;
}

// Elastic mode (launcher/elastic.h): hvdrun's store and supervisor with the elastic driver.
int RunElasticJob(const LaunchOptions& opts) {
  std::vector<std::string> command = opts.command;
  command[0] = ResolveProgram(command[0]);
  auto level = opts.knobs.find("HVD_LOG_LEVEL");
  LogLevel parsed;
  if (level != opts.knobs.end() && ParseLogLevel(level->second, &parsed)) SetLogLevel(parsed);

  Addresses addrs;
  if (!opts.network_interface.empty()) {
    addrs.local_addr = LocalInterfaceAddress(opts.network_interface);
    if (addrs.local_addr.empty()) {
      throw std::runtime_error("no IPv4 address on interface " + opts.network_interface +
                               " on this host (--network-interface)");
    }
    addrs.store_bind = addrs.local_addr;
  }
  int signal_fd = SetUpSignals(opts.kill_after_seconds);
  const std::string secret = RandomSecret();
  auto server = StoreServer::Start(addrs.store_bind, 0, secret, opts.start_timeout_seconds);
  if (!server.ok()) {
    std::cerr << "hvdrun: cannot start the rendezvous store: " << server.status().ToString() << "\n";
    return kStartError;
  }
  auto store = StoreClient::Connect(addrs.local_addr, (*server)->port(),
                                    DeadlineAfterSeconds(opts.start_timeout_seconds), secret);
  if (!store.ok()) {
    std::cerr << "hvdrun: cannot reach its own rendezvous store: " << store.status().ToString()
              << "\n";
    return kStartError;
  }
  JobEnvironment job = JobOf(opts, addrs, (*server)->port(), secret);
  job.knobs["HVD_ELASTIC"] = "1";
  job.knobs["HOROVOD_ELASTIC"] = "1";
  std::ostringstream timeout;
  timeout << opts.elastic_timeout_seconds + 5;  // so that hvdrun, not a worker, says why it ends
  job.knobs["HVD_ELASTIC_TIMEOUT"] = timeout.str();

  Supervisor supervisor(SupervisorOptionsOf(opts, std::max(opts.np, opts.max_np)), signal_fd);

  auto start = [&](const Placement& p, const std::string& id, int label) {
    return StartWorker(opts, p, id, label, command, job, &addrs);
  };
  ElasticDriver driver(ElasticOptionsOf(opts), &supervisor, std::move(*store), start);
  supervisor.SetEvents(&driver);
  if (!driver.Start()) supervisor.Abort(kStartError);
  int code = supervisor.Run();
  (*server)->Stop();
  ::close(signal_fd);
  return code;
}

}  // namespace

int Main(int argc, char** argv) {
  SetUpConsole();  // before any descriptor of hvdrun's own is made (output.h)
  LaunchOptions opts;
  try {
    opts = ParseArgs(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "hvdrun: " << e.what() << "\n";
    return kUsageError;
  }
  if (opts.help) {
    std::cout << HelpText();
    return 0;
  }
  if (opts.version || opts.check_build) {
    std::cout << (opts.check_build ? CheckBuildText() : std::string("hvd ") + HVD_VERSION_STRING + "\n");
    return 0;
  }
  for (const std::string& w : opts.warnings) std::cerr << "hvdrun: " << w << "\n";
  RaiseDescriptorLimit();  // (common/descriptors.h; its ranks inherit the limit)
  if (!opts.elastic) {
    // An elastic worker's marks, inherited by an hvdrun started inside one (hvd.run from a
    // worker, say), would make this job's ranks try to join that job's worlds.
    for (const char* name : {"HVD_ELASTIC", "HOROVOD_ELASTIC", "HVD_ELASTIC_ID",
                             "HOROVOD_ELASTIC_ID"}) {
      ::unsetenv(name);
    }
  }
  try {
    if (opts.mpi) return ExecMpirun(opts);  // mpirun takes the list of interfaces itself
    if (opts.network_interface.find(',') != std::string::npos) {
      // A list: the first that this host has an IPv4 address on, the same name on every host
      // (hosts that took different ones could find themselves on networks apart).
      std::stringstream names(opts.network_interface);
      std::string chosen;
      for (std::string name; chosen.empty() && std::getline(names, name, ',');) {
        if (!LocalInterfaceAddress(name).empty()) chosen = name;
      }
      if (chosen.empty()) {
        throw std::runtime_error("none of the interfaces " + opts.network_interface +
                                 " has an IPv4 address on this host (--network-interfaces)");
      }
      if (opts.verbose) std::cerr << "hvdrun: using interface " << chosen << " on every host\n";
      opts.network_interface = chosen;
    }
    // As horovodrun, which makes the folder first: not a job whose output files go missing.
    if (!opts.output_dir.empty() && !MakeFolders(opts.output_dir)) {
      throw std::runtime_error("--output-filename " + opts.output_dir +
                               ": cannot make or write the folder: " + std::strerror(errno));
    }
    if (opts.elastic) return RunElasticJob(opts);
    return RunJob(opts);
  } catch (const LaunchError& e) {
    std::cerr << "hvdrun: " << e.what() << "\n";
    return kCommandNotFound;
  } catch (const std::exception& e) {
    std::cerr << "hvdrun: " << e.what() << "\n";
    return kStartError;
  }
}

}  // namespace launcher
}  // namespace hvd

int main(int argc, char** argv) { return hvd::launcher::Main(argc, argv); }
