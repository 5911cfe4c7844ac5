#include "transport/group_view.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "collectives/collectives.h"

namespace hvd {

StatusOr<std::unique_ptr<GroupView>> GroupView::Create(Transport& base, std::vector<int> members) {
  std::set<int> seen;
  int rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    if (m < 0 || m >= base.size()) {
      return Status::InvalidArgument("group view: rank " + std::to_string(m) +
                                     " is outside the transport's " + std::to_string(base.size()) +
                                     " ranks");
    }
    if (!seen.insert(m).second) {
      return Status::InvalidArgument("group view: rank " + std::to_string(m) + " is listed twice");
    }
    if (m == base.rank()) rank = static_cast<int>(i);
  }
  if (rank < 0) {
    return Status::InvalidArgument("group view: rank " + std::to_string(base.rank()) +
                                   " is not a member of the group it would use");
  }
  return std::unique_ptr<GroupView>(new GroupView(base, std::move(members), rank));
}

GroupView::GroupView(Transport& base, std::vector<int> members, int rank)
    : base_(base), members_(std::move(members)), rank_(rank) {}

// A peer outside the view goes to the base as rank -1, which every transport refuses with
// InvalidArgument when the request is waited for.
TransportRequest GroupView::Isend(int peer, const void* buf, size_t len) {
  return base_.Isend(peer >= 0 && peer < size() ? members_[peer] : -1, buf, len);
}

TransportRequest GroupView::Irecv(int peer, void* buf, size_t len) {
  return base_.Irecv(peer >= 0 && peer < size() ? members_[peer] : -1, buf, len);
}

Status GroupView::Wait(TransportRequest r, Deadline deadline) { return base_.Wait(r, deadline); }

std::vector<int> Topology::LocalMembers(int rank) const {
  std::vector<int> out;
  for (int r = 0; r < size(); ++r) {
    if (host_of[r] == host_of[rank]) out.push_back(r);
  }
  return out;
}

std::vector<int> Topology::CrossMembers(int rank) const {
  // Each host's ranks in rank order, hosts in order of their lowest rank.
  std::vector<int> host_order;
  std::map<int, std::vector<int>> ranks_of;
  for (int r = 0; r < size(); ++r) {
    auto& v = ranks_of[host_of[r]];
    if (v.empty()) host_order.push_back(host_of[r]);
    v.push_back(r);
  }
  const auto& mine = ranks_of[host_of[rank]];
  const size_t index = std::find(mine.begin(), mine.end(), rank) - mine.begin();
  std::vector<int> out;
  for (int h : host_order) {
    if (ranks_of[h].size() > index) out.push_back(ranks_of[h][index]);
  }
  return out;
}

int Topology::hosts() const {
  return static_cast<int>(std::set<int>(host_of.begin(), host_of.end()).size());
}

bool Topology::Homogeneous() const {
  std::map<int, int> count;
  for (int h : host_of) ++count[h];
  if (count.size() < 2) return false;
  const int n = count.begin()->second;
  if (n < 2) return false;
  return std::all_of(count.begin(), count.end(), [n](const auto& kv) { return kv.second == n; });
}

namespace {

// FNV-1a: the same on every process, unlike std::hash.
uint64_t Fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

uint64_t ThisHostKey() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {0};
  ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  return Fnv(boot + "|" + std::string(ns, n > 0 ? static_cast<size_t>(n) : 0));
}

StatusOr<Topology> GatherTopology(Transport& t, int local_rank, int local_size, int cross_rank,
                                  int cross_size, uint64_t host_key, Deadline deadline,
                                  std::string* why) {
  const int n = t.size();
  constexpr size_t kWords = 6;  // the four places, then the key's two halves
  const int32_t mine[kWords] = {local_rank, local_size, cross_rank, cross_size,
                                static_cast<int32_t>(host_key >> 32),
                                static_cast<int32_t>(host_key & 0xffffffffu)};
  std::vector<int32_t> all(static_cast<size_t>(n) * kWords);
  HVD_RETURN_IF_ERROR(Allgatherv(t, mine, all.data(),
                                 std::vector<size_t>(n, sizeof(mine)), deadline));
  Topology topo;
  topo.host_of.resize(n);
  const int32_t L = all[1], C = all[3];
  auto give_up = [&](const std::string& bad) {
    if (why) *why = bad;
    // Each rank on the host of the first rank with its key.
    std::map<std::pair<int32_t, int32_t>, int> first;
    for (int r = 0; r < n; ++r) {
      const int32_t* p = &all[static_cast<size_t>(r) * kWords];
      topo.host_of[r] = first.emplace(std::make_pair(p[4], p[5]), r).first->second;
    }
    return topo;
  };
  for (int r = 0; r < n; ++r) {
    const int32_t* p = &all[static_cast<size_t>(r) * kWords];
    if (p[1] != L || p[3] != C) {
      return give_up("rank " + std::to_string(r) + " has local size " + std::to_string(p[1]) +
                     " and cross size " + std::to_string(p[3]) + ", rank 0 " +
                     std::to_string(L) + " and " + std::to_string(C) + " (hosts of unequal size)");
    }
  }
  if (static_cast<int64_t>(L) * C != n) {
    return give_up("local size " + std::to_string(L) + " x cross size " + std::to_string(C) +
                   " is not the job's " + std::to_string(n) + " ranks");
  }
  std::set<std::pair<int, int>> places;
  for (int r = 0; r < n; ++r) {
    const int32_t* p = &all[static_cast<size_t>(r) * kWords];
    if (p[0] < 0 || p[0] >= L || p[2] < 0 || p[2] >= C || !places.insert({p[2], p[0]}).second) {
      return give_up("rank " + std::to_string(r) + "'s local rank " + std::to_string(p[0]) +
                     " and cross rank " + std::to_string(p[2]) + " are out of range or taken");
    }
  }
  for (int r = 0; r < n; ++r) topo.host_of[r] = all[static_cast<size_t>(r) * kWords + 2];
  return topo;
}

}  // namespace hvd
