#include "mpi_launch.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>

extern char** environ;

namespace hvd {
namespace launcher {

std::vector<std::string> MpirunCommand(const LaunchOptions& opts,
                                       const std::vector<std::string>& environ_names,
                                       bool as_root) {
  const char* mpirun = std::getenv("HVD_MPIRUN");
  std::vector<std::string> cmd = {mpirun && *mpirun ? mpirun : "mpirun"};
  if (as_root) cmd.push_back("--allow-run-as-root");
  cmd.insert(cmd.end(), {"-np", std::to_string(opts.np)});
  std::string hosts;
  for (const HostSlots& h : opts.hosts) {
    hosts += (hosts.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots);
  }
  if (hosts.empty()) hosts = "localhost:" + std::to_string(opts.np);
  cmd.insert(cmd.end(), {"-H", hosts});
  if (opts.prefix_output) cmd.push_back("--tag-output");
  if (opts.prefix_timestamp) cmd.push_back("--timestamp-output");
  if (!opts.output_dir.empty()) cmd.insert(cmd.end(), {"--output-filename", opts.output_dir});
  // As horovodrun: no binding of a rank to one core (its compute threads and hvd's background
  // thread would share it), unless the words for mpirun say how to bind or map.
  bool binding = false;
  for (const std::string& w : opts.mpi_args) {
    for (const char* flag : {"-bind-to", "--bind-to", "-map-by", "--map-by", "-rf", "--rankfile"}) {
      if (w == flag) binding = true;
    }
  }
  if (!binding) cmd.insert(cmd.end(), {"-bind-to", "none", "-map-by", "slot"});
  cmd.insert(cmd.end(), opts.mpi_args.begin(), opts.mpi_args.end());
  std::string rsh;
  if (opts.ssh_port) rsh += "-p " + std::to_string(opts.ssh_port);
  if (!opts.ssh_identity_file.empty()) rsh += (rsh.empty() ? "" : " ") + std::string("-i ") + opts.ssh_identity_file;
  if (!opts.ssh_config_file.empty()) rsh += (rsh.empty() ? "" : " ") + std::string("-F ") + opts.ssh_config_file;
  if (!rsh.empty()) cmd.insert(cmd.end(), {"--mca", "plm_rsh_args", rsh});
  if (!opts.network_interface.empty()) {
    cmd.insert(cmd.end(), {"--mca", "btl_tcp_if_include", opts.network_interface,
                           "--mca", "oob_tcp_if_include", opts.network_interface});
  }
  std::set<std::string> exported;
  for (const auto& [name, value] : opts.knobs) {
    cmd.insert(cmd.end(), {"-x", name + "=" + value});
    exported.insert(name);
  }
  // The whole environment goes to every rank, by name (values stay off the command line), as
  // horovodrun passes it: ranks on other hosts would otherwise lack PATH, PYTHONPATH, the
  // user's variables. Left out: what would contradict mpirun's or the host's own.
  auto starts = [](const std::string& name, const char* prefix) {
    return name.rfind(prefix, 0) == 0;
  };
  for (const std::string& name : environ_names) {
    bool ours = starts(name, "HVD_") || starts(name, "HOROVOD_");
    // Identity and rendezvous variables would contradict mpirun's; HVD_MPIRUN is hvdrun's own.
    // (under either prefix: hvdrun gives its ranks both).
    const std::string bare = ours ? name.substr(starts(name, "HOROVOD_") ? 8 : 4) : "";
    bool identity = bare == "RANK" || bare == "SIZE" || bare == "LOCAL_RANK" ||
                    bare == "LOCAL_SIZE" || bare == "CROSS_RANK" || bare == "CROSS_SIZE";
    bool contract = identity || name == "HVD_RENDEZVOUS_ADDR" ||
                    name == "HVD_RENDEZVOUS_PORT" || name == "HVD_MPIRUN";
    bool host_own = name == "_" || name == "OLDPWD" || name == "HOSTNAME" ||
                    starts(name, "BASH_FUNC_") || starts(name, "OMPI_") || starts(name, "PMIX_") ||
                    starts(name, "PMI_") || starts(name, "SSH_") ||
                    name.find("CUDA_VISIBLE_DEVICES") != std::string::npos;
    if (!contract && !host_own && !exported.count(name)) cmd.insert(cmd.end(), {"-x", name});
  }
  cmd.insert(cmd.end(), opts.command.begin(), opts.command.end());
  return cmd;
}

int ExecMpirun(const LaunchOptions& opts) {
  // The ranks mpirun starts on this host inherit its environment: an identity this hvdrun
  // inherited itself (it runs inside another job's rank) would contradict mpirun's.
  for (const char* prefix : {"HVD_", "HOROVOD_"}) {
    for (const char* bare : {"RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
                             "CROSS_SIZE", "RENDEZVOUS_ADDR", "RENDEZVOUS_PORT"}) {
      ::unsetenv((std::string(prefix) + bare).c_str());
    }
  }
  std::vector<std::string> names;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) names.emplace_back(*e, eq - *e);
  }
  std::vector<std::string> cmd = MpirunCommand(opts, names, geteuid() == 0);
  if (opts.verbose) {
    std::cerr << "hvdrun: running";
    for (const auto& w : cmd) std::cerr << " " << w;
    std::cerr << "\n";
  }
  std::vector<char*> argv;
  for (auto& w : cmd) argv.push_back(w.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::cerr << "hvdrun: cannot run " << cmd[0] << ": " << std::strerror(errno)
            << " (install Open MPI, or set HVD_MPIRUN to its mpirun)\n";
  return 127;
}

}  // namespace launcher
}  // namespace hvd
