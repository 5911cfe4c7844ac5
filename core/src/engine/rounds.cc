// The global set's symmetric fast path: the ranks agree on the cached tensors every one of them
// has ready in rounds, each rank sending its part to every other and building the agreed
// responses itself. Rank 0 answers nothing and does the same work as any rank; a cached step
// costs every rank one part sent to each other rank and one AND per part, whatever the number of
// tensors.
//
// Where. On every rank of a job whose ranks all link to each other directly: the ranks of one
// host that share memory (the control rings of transport/shm), a world of one, or, with
// HVD_SYMMETRIC_NEGOTIATION=on, any job of up to 32 ranks, whose workers then also link over
// TCP where they share no memory (transport/tcp/mesh_hello.h). Elsewhere, and for process
// sets, rank 0 still ANDs the bits the workers send it (background.cc).
//
// A round. A rank's part (RoundContribution) is its row of ready bits at its cache epoch and the
// bits it moves to the coordinator; rank 0's also carries the fusion threshold and plan knobs
// every rank builds the responses with. A rank sends its part of round k+1 once it has completed
// round k, when it has news (a bit announced since its last part, a bit to withdraw; on rank 0,
// a request its coordinator took for a name that has a bit, or a join) or when another rank's
// part of round k+1 reaches it; while its callers are still enqueuing (tensors came since its
// last drain, or the last one came less than kBurstGap ago) and none of them waits, the
// part waits for the rest of them, up to kBurstHold (HoldPartForBurst). It
// completes the round once it holds every part, and every rank computes the same from the same
// parts:
//   - agreed: the bits each rank announced (less those whose cache entry changed after that
//     rank's epoch) ANDed over the ranks, less the withdrawn bits ORed over the ranks. Every rank
//     builds their responses from its own cache, in bit order, fused with rank 0's threshold,
//     and runs them next (a round that agrees on the bits, threshold and knobs of one of the
//     last few rounds, with the cache unchanged, takes that round's responses again:
//     StepResponses).
//   - held: while some rank announced a bit another has not (a step still arriving there) and
//     rank 0's part allows it (hold_uneven, until kStragglerHold after the first round that
//     held), the round agrees on nothing and every bit stays announced, so that the step runs
//     as one collective; rank 0 starts the round that ends the hold. Meanwhile only a rank
//     that lacked some of the others' bits starts a round, once it has them all (PartHasNews):
//     the others answer it with everything they have.
//   - withdrawn: a rank holding such a bit sends its tensor's request to the coordinator.
//     Rank 0 withdraws the bits of the names its coordinator holds requests for (every bit while
//     a rank has joined), so a name is answered on one path only: a rank whose request changed,
//     or that joined, takes the other ranks' tensors of that name with it to the coordinator. A
//     rank withdraws its own bits that waited longer than kBitPatience (another rank is late):
//     there the coordinator's stall inspector names the late rank.
//
// Groups. A group's members (a grouped operation: Request::group) take this path whole: a rank
// announces them only if the cache holds every one (LookupBits, background.cc), a round agrees
// on a group only whole (ResponseCache::CloseGroups), and a member withdrawn, late or changed
// takes the rest of its group with it (ResponseCache::WidenToGroups), so that each rank sends
// the coordinator a group's members in one batch, as the coordinator takes a group.
//
// Order. Every rank must run the same responses in the same order. Rank 0 sends response lists
// (of any set) only while it has no part of a round out (and at least after each round it
// completes, so a stream of rounds cannot starve them); each list carries the number of rounds
// rank 0 had completed (after_round), and a worker holds a list until it has completed that round
// itself. So every rank runs round k's responses, then the lists rank 0 sent after round k, then
// round k+1's. At the completion of a round every rank has applied the same lists, so its cache
// is at the epoch rank 0's part gives (checked: a difference is an internal error, not a silent
// divergence).
//
// Links. A worker's part goes to rank 0 over its control link and to the other workers over
// theirs (JobConnections::peers). A broken link between two workers is reported only if rank 0
// has not ended the job (shutdown, or a failure it relays) within kPeerLinkGrace: one worker may
// close its links at shutdown before another has read rank 0's shutdown message.
#include <algorithm>

#include "common/logging.h"
#include "engine/engine_impl.h"
#include "planner/fusion.h"

