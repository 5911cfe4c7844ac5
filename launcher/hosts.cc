#include "hosts.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace hvd {
namespace launcher {
namespace {

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

int ParseSlots(const std::string& text, const std::string& context) {
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    throw LaunchError("bad slot count '" + text + "' in " + context +
                      " (expected a positive integer below 1000000000)");
  }
  int n = std::atoi(text.c_str());
  if (n <= 0) throw LaunchError("slot count must be positive in " + context);
  return n;
}

void CheckHostName(const std::string& host, const std::string& context) {
  if (host.empty()) throw LaunchError("empty host name in " + context);
  for (char c : host) {
    unsigned char u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '.' || c == '-' || c == '_' || c == ':' || c == '[' || c == ']')) {
      throw LaunchError("bad character in host name '" + host + "' in " + context);
    }
  }
}

void AddMerged(std::vector<HostSlots>* hosts, const HostSlots& h) {
  for (auto& existing : *hosts) {
    if (existing.host == h.host) {
      if (existing.slots > INT_MAX - h.slots) throw LaunchError("too many slots for " + h.host);
      existing.slots += h.slots;
      return;
    }
  }
  hosts->push_back(h);
}

}  // namespace

// "host" or "host:N" (the last ':' separates the slots, so "[::1]:2" works).
HostSlots ParseHostColonSlots(const std::string& item, const std::string& context,
                              int default_slots) {
  HostSlots h;
  h.slots = default_slots;
  size_t colon = item.rfind(':');
  bool bracketed = !item.empty() && item[0] == '[';
  if (colon == std::string::npos || (bracketed && colon < item.find(']'))) {
    h.host = item;
  } else {
    h.host = item.substr(0, colon);
    h.slots = ParseSlots(item.substr(colon + 1), context);
  }
  if (!bracketed && h.host.find(':') != std::string::npos) {
    throw LaunchError("bad entry '" + item + "' in " + context +
                      ": expected host or host:slots (an IPv6 address in brackets: [::1]:2)");
  }
  if (bracketed && h.host.back() != ']') {
    throw LaunchError("bad entry '" + item + "' in " + context +
                      ": expected [address] or [address]:slots after the brackets");
  }
  CheckHostName(h.host, context);
  return h;
}

std::vector<HostSlots> ParseHostList(const std::string& spec) {
  std::vector<HostSlots> hosts;
  std::stringstream ss(spec);
  std::string item;
  const std::string context = "-H '" + spec + "'";
  const std::string trimmed = Trim(spec);
  if (!trimmed.empty() && trimmed.back() == ',') throw LaunchError("empty entry in " + context);
  while (std::getline(ss, item, ',')) {
    item = Trim(item);
    if (item.empty()) throw LaunchError("empty entry in " + context);
    AddMerged(&hosts, ParseHostColonSlots(item, context));
  }
  if (hosts.empty()) throw LaunchError("no hosts in " + context);
  return hosts;
}

std::vector<HostSlots> ParseHostfile(std::istream& in, const std::string& source) {
  std::vector<HostSlots> hosts;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const std::string context = source + ":" + std::to_string(lineno);
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    // `slots = N` as well as `slots=N` (Horovod reads what follows the '=').
    std::string joined;
    for (size_t i = 0; i < line.size(); ++i) {
      if (std::isspace(static_cast<unsigned char>(line[i]))) {
        const size_t next = line.find_first_not_of(" \t\r\v\f", i);
        const bool before = next != std::string::npos && line[next] == '=';
        const bool after = !joined.empty() && joined.back() == '=';
        if (before || after) continue;  // a blank next to an '='
      }
      joined += line[i];
    }
    std::istringstream words(Trim(joined));
    std::string host;
    if (!(words >> host)) continue;
    HostSlots h = ParseHostColonSlots(host, context);
    std::string word;
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0) {
        h.slots = ParseSlots(word.substr(6), context);
      } else if (word.rfind("max_slots=", 0) == 0) {
        ParseSlots(word.substr(10), context);  // accepted (Open MPI syntax) and ignored
      } else {
        throw LaunchError("unexpected '" + word + "' in " + context +
                          " (expected 'host slots=N')");
      }
    }
    AddMerged(&hosts, h);
  }
  if (hosts.empty()) throw LaunchError("no hosts in hostfile " + source);
  return hosts;
}

