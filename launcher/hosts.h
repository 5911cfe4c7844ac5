// Host lists for hvdrun: `-H host:slots,...`, hostfiles (`host slots=N`), and the placement
// of ranks onto hosts in host order.
//
// Thread-safety: pure functions. Errors are thrown as LaunchError (the launcher is an edge of
// the project, where exceptions are allowed); hvdrun_main turns them into exit code 2.
#pragma once

#include <istream>
#include <stdexcept>
#include <string>
#include <vector>

namespace hvd {
namespace launcher {

// A usage or configuration error: printed as "hvdrun: <what>" and exit code 2.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A host hvdrun cannot reach (its ssh check failed): an elastic job goes on without it.
class HostUnreachable : public LaunchError {
 public:
  using LaunchError::LaunchError;
};

struct HostSlots {
  std::string host;
  int slots = 1;
};

// "a:2,b:4,c" (slots default to 1). Repeated names are merged, keeping first-seen order.
std::vector<HostSlots> ParseHostList(const std::string& spec);

// One entry of a host list: "host" (default_slots slots) or "host:N"; an IPv6 address in
// brackets ("[::1]:2"). `context` says where the entry came from in error messages.
HostSlots ParseHostColonSlots(const std::string& item, const std::string& context,
                              int default_slots = 1);

// One host per line: `host`, `host slots=N` or `host:N`; '#' starts a comment; blank lines
// are skipped. `source` names the file in error messages.
std::vector<HostSlots> ParseHostfile(std::istream& in, const std::string& source);

int TotalSlots(const std::vector<HostSlots>& hosts);

// The whole text of a file the user named with `flag`. Throws LaunchError "cannot read 'PATH'
// given to FLAG: REASON" for an empty path, a missing or unreadable file, and a directory.
std::string ReadUserFile(const std::string& flag, const std::string& path);

// True for localhost, 127.0.0.1, ::1, an address of one of this machine's interfaces, and
// this machine's own host name.
bool IsLocalHost(const std::string& host);

// Where one rank runs and who it is in the job (the environment contract).
struct Placement {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;  // index of this host among the hosts that have this local_rank
  int cross_size = 1;  // number of hosts that have this local_rank
  std::string host;
};

// Fills hosts in order: the first host's slots, then the next host's, ... Throws when np is
// larger than the total slots or not positive.
std::vector<Placement> PlaceRanks(const std::vector<HostSlots>& hosts, int np);

}  // namespace launcher
}  // namespace hvd