namespace hvd {

namespace {
constexpr auto kBitPatience = std::chrono::seconds(1);
constexpr auto kLateCheckEvery = std::chrono::milliseconds(100);
constexpr auto kPeerLinkGrace = std::chrono::seconds(2);
// The longest a part waits for the rest of a burst of tensors a caller is enqueuing, and the
// gap between two of its enqueues that ends the burst (at most the spin window; a loop that
// sleeps meanwhile wakes when it ends: BurstHoldRemaining).
constexpr auto kBurstHold = std::chrono::microseconds(200);
constexpr auto kBurstGap = std::chrono::microseconds(50);

constexpr uint64_t Mask(uint32_t bit) { return uint64_t{1} << (bit % 64); }

void TrimZeros(std::vector<uint64_t>* v) {
  while (!v->empty() && v->back() == 0) v->pop_back();
}
}  // namespace

void EngineImpl::AnnounceBit(uint32_t bit, Clock::time_point now) {
  Rounds& r = *rounds_;
  r.ready[bit / 64] |= Mask(bit);
  r.since[bit] = now;
  r.fresh = true;
  r.announced_at = now;
  if (r.missing_count > 0 && (r.missing[bit / 64] & Mask(bit))) {
    r.missing[bit / 64] &= ~Mask(bit);
    --r.missing_count;
  }
}

// Whether this rank has news for a round: a bit announced or withdrawn since its last part, or
// (rank 0) its coordinator's news. While a round holds, announced bits are news only on a rank
// that lacked some of the others' bits in that round and now has them all: a round started
// before that would hold again, and each such round costs every rank a part. (Started on every
// batch the background thread drained while a caller enqueued a step, they were a ping-pong of
// parts in which the enqueuing callers lost their cores.) A rank that lacked nothing waits for
// the ranks that did, whose parts it answers with all it has, or for rank 0 to end the hold.
bool EngineImpl::PartHasNews() const {
  const Rounds& r = *rounds_;
  if (r.coordinator_news) return true;
  if (!r.fresh) return false;  // (a bit withdrawn here makes the row fresh too)
  if (!r.holding || (r.lacked && r.missing_count == 0)) return true;
  return std::any_of(r.withdraw.begin(), r.withdraw.end(), [](uint64_t w) { return w != 0; });
}

bool EngineImpl::RoundNews(Clock::time_point now) const {
  const Rounds& r = *rounds_;
  // Rank 0 ends a hold that has lasted kStragglerHold: its next part does not allow it.
  const bool hold_over = coordinator() && r.holding && now - r.holding_since >= kStragglerHold;
  if (hold_over) return true;  // (not a cycle's wait more: autotune may have set one since)
  if (!PartHasNews()) return false;
  return CycleTimeMs() <= 0 || now - r.started >= CycleWindow();
}

bool EngineImpl::TryRounds() {
  Rounds& r = *rounds_;
  bool did = false;
  WithdrawLateBits(Clock::now());
  while (abort_.ok() && !done_) {
    if (!r.sent) {
      // Another rank's part of round done+1 is here: answer it at once. Once shutdown is
      // decided, no rank starts a round (RoundsLeftAtShutdown).
      if (r.have == 0 && (shutdown_by_ >= 0 || !RoundNews(Clock::now()))) {
        r.held_since = Clock::time_point();  // (no part to hold: no wake-up for it)
        break;
      }
      if (shutdown_by_ < 0 && HoldPartForBurst()) break;
      SendPart();
      did = true;
    }
    if (r.have < options_.size) break;
    Status s = CompleteRound();
    did = true;
    if (!s.ok()) {
      HVD_LOG(kError) << s.message();
      abort_ = s;  // the loop fails everything with it and tells rank 0, which tells everyone
      transport_->Abort(s);
      break;
    }
    // Between two rounds is where rank 0's lists go out: under a stream of rounds (another
    // rank's part arriving as the last completes) there is no other.
    if (coordinator()) CoordinatorStep();
  }
  return did;
}

// A step's tensors are enqueued one after another, tens of nanoseconds apart, and a background
// thread that is polling drains them in batches as they come. A part sent (or answered) after
// each batch would cut the step into rounds wherever the parts happened to go out, each round
// its own collective. While more tensors came since the last drain, or the last came less than
// kBurstGap ago (the caller between two enqueues: a vector growing, an interpreter's call,
// its core taken for a moment), the part waits instead (another rank's part too: the rest of
// the step would not be agreed without this rank), so that a step submitted at once is agreed
// in one round. A caller of this process that waits for an operation (in Handle::Wait or
// WaitFor, running the engine's work or not) ends the burst: the part goes at once, so a lone
// operation's part waits for nothing. A stream of enqueues that never pauses still sends a
// part every kBurstHold, so the first tensors run while the caller enqueues the rest.
bool EngineImpl::HoldPartForBurst() {
  Rounds& r = *rounds_;
  if (helper_->waiting.load(std::memory_order_relaxed) > 0 ||
      helper_->blocked.load(std::memory_order_relaxed) > 0) {
    return false;
  }
  const auto now = Clock::now();
  if (!queued_.load(std::memory_order_relaxed) && now >= BurstGapEnd()) return false;
  if (r.held_since == Clock::time_point()) r.held_since = now;
  return now - r.held_since < kBurstHold;
}

// Until when a pause between enqueues holds the part: kBurstGap (at most the spin window)
// after the last bit announced.
Clock::time_point EngineImpl::BurstGapEnd() const {
  return rounds_->announced_at + std::min<Clock::duration>(kBurstGap, spin_);
}

// How long until a part held for a burst goes (max(): none held). The loop that sleeps wakes
// then; a hold on queued_ never sleeps (the loop looks at queued_ first).
Clock::duration EngineImpl::BurstHoldRemaining(Clock::time_point now) const {
  const Rounds& r = *rounds_;
  if (r.sent || r.held_since == Clock::time_point()) return Clock::duration::max();
  const Clock::time_point end = std::min(r.held_since + kBurstHold, BurstGapEnd());
  return std::max(end - now, Clock::duration::zero());
}

void EngineImpl::SendPart() {
  Rounds& r = *rounds_;
  ProcessSetState& world = World();
  const auto now = Clock::now();
  RoundContribution c;
  c.round = r.done + 1;
  c.rank = options_.rank;
  c.cache_epoch = world.cache->epoch();
  c.ready = r.ready;
  TrimZeros(&c.ready);
  c.withdraw.swap(r.withdraw);
  r.withdraw.assign(r.ready.size(), 0);
  if (coordinator()) {
    c.fusion_threshold = FusionThreshold();
    c.knobs = Knobs();
    // A cycle time of the hold's length or more gathers a step's tensors already.
    // (Not once shutdown is decided: no round after this one runs what it would hold.)
    c.hold_uneven = shutdown_by_ < 0 && CycleWindow() < kStragglerHold &&
                    (!r.holding || now - r.holding_since < kStragglerHold);
    const Coordinator& co = *world.coordinator;
    if (co.any_joined()) {
      c.withdraw.assign(r.ready.size(), ~uint64_t{0});
    } else {
      if (!co.idle()) world.cache->SetBitsOf(co.PendingNames(), &c.withdraw);
      // And of names some rank owes (Coordinator::OwedNames): a late rank's bit pays its debt
      // there instead of being agreed on with the next step's.
      if (co.owes_any()) world.cache->SetBitsOf(co.OwedNames(), &c.withdraw);
    }
    r.coordinator_news = false;
  }
  TrimZeros(&c.withdraw);
  r.fresh = false;
  r.started = now;
  r.held_since = Clock::time_point();
  r.sent = true;
  if (options_.size > 1) {
    auto payload = Payload(Encode(c));
    const auto type = static_cast<uint8_t>(MessageType::kRound);
    if (coordinator()) {
      BroadcastControl(type, payload);
    } else {
      if (control_[0] && control_[0]->open()) control_[0]->Send(type, payload);
      for (auto& link : peers_) {
        if (link && link->open()) link->Send(type, payload);
      }
    }
    negotiation_messages_.fetch_add(1, std::memory_order_relaxed);
  }
  r.parts[options_.rank] = std::move(c);
  r.arrived[options_.rank] = now;
  ++r.have;
  CountNegotiation(now);  // making and sending the part
}

Status EngineImpl::OnRoundPart(int peer, const std::vector<uint8_t>& payload) {
  if (!rounds_) {
    return Status::InvalidArgument(
        "a round of the symmetric fast path, but this rank does not run it (its ranks are not "
        "all linked to each other)");
  }
  Rounds& r = *rounds_;
  const auto start = Clock::now();
  RoundContribution c;
  HVD_RETURN_IF_ERROR(Decode(payload.data(), payload.size(), &c));
  const std::string what = "part of round " + std::to_string(c.round) + " from rank " +
                           std::to_string(peer);
  if (c.rank != peer) {
    return Status::InvalidArgument(what + " names rank " + std::to_string(c.rank));
  }
  // (A part of the next round may come from a rank whose cache has given out more bits than
  // this one's: the capacity bounds it.)
  const size_t capacity = static_cast<size_t>(std::max(0, options_.cache_capacity));
  if (c.ready.size() > (capacity + 63) / 64 || c.withdraw.size() > (capacity + 63) / 64) {
    return Status::InvalidArgument(what + ": more bits than the response cache holds (" +
                                   std::to_string(capacity) + ", HVD_CACHE_CAPACITY)");
  }
  std::optional<RoundContribution>* slot = nullptr;
  if (c.round == r.done + 1) slot = &r.parts[peer];
  if (c.round == r.done + 2) slot = &r.early[peer];
  if (slot == nullptr) {
    return Status::InvalidArgument(what + ", but this rank has completed " +
                                   std::to_string(r.done) + " rounds");
  }
  if (slot->has_value()) return Status::InvalidArgument("a second " + what);
  const bool current = c.round == r.done + 1;
  (current ? r.arrived : r.early_arrived)[peer] = start;
  *slot = std::move(c);
  if (current) ++r.have;
  CountNegotiation(start);  // TryRounds counts its own
  TryRounds();
  return Status::OK();
}

Status EngineImpl::CompleteRound() {
  const auto start = Clock::now();
  Rounds& r = *rounds_;
  ResponseCache& cache = *World().cache;
  const uint64_t epoch = cache.epoch();
  const uint64_t round = r.done + 1;
  const RoundContribution& zero = *r.parts[0];
  if (zero.cache_epoch != epoch) {
    return Status::Internal("round " + std::to_string(round) + " of the fast path: rank 0 was at "
                            "response-cache epoch " + std::to_string(zero.cache_epoch) +
                            ", rank " + std::to_string(options_.rank) + " is at " +
                            std::to_string(epoch));
  }
  // A part from an older epoch: only its bits whose entry has not changed since mean the same.
  auto valid = [&cache, epoch](const RoundContribution& c, size_t w, uint64_t word) {
    if (c.cache_epoch == epoch) return word;
    uint64_t keep = 0;
    for (uint64_t x = word; x; x &= x - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(x));
      if (cache.UnchangedSince(bit, c.cache_epoch)) keep |= Mask(bit);
    }
    return keep;
  };
  const size_t words = r.ready.size();
  // agreed: announced by every rank; anyone: by some rank.
  std::vector<uint64_t> agreed(words, ~uint64_t{0}), anyone(words, 0), out(words, 0);
  for (int q = 0; q < options_.size; ++q) {
    const RoundContribution& c = *r.parts[q];
    if (c.cache_epoch > epoch) {
      return Status::Internal("round " + std::to_string(round) + " of the fast path: rank " +
                              std::to_string(q) + " was at response-cache epoch " +
                              std::to_string(c.cache_epoch) + ", past rank 0's " +
                              std::to_string(epoch));
    }
    for (size_t w = 0; w < words; ++w) {
      const uint64_t ready = w < c.ready.size() ? valid(c, w, c.ready[w]) : 0;
      agreed[w] &= ready;
      anyone[w] |= ready;
      if (w < c.withdraw.size()) out[w] |= valid(c, w, c.withdraw[w]);
    }
    if (timeline_->enabled()) {  // each rank's readiness as its part came (a tick per rank)
      for (size_t w = 0; w < c.ready.size(); ++w) {
        for (uint64_t x = valid(c, w, c.ready[w]); x; x &= x - 1) {
          const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(x));
          if (const Request* req = cache.At(bit)) {
            timeline_->RankReady(kGlobalProcessSet, req->name, OpTypeName(req->type), q,
                                 r.arrived[q]);
          }
        }
      }
    }
  }
  // A withdrawn member takes its group with it, so that each rank sends the coordinator the
  // group's members in one batch (every rank alike, from its cache at this epoch).
  cache.WidenToGroups(&out);
  for (size_t w = 0; w < words; ++w) agreed[w] &= ~out[w];
  // A group runs whole: its members wait while one of them is not agreed (every rank alike,
  // from its cache at this epoch).
  cache.CloseGroups(&agreed);
  bool any = false, uneven = false;
  for (size_t w = 0; w < words; ++w) {
    any = any || agreed[w] != 0;
    uneven = uneven || (anyone[w] & ~out[w]) != agreed[w];
  }
  // The hold: while some rank has announced a bit another has not, its step is still arriving
  // there (its caller part of the way through enqueuing it, or waiting for a core), and what
  // every rank announced would run as a collective of its own with the rest in another after
  // it. So, while rank 0's part allows it, the round agrees on nothing and the bits stay
  // announced; a later round agrees on them with the rest of the step, or once rank 0 ends the
  // hold (after kStragglerHold, as AgreedGoAt holds where rank 0 answers). Every rank decides
  // alike from the same parts.
  const bool hold = any && uneven && zero.hold_uneven;
  if (hold) {
    std::fill(agreed.begin(), agreed.end(), 0);
    any = false;
    if (!r.holding) r.holding_since = start;
  }
  r.holding = hold;
  // This rank's row: agreed bits leave it, withdrawn ones go to the coordinator.
  std::vector<Request> leaving;
  for (size_t w = 0; w < words; ++w) {
    r.ready[w] &= ~agreed[w];
    for (uint64_t x = r.ready[w] & out[w]; x; x &= x - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(x));
      if (const Request* q = cache.At(bit)) leaving.push_back(*q);
    }
    r.ready[w] &= ~out[w];
  }
  // What this rank's part lacked of the others' bits (not what its row lacks now: bits it
  // announced after its part went out make it the rank that starts the next round), and of
  // that what it has not announced since.
  const RoundContribution& mine = *r.parts[options_.rank];
  r.missing_count = 0;
  r.lacked = false;
  for (size_t w = 0; hold && w < words; ++w) {
    const uint64_t own = w < mine.ready.size() ? valid(mine, w, mine.ready[w]) : 0;
    const uint64_t lacked = anyone[w] & ~out[w] & ~own;
    r.lacked = r.lacked || lacked != 0;
    r.missing[w] = lacked & ~r.ready[w];
    r.missing_count += static_cast<size_t>(__builtin_popcountll(r.missing[w]));
  }
  if (!hold) std::fill(r.missing.begin(), r.missing.end(), 0);
  const size_t threshold = zero.fusion_threshold;
  const PlanKnobs knobs = zero.knobs;
  r.done = round;
  r.sent = false;
  r.parts.swap(r.early);
  r.arrived.swap(r.early_arrived);
  r.have = 0;
  for (auto& p : r.early) p.reset();
  for (const auto& p : r.parts) r.have += p.has_value() ? 1 : 0;
  if (any) {
    const auto rebuild = Clock::now();
    size_t bytes = 0;
    auto step = StepResponses(World(), agreed, threshold, knobs, &bytes);
    if (!step) {
      return Status::InvalidArgument("round " + std::to_string(round) +
                                     " of the fast path agreed on an empty response-cache bit");
    }
    cache.Apply(*step);  // every rank alike: the epoch moves with a round that agreed
    FitBits(World());
    CountBookkeeping(Clock::now() - rebuild);
    if (autotune_) {
      autotune_->Record(bytes, Clock::now());
      ReportAutotune();
    }
    QueueStep(step);
  }
  if (!leaving.empty()) SendToCoordinator(std::move(leaving));
  // The lists rank 0 sent after this round.
  while (!r.held.empty() && r.held.front().after_round <= r.done) {
    ResponseList list = std::move(r.held.front());
    r.held.pop_front();
    HVD_RETURN_IF_ERROR(OnResponses(std::move(list)));
  }
  CountNegotiation(start);
  return Status::OK();
}

