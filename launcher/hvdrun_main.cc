// hvdrun: starts the ranks of an hvd job on this machine and supervises them.
// See `hvdrun --help` and supervisor.h for the failure policy.
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>

#include "args.h"
#include "bootstrap/store.h"
#include "common/logging.h"
#include "spawn.h"
#include "supervisor.h"

namespace hvd {
namespace launcher {
namespace {

constexpr int kUsageError = 2;
constexpr int kStartError = 1;
constexpr int kCommandNotFound = 127;

std::string Join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

int RunJob(const LaunchOptions& opts) {
  std::vector<std::string> command = opts.command;
  command[0] = ResolveProgram(command[0]);
  std::vector<Placement> placements = PlaceRanks(opts.hosts, opts.np);

  auto level = opts.knobs.find("HVD_LOG_LEVEL");  // also for the store's own messages
  LogLevel parsed;
  if (level != opts.knobs.end() && ParseLogLevel(level->second, &parsed)) SetLogLevel(parsed);

  int signal_fd = SetUpSignals();  // before the store's thread starts: it inherits the mask
  const std::string secret = RandomSecret();
  auto server = StoreServer::Start("127.0.0.1", 0, secret);
  if (!server.ok()) {
    std::cerr << "hvdrun: cannot start the rendezvous store: " << server.status().ToString() << "\n";
    return kStartError;
  }
  JobEnvironment job;
  job.rendezvous_addr = "127.0.0.1";
  job.rendezvous_port = (*server)->port();
  job.secret = secret;
  job.knobs = opts.knobs;

  SupervisorOptions sopts;
  sopts.grace_seconds = opts.grace_seconds;
  sopts.kill_after_seconds = opts.kill_after_seconds;
  sopts.prefix_output = opts.prefix_output;
  sopts.verbose = opts.verbose;
  Supervisor supervisor(sopts, signal_fd);
  if (opts.verbose) {
    std::cerr << "hvdrun: rendezvous store on 127.0.0.1:" << job.rendezvous_port << "\n";
  }
  for (const Placement& p : placements) {
    try {
      RankProcess r = SpawnRank(p, command, RankEnvironment(p, job), opts.start_timeout_seconds);
      if (opts.verbose) {
        std::cerr << "hvdrun: started rank " << p.rank << " (pid " << r.pid << ") on " << p.host
                  << ": " << Join(command) << "\n";
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

}  // namespace

int Main(int argc, char** argv) {
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
  try {
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
