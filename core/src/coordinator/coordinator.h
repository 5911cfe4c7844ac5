// The coordinator: the table, kept on rank 0, of which named tensors each rank has announced.
//
// Protocol (one per process set, all kept on world rank 0; every member, rank 0 included when
// it is one, is a worker; ranks below count in the set):
//   1. A worker's background thread drains its queue into Requests and sends them to rank 0
//      at once (RequestList on the control channel); rank 0 adds its own directly.
//   2. AddRequests() files each request under its name. A name is ready when every rank that
//      has not joined has announced it. Join and barrier are requests too.
//   3. For a ready name the requests are checked against each other (op, dtype, shape, root,
//      reduce op, scale factors, device); a difference gives an error Response naming the
//      tensor, what differed and the ranks, and the engine goes on.
//   4. Members of a group are held back until the whole group is ready, and the group succeeds
//      or fails as a whole: when one member's requests differ across ranks (or it is
//      abandoned, step 6), every member gets an error response naming that member, what
//      differed and the ranks, so no member waits for the others.
//      A member failed before some rank announced it is owed by that rank: its announcement,
//      when it comes, gets the same error (it pairs with the failed one, not the next step's).
//   5. ComputeResponses() returns the ready Responses in the order they became ready, fused by
//      the planner (same op, dtype, reduce op and factors; up to the fusion threshold). Rank 0
//      calls it at once, or HVD_CYCLE_TIME after the oldest became ready, and broadcasts that
//      list; every rank executes it in that order.
//   6. CheckStalls() logs names that some ranks have announced and others have not, longer
//      than the stall time, with the missing ranks, and groups held back that long with the
//      members they wait for. Past the stall shutdown time (if set) such a name shuts the job
//      down, as Horovod's stall shutdown does (stall_shutdown(): the engine fails every rank's
//      operations with it). Failing the name on the ranks that announced it alone would leave
//      the others out of step: their late announcement would pair with the next step's.
//
// Thread-safety: not thread-safe; used only by rank 0's background thread.
#pragma once

#include <deque>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/time.h"
#include "coordinator/messages.h"

namespace hvd {

// The stall shutdown time in force, as Horovod reads its two knobs: none (0) where it is below
// the stall check time (a check time of 0, no warnings, leaves it as it is).
double StallShutdownSeconds(double stall_check_seconds, double stall_shutdown_seconds);

class Coordinator {
 public:
  Coordinator(int size, size_t fusion_threshold_bytes, double stall_seconds,
              double stall_shutdown_seconds = 0);

  // This coordinator negotiates process set `id`: its rank i is world rank world_ranks[i], and
  // its messages name world ranks and the set.
  void SetProcessSet(int32_t id, std::vector<int> world_ranks);

  // The threshold ComputeResponses fuses up to from now on (autotune changes it).
  void set_fusion_threshold(size_t bytes) { fusion_threshold_ = bytes; }

  // `rank` counts in the process set. `since`: when the rank announced them, where that was
  // before now (a cached tensor's bit, moved here when another rank was late); the stall clock
  // of a name starts at its earliest announcement.
  void AddRequests(int rank, std::vector<Request> requests,
                   Clock::time_point since = Clock::time_point());
  // The same, with each request's own `since` (since[i] for requests[i]).
  void AddRequests(int rank, std::vector<Request> requests,
                   const std::vector<Clock::time_point>& since);
  // The responses that became ready since the last call, fused, in execution order.
  std::vector<Response> ComputeResponses();
  // Logs stalled names (at most once per stall period): one line per set of missing ranks,
  // naming up to kStallNamesShown of its names, the oldest first. Returns the number stalled.
  int CheckStalls(Clock::time_point now);
  static constexpr size_t kStallNamesShown = 5;
  // The lines the last check that ran logged.
  const std::vector<std::string>& stall_warnings() const { return stall_warnings_; }
  // Once a name has waited past the stall shutdown time: why the job shuts down (the name,
  // the ranks missing and those ready); "" before.
  const std::string& stall_shutdown() const { return stall_shutdown_; }
  bool idle() const { return table_.empty() && ready_.empty() && groups_.empty(); }
  // Whether some rank has announced `name` and it is not ready yet.
  bool Has(const std::string& name) const { return table_.count(name) > 0; }
  // Whether some rank has joined (until every rank has).
  bool any_joined() const { return joined_count_ > 0; }
  // When the oldest response not yet taken by ComputeResponses() became ready.
  bool has_ready() const { return !ready_.empty(); }
  Clock::time_point ready_since() const { return ready_since_; }
  // Names some rank has announced but that are not ready yet (for shutdown messages).
  std::vector<std::string> PendingNames() const;
  // Names some rank owes an announcement of (owed_): their cached bits must come here, where
  // the debt is paid, not be agreed on with the other ranks' next step. TakeNewlyOwed: those
  // owed since its last call.
  bool owes_any() const { return !owed_.empty(); }
  std::vector<std::string> OwedNames() const;
  std::vector<std::string> TakeNewlyOwed() { return std::exchange(newly_owed_, {}); }

