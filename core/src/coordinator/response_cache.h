// The response cache: a bit per recently executed tensor, so that a tensor seen before travels
// as one bit of a bit vector instead of a full request, and a response as a list of bits.
//
// Protocol (keeps every rank's cache identical without extra messages):
//   1. The cache changes only when a response list is applied, in list order: rank 0 applies a
//      list right after computing it, a worker right after receiving it; applying list k takes
//      the cache from epoch k-1 to epoch k. So at equal epochs every rank's cache is the same.
//   2. Applying a list: every single-rank-independent response (allreduce, broadcast,
//      reducescatter; not an error, no joined ranks) marks its names used; a name not cached
//      yet is inserted at the lowest free bit, or, when full, at the bit of the least recently
//      used entry, which is evicted. The list's agreed bits (the fast path) are marked used
//      first, in bit order, as every rank rebuilds their responses (RebuildAll).
//   3. A worker announces a tensor whose request equals the cached one as its bit, and sends
//      the epoch its cache is at. Rank 0 may be at a later epoch; it keeps the entries evicted
//      since the oldest epoch a worker may still use (History), and decodes a bit as it was at
//      the sender's epoch.
//   4. Rank 0 sends a response as bits when every name in it is cached (at the epoch before
//      the list) with the same request; receivers rebuild it from their cache before applying
//      the list.
//
// Thread-safety: not thread-safe; used by one thread at a time, the one running the engine's
// work (the background thread or a waiting caller; engine/engine_impl.h).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "coordinator/messages.h"

namespace hvd {

class ResponseCache {
 public:
  // Only rank 0 decodes bits from other ranks, so only it keeps the eviction history.
  ResponseCache(int capacity, bool keep_history);

  bool enabled() const { return capacity_ > 0; }
  uint64_t epoch() const { return epoch_; }
  // The bits given a request so far (each bit set anywhere is below it): it grows with the
  // names taken, up to the capacity, and never shrinks.
  size_t slots() const { return slots_.size(); }
  // The lowest bit set in `bits` that holds no request, or -1. A word at a time, without
  // reading the slots: a bit, once given a request, only ever changes to another (an
  // eviction), and the free bits are taken lowest first, so the empty ones are those from
  // slots_.size() on.
  int64_t FirstEmpty(const std::vector<uint64_t>& bits) const;

  // The bit of r's name if it is cached with exactly r's request, else -1. With `hint` (bit + 1
  // where this name was last found, 0: unknown), a bit that still holds r is taken without
  // hashing the name, and *hint is updated.
  int Lookup(const Request& r, uint32_t* hint = nullptr) const;
  // The bit that holds `name` now, else -1.
  int SlotOf(const std::string& name) const;
  // Sets in `bits` (within its size) the bit of each of `names` that the cache holds.
  void SetBitsOf(const std::vector<std::string>& names, std::vector<uint64_t>* bits) const;
  // The request a bit holds now, or null if it is empty; valid until the next Apply.
  const Request* At(uint32_t bit) const {
    return bit < slots_.size() && slots_[bit].live ? &slots_[bit].request : nullptr;
  }
  // The responses of the tensors whose bits are set (at this epoch), in bit order, fused with
  // `fusion_threshold` as FuseResponses would (planner/fusion.h); false if a bit is empty.
  // Marks each tensor used, in bit order, and the responses `from_cache`: Apply skips them;
  // each response's `bits` are its tensors'.
  // The names and shapes are written over ones taken from the ends of the `spare` responses
  // (executed ones, see EngineImpl::Recycle; emptied ones are dropped), so that a step of the
  // same tensors reuses their storage instead of allocating it again per tensor, however the
  // step splits into responses.
  bool RebuildAll(const std::vector<uint64_t>& bits, size_t fusion_threshold,
                  std::vector<Response>* out, std::vector<Response>* spare = nullptr);
  // Clears from `bits` every member of a group (Request::group) whose other members are not all
  // set: a group's members run together or wait together. The same on every rank for the same
  // bits at the same epoch (the cache's own entries decide).
  void CloseGroups(std::vector<uint64_t>* bits) const;
  // Sets in `bits` (within its size) every member of a group that has a member set there or
  // whose key is in `groups`: a group leaves the fast path whole, in one batch of requests
  // from each rank, as the coordinator takes a group (Coordinator::AddRequests).
  void WidenToGroups(std::vector<uint64_t>* bits,
                     const std::vector<std::string>& groups = {}) const;
  // Marks the tensors of `bits` used, in bit order, as RebuildAll does, without building their
  // responses (a caller that kept the ones RebuildAll gave for the same bits, at the same
  // contents()); false if a bit is empty.
  bool MarkUsed(const std::vector<uint64_t>& bits);
  // Changes whenever a bit is given a request (a new name, a changed tensor, an eviction), to
  // a number never used before by any cache (never 0): while it stays, each bit holds the same
  // request, and RebuildAll gives the same responses for the same bits and threshold.
  uint64_t contents() const { return contents_; }
  // Whether a bit holds now what it held at `epoch`: a bit announced then means the same now.
  bool UnchangedSince(uint32_t bit, uint64_t epoch) const {
    return bit < slots_.size() && slots_[bit].live && slots_[bit].since <= epoch;
  }
  // The request a bit meant at `epoch` (<= this cache's epoch); false if unknown.
  bool Decode(uint32_t bit, uint64_t epoch, Request* out) const;
  // The bits of r's names if r can travel as bits, else false.
  bool Encodable(const Response& r, std::vector<uint32_t>* bits) const;
  // Rebuilds a response from bits; false if a bit is empty.
  bool Rebuild(const std::vector<uint32_t>& bits, Response* out) const;
  // Applies a response list (step 2) and advances the epoch. With `changed`, each bit whose
  // request the list replaced or evicted is added to it with the request it held before.
  void Apply(const std::vector<Response>& list,
             std::vector<std::pair<uint32_t, Request>>* changed = nullptr);
  // Rank 0: forget evictions older than every worker's epoch.
  void PruneHistory(uint64_t oldest_epoch_in_use);

