// A Transport over a subset of another transport's ranks: the local ranks of a host, the ranks
// that share a local rank across hosts, or (later) a process set. Every algorithm in
// collectives/ is written against Transport and runs unchanged on a view.
//
// Group rank i is base rank members[i]. Requests go straight to the base transport, so the
// view adds no copy and no thread; its failures are the base's (a peer outside the view that
// breaks the base breaks the view too). Abort aborts the base: one communicator underlies all
// of its views.
//
// Ordering: bytes between two ranks keep the base's per-peer order. Two views whose members
// overlap share those streams, so their collectives must run one after the other on every
// member (the engine's background thread runs collectives in one agreed order). Views do not
// carry the base's CollectiveOffload: it runs on the whole world only.
//
// Thread-safety: as the base transport (one thread).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace hvd {

class GroupView : public Transport {
 public:
  // members: distinct ranks of `base`, which must include base.rank(). The base must outlive
  // the view.
  static StatusOr<std::unique_ptr<GroupView>> Create(Transport& base, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  TransportRequest Isend(int peer, const void* buf, size_t len) override;
  TransportRequest Irecv(int peer, void* buf, size_t len) override;
  Status Wait(TransportRequest r, Deadline deadline) override;
  void Abort(const Status& why) override { base_.Abort(why); }

  const std::vector<int>& members() const { return members_; }
  int base_rank(int group_rank) const { return members_[group_rank]; }

 private:
  GroupView(Transport& base, std::vector<int> members, int rank);

  Transport& base_;
  const std::vector<int> members_;
  const int rank_;
};

// Where each rank of a job runs: host_of[r] is an index naming rank r's host (any values;
// equal means the same host).
struct Topology {
  std::vector<int> host_of;

  int size() const { return static_cast<int>(host_of.size()); }
  // The ranks on `rank`'s host, in rank order (its local view).
  std::vector<int> LocalMembers(int rank) const;
  // One rank per host, in order of each host's lowest rank: the rank whose position among its
  // host's ranks equals `rank`'s (its cross view). Hosts with fewer ranks are left out.
  std::vector<int> CrossMembers(int rank) const;
  // More than one host, and every host has the same number of ranks, more than one.
  bool Homogeneous() const;
  int hosts() const;
};

// This machine as its processes see it: a hash of its boot and of this process's network
// namespace (processes with the same key run on one host and can share memory).
uint64_t ThisHostKey();

// Every rank's place (local rank and size, cross rank and size, as the launcher gave them, and
// its host key), gathered over `t` in one allgather. When the places describe hosts of equal
// size (local_size x cross_size = size, each (cross rank, local rank) once), host_of is each
// rank's cross rank. Otherwise (hosts of unequal size: -H a:3,b:1) host_of groups the ranks by
// host key, so that a process set whose members sit evenly on hosts still finds them, and *why
// says what did not fit.
StatusOr<Topology> GatherTopology(Transport& t, int local_rank, int local_size, int cross_rank,
                                  int cross_size, uint64_t host_key, Deadline deadline,
                                  std::string* why);

}  // namespace hvd