std::string ReadUserFile(const std::string& flag, const std::string& path) {
  const std::string what = "cannot read '" + path + "' given to " + flag;
  if (path.empty()) throw LaunchError(what + ": the path is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw LaunchError(what + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw LaunchError(what + ": it is a directory (expected a file)");
  std::ifstream in(path);
  if (!in) throw LaunchError(what + ": " + std::strerror(errno ? errno : EACCES));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw LaunchError(what + ": " + std::strerror(errno ? errno : EIO));
  return text.str();
}

int TotalSlots(const std::vector<HostSlots>& hosts) {
  long long total = 0;
  for (const auto& h : hosts) total += h.slots;
  return total > INT_MAX ? INT_MAX : static_cast<int>(total);
}

namespace {

// An address of one of this machine's interfaces (the host given by its IP, as cluster
// hostfiles list them). Other loopback addresses (127.0.0.2) are not: as for horovodrun, they
// name hosts reached over ssh.
bool IsOwnAddress(std::string host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  in_addr v4{};
  in6_addr v6{};
  const bool is_v4 = ::inet_pton(AF_INET, host.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) return false;
  if (host == "127.0.0.1" || (is_v6 && IN6_IS_ADDR_LOOPBACK(&v6))) return true;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool own = false;
  for (ifaddrs* a = list; a != nullptr && !own; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    if (is_v4 && a->ifa_addr->sa_family == AF_INET) {
      own = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == v4.s_addr;
    } else if (is_v6 && a->ifa_addr->sa_family == AF_INET6) {
      own = IN6_ARE_ADDR_EQUAL(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, &v6);
    }
  }
  ::freeifaddrs(list);
  return own;
}

}  // namespace

bool IsLocalHost(const std::string& given) {
  // Host names are case-insensitive (LOCALHOST, Node1); addresses have no letters that matter.
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string host = lower(given);
  if (host == "localhost" || IsOwnAddress(host)) return true;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return false;
  const std::string own = lower(name);
  if (host == own) return true;
  // "node1" matches "node1.cluster.example" and the other way round.
  auto short_name = [](const std::string& s) { return s.substr(0, s.find('.')); };
  return short_name(host) == short_name(own) &&
         (host.find('.') == std::string::npos || own.find('.') == std::string::npos);
}

std::vector<Placement> PlaceRanks(const std::vector<HostSlots>& hosts, int np) {
  if (np <= 0) throw LaunchError("-np must be positive, got " + std::to_string(np));
  int total = TotalSlots(hosts);
  if (np > total) {
    throw LaunchError("-np " + std::to_string(np) + " is larger than the " +
                      std::to_string(total) + " slot(s) of the host list");
  }
  // Ranks per host, filling hosts in order.
  std::vector<int> on_host;
  for (int left = np, i = 0; left > 0; ++i) {
    int n = std::min(left, hosts[i].slots);
    on_host.push_back(n);
    left -= n;
  }
  std::vector<Placement> out;
  for (size_t h = 0; h < on_host.size(); ++h) {
    for (int l = 0; l < on_host[h]; ++l) {
      Placement p;
      p.rank = static_cast<int>(out.size());
      p.size = np;
      p.local_rank = l;
      p.local_size = on_host[h];
      p.host = hosts[h].host;
      p.cross_rank = 0;
      p.cross_size = 0;
      for (size_t k = 0; k < on_host.size(); ++k) {
        if (on_host[k] > l) {
          if (k < h) ++p.cross_rank;
          ++p.cross_size;
        }
      }
      out.push_back(p);
    }
  }
  return out;
}

}  // namespace launcher
}  // namespace hvd