 private:
  struct Slot {
    bool live = false;
    Request request;
    uint64_t since = 0;  // the epoch from which it holds `request`
  };
  struct Eviction {
    uint64_t epoch;  // the epoch the eviction produced
    uint32_t bit;
    Request request;
  };
  static Request FromResponse(const Response& r, size_t i);
  static bool SameAsResponse(const Request& q, const Response& r, size_t i);
  static void FillFields(const Request& q, Response* out);  // out's fields, not its tensors
  static void Fill(const Request& q, Response* out);  // out's fields and first tensor from q
  static bool Cacheable(const Response& r);
  void Touch(const Request& req, std::vector<std::pair<uint32_t, Request>>* changed);

  static uint64_t NewContents();

  // The bits given a request so far, in order: made as they are first taken, so that a large
  // capacity costs memory only as names come (what At gives stays valid until the next Apply).
  std::vector<Slot> slots_;
  // [bit] when it was last used (clock_): apart from the slots, so that marking a step's
  // tensors used touches a few cache lines, not one per slot.
  std::vector<uint64_t> last_used_;
  // The eviction order: a min-heap of (last_used_ when pushed, bit), one entry per slot. A use
  // only writes last_used_; an entry it made stale is pushed again with its time when it
  // reaches the top, so the entry found current at the top is the least recently used, and an
  // eviction costs the log of the slots, not a look at each of them.
  std::vector<std::pair<uint64_t, uint32_t>> lru_;
  uint32_t LeastRecentlyUsed();
  const uint32_t capacity_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::deque<Eviction> history_;
  uint64_t epoch_ = 0;
  uint64_t clock_ = 0;
  // The bits of the slots whose request is a group's member (slots are never emptied, only
  // given another request), a word per 64 slots: a set of bits with none of them is left alone
  // by CloseGroups and WidenToGroups a word at a time (a round of ungrouped tensors).
  std::vector<uint64_t> grouped_mask_;
  void MarkGrouped(uint32_t bit, bool grouped);
  bool AnyGrouped(const std::vector<uint64_t>& bits) const;
  uint64_t contents_;
  const bool keep_history_;
  // Evictions older than this were dropped to bound memory (a rank silent for that long);
  // bits from before it cannot be decoded.
  uint64_t history_floor_ = 0;
  void BoundHistory();
};

// Requests are equal for the cache when every field that shapes the response is. Of the
// device only the kind counts (host or CUDA): ranks may use different GPUs, and each runs a
// device response on its own.
bool SameRequest(const Request& a, const Request& b);

}  // namespace hvd