// Shutdown at a round boundary. Some rank may have run a round that this rank has not
// completed: a worker whose part reached every rank runs it as soon as it holds every part, and
// may then call shutdown before the others have theirs. So, once shutdown is decided, rank 0
// finishes the round under way (one whose part it sent, or answers: every rank then sends its
// part, so every part comes) and starts none, then tells the workers how many rounds it
// completed; a worker completes those (every rank sent its part of each) before it stops, and
// no more (a later one lacks rank 0's part). Bounded by HVD_TIMEOUT_SECONDS, should a rank
// have died meanwhile.
bool EngineImpl::RoundsLeftAtShutdown() {
  if (!rounds_ || !abort_.ok() || options_.size == 1) return false;
  const Rounds& r = *rounds_;
  const bool left = coordinator() ? r.sent || r.have > 0 : r.done < shutdown_after_round_;
  if (!left) return false;
  if (shutdown_rounds_deadline_ == NoDeadline()) {
    shutdown_rounds_deadline_ = DeadlineAfterSeconds(options_.timeout_seconds);
  }
  if (Clock::now() < shutdown_rounds_deadline_) return true;
  HVD_LOG(kWarning) << "shutdown: round " << r.done + 1
                    << " of the fast path did not complete in time; stopping without it";
  return false;
}

