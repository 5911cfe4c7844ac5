#include "remote.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

#include "output.h"

extern char** environ;

namespace hvd {
namespace launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Runs under `sh -c` on the remote host; "$@" is the rank's command. See remote.h, step 4.
// Written for dash: `kill -SIG -PGID`, no `--`, no `read -t`. The watcher ($w; $k stops the
// rank) waits for silence with bash's `read -t`, one process for the rank's life, which the
// bootstrap's `kill $w` ends. It reads no startup file: bash started with a socket for stdin
// under sshd reads ~/.bashrc even with -c, and what a .bashrc runs (pyenv's rehash takes a
// lock file) must not be killed half-way by `kill $w`. Without bash, `timeout head` 2 s at a
// time (three processes a tick, and one left running when the rank exits ends within 2 s).
// Every loop ends at EOF, after $q s without a tick from hvdrun, or after $t ticks.
constexpr const char* kBootstrap = R"sh(e=1
while IFS= read -r l; do
  case $l in
    '') e=0; break ;;
    *=*) export "$l" ;;
  esac
done
[ $e = 0 ] || exit 125
t=${HVDRUN_KILL_TICKS:-50}
q=${HVDRUN_SILENCE_SECONDS:-0}
cd "$HVDRUN_WORKDIR" || exit 126
unset HVDRUN_KILL_TICKS HVDRUN_WORKDIR HVDRUN_SILENCE_SECONDS
exec 3<&0 0</dev/null
setsid "$@" 3<&- &
p=$!
k='kill -TERM -$p || kill -TERM $p
n=0
while [ $n -lt $t ] && kill -0 -$p; do sleep 0.1; n=$((n + 1)); done
kill -KILL -$p'
{
  if [ "$q" -gt 0 ] && command -v bash; then
    export p t q
    unset BASH_ENV ENV
    exec bash --norc --noprofile -c "while read -r -n 1 -t \$q _; do :; done
$k"
  elif [ "$q" -gt 0 ] && timeout 1 true; then
    m=0
    while [ $m -lt $q ]; do
      c=$(timeout 2 head -c 1)
      r=$?
      if [ -n "$c" ]; then m=0; elif [ $r = 124 ]; then m=$((m + 2)); else break; fi
    done
  else
    while read -r _; do :; done
  fi
  eval "$k"
} <&3 >/dev/null 2>&1 &
w=$!
exec 3<&-
wait $p
s=$?
kill $w 2>/dev/null
if kill -TERM -$p 2>/dev/null; then sleep 0.2; kill -KILL -$p 2>/dev/null; fi
exit $s)sh";

constexpr size_t kMaxProbeOutput = 64 << 10;

// Variables that describe hvdrun's own login or terminal, not the job: the remote login
// sets its own (or they would mislead there).
bool Forwardable(const std::string& name, const std::string& value) {
  static const std::set<std::string> deny = {
      "_", "PWD", "OLDPWD", "SHLVL", "HOME", "USER", "LOGNAME", "MAIL", "SHELL", "HOSTNAME",
      "IFS", "PS1", "PS2", "PS4", "DISPLAY", "XAUTHORITY", "TMUX", "TMUX_PANE", "STY", "WINDOW"};
  if (deny.count(name) || value.find('\n') != std::string::npos) return false;
  for (const char* prefix : {"SSH_", "BASH_FUNC_", "XDG_", "HVDRUN_"}) {
    if (name.rfind(prefix, 0) == 0) return false;
  }
  return true;
}

bool IsIdentifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::vector<std::string> OwnEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.push_back(*e);
  return env;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// "[::1]" -> "::1": ssh wants the bare address.
std::string SshHostName(const std::string& host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

struct RunningProbe {
  RankProcess proc;
  std::string out, err;
  bool reaped = false;
  int status = 0;
};

// Reads what is available from `*fd` into `sink`; closes the fd at EOF.
void Drain(int* fd, std::string* sink) {
  char buf[4096];
  while (*fd >= 0) {
    ssize_t n = ::read(*fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      ::close(*fd);
      *fd = -1;
      return;
    }
    if (sink->size() < kMaxProbeOutput) sink->append(buf, static_cast<size_t>(n));
  }
}

// Polls the probes' pipes and reaps them until all are done or the deadline passes.
void WaitForProbes(std::vector<RunningProbe>* probes, Clock::time_point deadline) {
  auto done = [](const RunningProbe& p) {
    return p.reaped && p.proc.out_fd < 0 && p.proc.err_fd < 0;
  };
  for (int round = 0; round < 1000000; ++round) {  // bounded by the deadline below
    std::vector<pollfd> fds;
    for (auto& p : *probes) {
      if (!p.reaped && ::waitpid(p.proc.pid, &p.status, WNOHANG) == p.proc.pid) p.reaped = true;
      for (int fd : {p.proc.out_fd, p.proc.err_fd}) {
        if (fd >= 0) fds.push_back(pollfd{fd, POLLIN, 0});
      }
    }
    if (std::all_of(probes->begin(), probes->end(), done)) return;
    auto now = Clock::now();
    if (now >= deadline) return;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left + 1, 50)));
    for (auto& p : *probes) {
      Drain(&p.proc.out_fd, &p.out);
      Drain(&p.proc.err_fd, &p.err);
    }
  }
}

