// Command-line parsing for hvdrun: flags up to the COMMAND, host lists, knob flags mapped to
// the HVD_* environment. Errors are thrown as LaunchError (see hosts.h): exit code 2.
//
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "hosts.h"

namespace hvd {
namespace launcher {

struct LaunchOptions {
  bool help = false;
  int np = 0;                                // resolved: from -np or the total slots
  std::vector<HostSlots> hosts;              // resolved: from -H, --hostfile or localhost:np
  std::vector<std::string> command;          // COMMAND ARGS...
  std::map<std::string, std::string> knobs;  // HVD_* knob variables for every rank
  bool verbose = false;
  bool mpi = false;  // --mpi: run the job through Open MPI's mpirun
  bool prefix_output = true;
  bool prefix_timestamp = false;  // --prefix-output-with-timestamp
  double grace_seconds = 3.0;       // after the first failure, before SIGTERM
  double kill_after_seconds = 5.0;  // after SIGTERM, before SIGKILL
  double start_timeout_seconds = 30.0;
  // Remote hosts (any host that is not this machine) are reached with ssh.
  int ssh_port = 0;               // -p/--ssh-port; 0: ssh's own default
  std::string ssh_identity_file;  // -i/--ssh-identity-file
  std::string ssh_config_file;    // --ssh-config (ssh -F)
  // --network-interface(s): addresses to publish come from it; a comma-separated list of
  // names, of which hvdrun takes the first this host has an IPv4 address on, for every host.
  std::string network_interface;
  // horovodrun's spellings (see HelpText):
  std::string output_dir;              // --output-filename: DIR/rank.N/{stdout,stderr}
  bool check_build = false;            // --check-build / -cb: print the build and exit
  bool version = false;                // --version
  std::vector<std::string> mpi_args;   // --mpi-args / --binding-args: words for mpirun
  std::vector<std::string> warnings;   // flags accepted that have no effect in hvd, and why
  // Elastic mode (launcher/elastic.h): on with --min-np, --max-np or --host-discovery-script.
  bool elastic = false;
  int min_np = 0;                      // default: -np
  int max_np = 0;                      // 0: no bound
  std::string discovery_script;        // --host-discovery-script
  int slots_per_host = 1;              // --slots-per-host
  double elastic_timeout_seconds = 600;  // --elastic-timeout (HOROVOD_ELASTIC_TIMEOUT)
  int reset_limit = -1;                // --reset-limit; -1: no bound
  double cooldown_min_seconds = 0;     // --blacklist-cooldown-range MIN MAX; 0: for good
  double cooldown_max_seconds = 0;
};

// Parses argv (argv[0] is the program). Flags end at the first word that is not a flag or a
// flag's value, or at "--"; everything after belongs to the command. With help set, nothing
// else is checked.
LaunchOptions ParseArgs(int argc, const char* const* argv);

// The --help text: every flag, the environment each rank gets, examples.
std::string HelpText();

// Value checks used by ParseArgs, exposed for tests. `flag` names the flag in the message.
double ParseNonNegative(const std::string& flag, const std::string& text);
double ParsePositive(const std::string& flag, const std::string& text);
int ParseCount(const std::string& flag, const std::string& text);

}  // namespace launcher
}  // namespace hvd