void EngineImpl::OnCacheChanged(const std::vector<std::pair<uint32_t, Request>>& changed) {
  Rounds& r = *rounds_;
  // No rank announces bits at an older epoch to rank 0 here: its history of evictions is unused.
  if (coordinator()) World().cache->PruneHistory(World().cache->epoch());
  std::vector<Request> leaving;
  std::vector<std::string> groups;  // of the changed entries this rank had announced
  for (const auto& [bit, was] : changed) {
    // Every rank applies the same list, so every rank holding this bit lets it go here too.
    r.withdraw[bit / 64] &= ~Mask(bit);
    if (r.missing[bit / 64] & Mask(bit)) {  // no rank's caller announces the old entry now
      r.missing[bit / 64] &= ~Mask(bit);
      --r.missing_count;
    }
    if (!(r.ready[bit / 64] & Mask(bit))) continue;
    r.ready[bit / 64] &= ~Mask(bit);
    leaving.push_back(was);
    if (was.group_size > 1) groups.push_back(was.group);
  }
  if (!groups.empty()) {
    // The rest of their groups go with them, in the same batch (every rank that announced
    // them applies the same list and does the same).
    std::vector<uint64_t> members(r.ready.size(), 0);
    World().cache->WidenToGroups(&members, groups);
    for (size_t w = 0; w < members.size(); ++w) {
      for (uint64_t x = members[w] & r.ready[w]; x; x &= x - 1) {
        const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(x));
        r.ready[w] &= ~Mask(bit);
        if (const Request* q = World().cache->At(bit)) leaving.push_back(*q);
      }
    }
  }
  if (!leaving.empty()) SendToCoordinator(std::move(leaving));
}