// The probe's verdict once it has finished or been given up on.
void Judge(RunningProbe* p, const std::string& interface, double timeout_seconds,
           HostProbe* probe) {
  std::string ssh_said = Trim(p->err);
  if (!p->reaped) {
    std::ostringstream os;
    os << "no answer within --start-timeout " << timeout_seconds << " s";
    if (!ssh_said.empty()) os << ": " << ssh_said;
    probe->error = os.str();
    return;
  }
  if (!WIFEXITED(p->status) || WEXITSTATUS(p->status) != 0) {
    probe->error = !ssh_said.empty() ? ssh_said
                   : WIFEXITED(p->status)
                       ? "ssh exited with code " + std::to_string(WEXITSTATUS(p->status))
                       : "ssh was killed by signal " + std::to_string(WTERMSIG(p->status));
    return;
  }
  ParseProbeOutput(p->out, interface, probe);
  if (!probe->ok && !ssh_said.empty()) probe->error += " (" + ssh_said + ")";
}

}  // namespace

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

std::vector<std::string> SshCommand(const SshOptions& ssh, const std::string& host,
                                    const std::string& remote_command) {
  int connect_timeout = std::max(1, static_cast<int>(std::ceil(ssh.connect_timeout_seconds)));
  std::vector<std::string> argv = {"ssh", "-T", "-x", "-o", "BatchMode=yes", "-o",
                                   "ConnectTimeout=" + std::to_string(connect_timeout)};
  if (ssh.alive_seconds > 0) {
    // ssh gives up after CountMax unanswered probes an interval apart, the first an interval
    // into the silence: about 3 intervals.
    const int interval = std::max(1, static_cast<int>(std::ceil(ssh.alive_seconds / 3)));
    argv.insert(argv.end(), {"-o", "ServerAliveInterval=" + std::to_string(interval), "-o",
                             "ServerAliveCountMax=2"});
  }
  if (!ssh.config_file.empty()) argv.insert(argv.end(), {"-F", ssh.config_file});
  if (ssh.port > 0) argv.insert(argv.end(), {"-p", std::to_string(ssh.port)});
  if (!ssh.identity_file.empty()) argv.insert(argv.end(), {"-i", ssh.identity_file});
  argv.insert(argv.end(), {"--", SshHostName(host), remote_command});
  return argv;
}

void ParseProbeOutput(const std::string& out, const std::string& interface, HostProbe* probe) {
  std::istringstream lines(out);
  bool saw_connection = false;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string first, a, b, c, d;
    words >> first;
    if (first == "hvdrun-probe" && (words >> a >> b >> c >> d)) {
      probe->client_addr = a;
      if (interface.empty()) probe->host_addr = c;
      saw_connection = true;
    } else if (!interface.empty() && probe->host_addr.empty()) {
      while (words >> a) {  // "2: eth0    inet 10.1.2.3/24 brd ..."
        if (a == "inet" && (words >> b)) {
          probe->host_addr = b.substr(0, b.find('/'));
          break;
        }
      }
    }
  }
  probe->ok = false;
  if (!saw_connection) {
    probe->error = "the probe did not answer (SSH_CONNECTION is not set there?)";
  } else if (probe->host_addr.empty()) {
    probe->error = "no IPv4 address on interface " + interface + " there";
  } else {
    probe->ok = true;
    probe->error.clear();
  }
}