 private:
  struct Entry {
    std::vector<std::optional<Request>> per_rank;
    int count = 0;
    Clock::time_point first_seen;
    std::list<std::string>::iterator order;  // its place in arrival_order_
  };

  void Add(int rank, Request r, Clock::time_point since);
  void MarkReadyIfComplete(const std::string& name);
  Response BuildResponse(const std::string& name, Entry& e);
  // Fails every member of group `key` held back or still pending, with `cause`'s reason.
  void FailGroup(const std::string& key, const Response& cause);
  // Fails `name` with `error` for the ranks that have announced it (its entry's, and `rank`
  // where >= 0, whose request is not filed), and leaves it owed by the others (owed_). Other
  // groups the entry's requests are in fail with it.
  void FailName(const std::string& name, int rank, const Response& error);
  std::string Validate(const std::string& name, const Entry& e) const;
  // "; rank R refused it: <why>" for the first rank that sent the tensor as a refusal
  // (Request::error), "" if none did: for the messages of a tensor still waiting.
  std::string RefusalOf(const Entry& e) const;
  // How the stall messages call an entry: 'name', or for the engine's own request that adds or
  // removes a process set, which call it is (its name's number counts such calls; it is not a
  // set's id).
  std::string Label(const std::string& name, const Entry& e) const;
  // Each distinct process set that ranks added or removed, with its ranks (Validate).
  std::string EachRanksSet(const Entry& e) const;
  // The ranks that announced e's name, and those that have not and have not joined.
  void ReadyAndMissing(const Entry& e, std::vector<int>* ready, std::vector<int>* missing) const;
  Response BuildJoinResponse();
  // Holds r (ready or an error) until every member of its group is; then releases the group.
  void ReleaseGroup(const Request& first, Response r);

  int World(int rank) const { return world_.empty() ? rank : world_[rank]; }
  std::vector<int> World(const std::vector<int>& ranks) const;
  std::string Where() const;  // "" or " in process set N"

  const int size_;
  int32_t set_id_ = 0;
  std::vector<int> world_;  // set rank -> world rank (empty: the same)
  size_t fusion_threshold_;
  const double stall_seconds_;
  const double stall_shutdown_seconds_;
  Clock::time_point last_shutdown_check_;
  std::string stall_shutdown_;
  std::vector<std::string> stall_warnings_;
  void CheckStallShutdown(Clock::time_point now);
  std::unordered_map<std::string, Entry> table_;
  // Names in order of first announcement; a list, so that a name leaves it in O(1) however
  // many are pending (a first step of many thousand tensors).
  std::list<std::string> arrival_order_;
  std::vector<Response> ready_;
  Clock::time_point ready_since_;
  void PushReady(Response r);
  struct Group {
    int size = 0;
    std::vector<Response> members;  // ready so far, in the order they became ready
    Clock::time_point since;        // when the first became ready
  };
  std::map<std::string, Group> groups_;  // group key -> members held back
  // Groups failed while the current batch of requests is added: its later members fail too.
  std::map<std::string, Response> failed_groups_;
  // Names failed before some ranks announced them (a group failed as a whole while a member
  // waited on others): each rank pairs its k-th announcement of a name with the others' k-th,
  // so such a rank's next announcement of the name is the one that failed, and gets the error
  // at once instead of waiting for ranks that have moved on. Per name: the error and, per
  // rank, how many announcements it owes.
  struct Owed {
    Response error;
    std::vector<int> count;
    int total = 0;
  };
  std::unordered_map<std::string, Owed> owed_;
  static constexpr size_t kMaxOwed = 4096;
  std::vector<std::string> newly_owed_;
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  Clock::time_point last_stall_check_;
};

}  // namespace hvd