void EngineImpl::WithdrawLateBits(Clock::time_point now) {
  Rounds& r = *rounds_;
  // Not while this rank's part is out: the round may still agree on a bit the part holds (the
  // late rank's part, with the bit, on its way), which would then run on the fast path while
  // its request waited at the coordinator. Checked again once the round completes.
  if (r.sent) return;
  if (now - r.checked < kLateCheckEvery) return;
  r.checked = now;
  const ResponseCache& cache = *World().cache;
  std::vector<uint64_t> late(r.ready.size(), 0);
  bool any = false;
  for (size_t w = 0; w < r.ready.size(); ++w) {
    for (uint64_t x = r.ready[w]; x; x &= x - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(x));
      if (now - r.since[bit] <= kBitPatience) continue;
      late[w] |= Mask(bit);
      any = true;
    }
  }
  if (!any) return;
  cache.WidenToGroups(&late);  // a late member's group goes with it, in one batch
  std::vector<Request> leaving;
  for (size_t w = 0; w < r.ready.size(); ++w) {
    for (uint64_t x = late[w] & r.ready[w]; x; x &= x - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(x));
      r.ready[w] &= ~Mask(bit);
      r.withdraw[w] |= Mask(bit);
      if (const Request* q = cache.At(bit)) leaving.push_back(*q);
    }
  }
  if (leaving.empty()) return;
  r.fresh = true;
  SendToCoordinator(std::move(leaving));
}