std::vector<HostProbe> ProbeHosts(const std::vector<std::string>& hosts, const SshOptions& ssh,
                                  const std::string& interface, double timeout_seconds) {
  std::string command = "echo hvdrun-probe $SSH_CONNECTION";
  if (!interface.empty()) {
    // "|| true": a missing address is reported by ParseProbeOutput, with ip's message.
    command += "; PATH=$PATH:/usr/sbin:/sbin ip -o -4 addr show dev " + ShellQuote(interface) +
               " || true";
  }
  std::vector<std::string> env = OwnEnvironment();
  std::vector<RunningProbe> running;
  std::vector<HostProbe> result(hosts.size());
  for (size_t i = 0; i < hosts.size(); ++i) {
    result[i].host = hosts[i];
    std::vector<std::string> argv = SshCommand(ssh, hosts[i], command);
    argv[0] = ResolveProgram("ssh");
    RunningProbe p;
    p.proc = SpawnRank(Placement{}, argv, env, timeout_seconds);
    running.push_back(p);
  }
  // ssh's ConnectTimeout is the timeout itself; one more second lets it say why it gave up.
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_seconds + 1.0));
  WaitForProbes(&running, deadline);
  for (size_t i = 0; i < running.size(); ++i) {
    RunningProbe& p = running[i];
    Judge(&p, interface, timeout_seconds, &result[i]);
    if (!p.reaped) {
      ::killpg(p.proc.pid, SIGKILL);
      ::waitpid(p.proc.pid, nullptr, 0);  // SIGKILL: returns at once
    }
    ForgetGroupIfGone(p.proc.pid);
    for (int fd : {p.proc.out_fd, p.proc.err_fd}) {
      if (fd >= 0) ::close(fd);
    }
  }
  return result;
}

std::string LocalInterfaceAddress(const std::string& interface) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* a = list; a != nullptr && out.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (interface != a->ifa_name) continue;
    char text[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) out = text;
  }
  ::freeifaddrs(list);
  return out;
}

std::string RemoteRankCommand(const std::vector<std::string>& command) {
  std::string out = "exec sh -c " + ShellQuote(kBootstrap) + " hvdrun-rank";
  for (const auto& word : command) out += " " + ShellQuote(word);
  return out;
}

std::string RemoteEnvironmentText(const std::map<std::string, std::string>& vars,
                                  double kill_after_seconds, int silence_seconds) {
  std::map<std::string, std::string> all;
  for (const std::string& kv : OwnEnvironment()) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (Forwardable(name, value)) all[name] = value;
  }
  for (const auto& kv : vars) all[kv.first] = kv.second;
  char cwd[4096] = {};
  if (::getcwd(cwd, sizeof(cwd) - 1) == nullptr) throw std::runtime_error("getcwd failed");
  all["HVDRUN_WORKDIR"] = cwd;
  all["HVDRUN_KILL_TICKS"] = std::to_string(std::llround(std::ceil(kill_after_seconds * 10)));
  all["HVDRUN_SILENCE_SECONDS"] = std::to_string(silence_seconds);
  std::string text;
  for (const auto& kv : all) {
    if (!IsIdentifier(kv.first) || kv.second.find('\n') != std::string::npos) continue;
    text += kv.first + "=" + kv.second + "\n";
  }
  return text + "\n";
}

RankProcess SpawnRemoteRank(const Placement& p, const SshOptions& ssh,
                            const std::vector<std::string>& command,
                            const std::map<std::string, std::string>& vars,
                            double kill_after_seconds, double start_timeout_seconds) {
  // hvdrun's ticks stop (its host or its link gone): the rank stops about when hvdrun's ssh
  // gives up on the host, plus two ticks.
  const int silence =
      ssh.alive_seconds > 0 ? static_cast<int>(std::ceil(ssh.alive_seconds)) + 2 : 0;
  const std::string text = RemoteEnvironmentText(vars, kill_after_seconds, silence);
  std::vector<std::string> argv = SshCommand(ssh, p.host, RemoteRankCommand(command));
  argv[0] = ResolveProgram("ssh");
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  // Room for the whole environment, so the write below never waits for ssh to connect.
  ::fcntl(in[1], F_SETPIPE_SZ, static_cast<int>(std::min<size_t>(text.size() + 4096, 1 << 20)));
  RankProcess r;
  try {
    r = SpawnRank(p, argv, OwnEnvironment(), start_timeout_seconds, in[0]);
  } catch (...) {
    ::close(in[0]);
    ::close(in[1]);
    throw;
  }
  ::close(in[0]);
  ::fcntl(in[1], F_SETFL, ::fcntl(in[1], F_GETFL) | O_NONBLOCK);
  WriteAll(in[1], text);  // EPIPE if ssh died already: its exit status tells the rest
  r.remote = true;
  r.in_fd = in[1];
  return r;
}

}  // namespace launcher
}  // namespace hvd
