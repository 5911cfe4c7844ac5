// Ranks on remote hosts, started with ssh.
//
// Protocol between hvdrun and one remote rank:
//   1. Before any rank starts, every remote host is probed at once (ProbeHosts): ssh in
//      BatchMode with a connect timeout runs `echo hvdrun-probe $SSH_CONNECTION` (and, with
//      --network-interface, `ip -o -4 addr show dev IFACE`). The answer gives hvdrun's own
//      address as that host saw it (the rendezvous address for that host's ranks) and the
//      host's address (its ranks' HVD_BIND_ADDR). A host that fails is reported with ssh's
//      own message.
//   2. Each remote rank is one `ssh -T host 'exec sh -c BOOTSTRAP hvdrun-rank ARGS...'`. The
//      command line carries only the fixed bootstrap script and the rank's command.
//   3. hvdrun writes the rank's environment to ssh's stdin as NAME=VALUE lines ended by an
//      empty line (the job's secret travels here, never in argv) and keeps stdin open, writing
//      a byte to it every second after (Supervisor's ticker).
//   4. The bootstrap exports the variables, cd's to hvdrun's working directory and starts the
//      command with setsid (a process group of its own), stdin from /dev/null. A watcher
//      reads the rest of stdin: at EOF (hvdrun closed it to stop the rank, or hvdrun, ssh or
//      the connection died), or when no byte came for HVDRUN_SILENCE_SECONDS (hvdrun's host
//      or its link is gone without a word: the session would wait for it forever while the
//      ranks, which still reach each other, trained on unsupervised), it sends SIGTERM to the
//      rank's group and, after the kill-after time, SIGKILL. (The silence needs bash, or
//      `timeout` from coreutils, on the host; without either, EOF only.) The bootstrap exits with the rank's
//      status (128+N for signal N), after stopping whatever the rank left in its group; ssh
//      hands the status to hvdrun.
//
// Thread-safety: call from hvdrun's main thread only (fork).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "hosts.h"
#include "spawn.h"

namespace hvd {
namespace launcher {

struct SshOptions {
  int port = 0;  // 0: ssh's default
  std::string identity_file;
  std::string config_file;
  double connect_timeout_seconds = 30;
  // About how long a session may hear nothing from its host before ssh gives up on it (its
  // ServerAlive probes, given on ssh's command line: they take the place of the ssh
  // configuration's own), so that a rank whose host is cut off ends instead of leaving hvdrun
  // waiting; 0: ssh's own default (none). hvdrun gives the ranks' HVD_TIMEOUT_SECONDS, at
  // least 10 s.
  double alive_seconds = 0;
};

// ssh's argv for running `remote_command` (one string, for the remote login shell) on host.
std::vector<std::string> SshCommand(const SshOptions& ssh, const std::string& host,
                                    const std::string& remote_command);

struct HostProbe {
  std::string host;
  bool ok = false;
  std::string error;        // why not: ssh's own message, or what was missing in the answer
  std::string client_addr;  // hvdrun's host as this host saw it (from SSH_CONNECTION)
  std::string host_addr;    // this host's address: of the interface, else from SSH_CONNECTION
};

// Probes every host at once (ssh's ConnectTimeout is timeout_seconds) and waits for all of
// them, at most timeout_seconds + 1 (hosts that have not answered by then are killed and
// reported). `interface` may be empty.
std::vector<HostProbe> ProbeHosts(const std::vector<std::string>& hosts, const SshOptions& ssh,
                                  const std::string& interface, double timeout_seconds);

// Parses a probe's stdout (exposed for tests).
void ParseProbeOutput(const std::string& out, const std::string& interface, HostProbe* probe);

// The IPv4 address of a local interface, or "" when it has none. (hvdrun resolves a list of
// interfaces to one name before it calls this or ProbeHosts.)
std::string LocalInterfaceAddress(const std::string& interface);

// `s` quoted for a POSIX shell.
std::string ShellQuote(const std::string& s);

// The remote command of step 2.
std::string RemoteRankCommand(const std::vector<std::string>& command);

// The text of step 3: hvdrun's environment less what describes this host or login (HOME,
// USER, PWD, SSH_*, ...; see the .cc), overlaid with `vars`, plus the bootstrap's own
// HVDRUN_WORKDIR (the current directory), HVDRUN_KILL_TICKS and HVDRUN_SILENCE_SECONDS (0:
// none). Variables whose name is not a shell identifier or whose value holds a newline are
// left out.
std::string RemoteEnvironmentText(const std::map<std::string, std::string>& vars,
                                  double kill_after_seconds, int silence_seconds);

// Starts one rank on p.host: steps 2 and 3. Throws std::runtime_error.
RankProcess SpawnRemoteRank(const Placement& p, const SshOptions& ssh,
                            const std::vector<std::string>& command,
                            const std::map<std::string, std::string>& vars,
                            double kill_after_seconds, double start_timeout_seconds);

}  // namespace launcher
}  // namespace hvd