void EngineImpl::SendToCoordinator(std::vector<Request> requests) {
  for (auto& q : requests) q.process_set = kGlobalProcessSet;
  ProcessSetState& world = World();
  if (coordinator()) {
    AddFull(world, world.rank, std::move(requests));
    return;
  }
  RequestList list;  // no bits: rank 0 reads no epoch (OnRequests)
  list.process_set = kGlobalProcessSet;
  list.requests = std::move(requests);
  if (control_[0] && control_[0]->open()) {
    control_[0]->Send(static_cast<uint8_t>(MessageType::kRequests), Payload(Encode(list)));
  }
  negotiation_messages_.fetch_add(1, std::memory_order_relaxed);
}

void EngineImpl::OnPeerLinkError(int peer, const std::string& what) {
  Rounds* r = rounds_.get();
  if (r == nullptr || r->broken_peer >= 0) return;
  r->broken_peer = peer;
  r->broken_what = what;
  r->broken_at = Clock::now();
}

void EngineImpl::CheckPeerLinks() {
  const Rounds& r = *rounds_;
  if (r.broken_peer < 0 || shutdown_by_ >= 0 || done_ || !abort_.ok()) return;
  if (Clock::now() - r.broken_at < kPeerLinkGrace) return;
  abort_ = Status::PeerLost("rank " + std::to_string(r.broken_peer) +
                            " lost: link between workers: " + r.broken_what);
  HVD_LOG(kError) << abort_.message();
  transport_->Abort(abort_);
}

}  // namespace hvd
