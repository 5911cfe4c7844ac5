// The background thread: negotiation traffic, the coordinator step and the execution order.
// The protocol is described in coordinator/coordinator.h; the threads in engine_impl.h.
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/logging.h"
#include "engine/engine_impl.h"

namespace hvd {

namespace {
constexpr auto kIdleTick = std::chrono::milliseconds(100);
// While it spins with every control link polled in memory, how often the background thread
// also polls the io_context (a syscall).
constexpr auto kIoPollEvery = std::chrono::microseconds(20);

std::shared_ptr<const std::vector<uint8_t>> Payload(std::vector<uint8_t> v) {
  return std::make_shared<const std::vector<uint8_t>>(std::move(v));
}

std::vector<uint8_t> IntPayload(int v) {
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), &v, 4);
  return out;
}
}  // namespace

// No exception leaves this thread: one that escapes the loop (a failed allocation in a message,
// a framework's callback) stops the engine the way a lost peer does, with every operation
// failing with Internal and the others told, instead of ending the process.
void EngineImpl::Loop() {
  for (int escapes = 0; escapes < 3; ++escapes) {
    try {
      RunLoop();
      break;
    } catch (...) {
      Status s = Status::Internal("rank " + std::to_string(options_.rank) +
                                  ": hvd's background thread stopped on an exception: " +
                                  ExceptionMessage(std::current_exception()));
      HVD_LOG(kError) << s.message();
      if (abort_.ok()) abort_ = s;  // RunLoop fails everything with it and returns
    }
  }
  done_ = true;
  timeline_.reset();  // writes the file
}

void EngineImpl::RunLoop() {
  while (!done_) {
    bool worked = DrainQueue();
    if (!abort_.ok()) {
      FailAll(abort_);
      break;
    }
    if (coordinator_) CoordinatorStep();
    while (!to_execute_.empty() && abort_.ok()) {
      StopPolling();  // peers ring while the collective waits
      Response r = std::move(to_execute_.front());
      to_execute_.pop_front();
      Execute(r);
      worked = true;
    }
    if (!abort_.ok()) continue;  // fails everything at the top of the loop
    if (shutdown_by_ < 0 && shutdown_sent_ && Clock::now() > shutdown_deadline_) {
      HVD_LOG(kWarning) << "no answer from rank 0 to shutdown; closing anyway";
      shutdown_by_ = options_.rank;
    }
    if (shutdown_by_ >= 0) {
      FinishShutdown(shutdown_by_);
      break;
    }
    if (worked) {
      // A stream of work (a caller enqueuing many tensors) must not starve the control
      // plane: the peers' announcements are read between batches.
      last_work_ = Clock::now();
      if (poller_) poller_->Poll();
      if (control_over_tcp_ || last_work_ - io_polled_ >= kIoPollEvery) {
        io_polled_ = last_work_;
        if (io_.stopped()) io_.restart();
        io_.poll();
      }
      continue;
    }
    if (io_.stopped()) io_.restart();
    // Right after work the next message (a response, the peer's data) or the caller's next
    // operation is usually microseconds away: poll for it (yielding the core) before sleeping
    // in the kernel. The queue is looked at without a syscall (Wake()).
    const auto now = Clock::now();
    if (spin_.count() > 0 && now - last_work_ < spin_) {
      if (queued_.load()) continue;
      if (poller_) {
        if (!polling_) poller_->SetPolling(polling_ = true);
        if (poller_->Poll()) continue;
      }
      // TCP control links are read by the io_context: poll it every round. With every link in
      // memory, only timers and the rest need it now and then. Yield every round: the thread
      // that will answer may be waiting for this core.
      if (control_over_tcp_ || now - io_polled_ >= kIoPollEvery) {
        io_polled_ = now;
        if (io_.poll() > 0) continue;
      }
      sched_yield();
      continue;
    }
    if (polling_) {
      // Peers ring from here on; what they sent before they saw the flag down is read now.
      StopPolling();
      if (poller_->Poll()) continue;
    }
    Clock::duration sleep = kIdleTick;
    if (auto left = CycleRemaining(); left > Clock::duration::zero()) sleep = std::min(sleep, left);
    sleeping_.store(true);
    if (!queued_.load()) io_.run_one_for(sleep);
    sleeping_.store(false);
    if (io_.stopped()) io_.restart();
    io_.poll();
  }
}

void EngineImpl::StopPolling() {
  if (!polling_) return;
  polling_ = false;
  poller_->SetPolling(false);
}

bool EngineImpl::DrainQueue() {
  std::deque<TensorEntry> batch;
  bool shutdown;
  queued_.store(false);
  wake_posted_.store(false);
  {
    std::lock_guard<std::mutex> l(mu_);
    batch.swap(queue_);
    shutdown = shutdown_requested_;
  }
  std::vector<Request> requests;
  for (auto& e : batch) {
    if (e.raw) {
      StopPolling();
      // Benchmark hook: every rank runs it at the same point, without negotiation.
      Status s = e.raw(*transport_, scratch_);
      if (!s.ok() && s.code() != StatusCode::kInvalidArgument) abort_ = s;
      CompleteEntry(e, s);
      continue;
    }
    if (e.request.type == OpType::kJoin) joined_ = true;
    requests.push_back(e.request);
    timeline_->Negotiate(e.request.name);
    std::string name = e.request.name;
    pending_.emplace(name, std::move(e));
  }
  if (!requests.empty()) Announce(std::move(requests));
  if (shutdown && !shutdown_sent_) {
    shutdown_sent_ = true;
    shutdown_deadline_ = DeadlineAfterSeconds(options_.timeout_seconds);
    if (options_.rank == 0 || options_.size == 1) {
      shutdown_by_ = options_.rank;
    } else if (control_[0] && control_[0]->open()) {
      control_[0]->Send(static_cast<uint8_t>(MessageType::kShutdown),
                        Payload(IntPayload(options_.rank)));
    } else {
      shutdown_by_ = options_.rank;
    }
  }
  return !batch.empty();
}

void EngineImpl::Announce(std::vector<Request> requests) {
  if (coordinator_) {
    std::vector<Request> full;
    for (auto& r : requests) {
      const int bit = cache_->Lookup(r);
      if (bit >= 0) {
        cache_hits_.fetch_add(1);
        OfferBit(options_.rank, static_cast<uint32_t>(bit));
      } else {
        full.push_back(std::move(r));
      }
    }
    if (!full.empty()) AddFull(options_.rank, std::move(full));
    return;
  }
  // Fast path: tensors whose request is cached travel as bits of a bit vector.
  RequestList list;
  list.cache_epoch = cache_->epoch();
  for (auto& r : requests) {
    int bit = cache_->Lookup(r);
    if (bit < 0) {
      list.requests.push_back(std::move(r));
      continue;
    }
    size_t word = static_cast<size_t>(bit) / 64;
    if (list.cached_bits.size() <= word) list.cached_bits.resize(word + 1, 0);
    list.cached_bits[word] |= uint64_t{1} << (bit % 64);
    cache_hits_.fetch_add(1);
  }
  control_[0]->Send(static_cast<uint8_t>(MessageType::kRequests), Payload(Encode(list)));
}

// Bits announced at rank 0's current epoch mean what its cache says now: they join the fast
// path. Bits from an older epoch (a response list crossed the announcement) are decoded as they
// were then and go to the coordinator.
Status EngineImpl::OnRequests(int peer, RequestList&& list) {
  if (list.cache_epoch > cache_->epoch()) {
    return Status::InvalidArgument("request list from a future cache epoch");
  }
  const bool current = list.cache_epoch == cache_->epoch();
  for (size_t w = 0; w < list.cached_bits.size(); ++w) {
    for (uint64_t word = list.cached_bits[w]; word; word &= word - 1) {
      uint32_t bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(word));
      if (current && cache_->At(bit)) {
        OfferBit(peer, bit);
        continue;
      }
      Request r;
      if (!cache_->Decode(bit, list.cache_epoch, &r)) {
        return Status::InvalidArgument("unknown response-cache bit " + std::to_string(bit));
      }
      list.requests.push_back(std::move(r));
    }
  }
  worker_epochs_[peer] = std::max(worker_epochs_[peer], list.cache_epoch);
  uint64_t oldest = cache_->epoch();
  for (int r = 1; r < options_.size; ++r) oldest = std::min(oldest, worker_epochs_[r]);
  cache_->PruneHistory(oldest);
  if (!list.requests.empty()) AddFull(peer, std::move(list.requests));
  return Status::OK();
}

// ---------------------------------------------------------------- the fast path (rank 0)
//
// A cached tensor that a rank announces at rank 0's cache epoch is one bit in that rank's row
// of ready_bits_. The tensors every rank has announced are one AND over the rows: rank 0 sends
// that bit vector (with its fusion threshold) in the next response list, and every rank, rank 0
// included, builds the responses from its own cache, in bit order, fused alike. Rank 0 never
// turns those bits into requests, so a step of cached tensors costs it the same bit operations
// whatever their number. A name is on one path at a time: when the coordinator holds a request
// for it (a first or changed request, a join), its bits are turned into requests and go there
// too (DemoteBit); so do bits that wait longer than kBitPatience (a rank is late: the
// coordinator's stall inspector then names it) and bits whose cache entry a response list is
// about to change.

namespace {
constexpr auto kBitPatience = std::chrono::seconds(1);
}  // namespace

void EngineImpl::OfferBit(int rank, uint32_t bit) {
  const Request* r = cache_->At(bit);
  if (r == nullptr) return;  // checked by the caller
  if (coordinator_->any_joined() || coordinator_->Has(r->name)) {
    coordinator_->AddRequests(rank, {*r});
    return;
  }
  ready_bits_[rank][bit / 64] |= uint64_t{1} << (bit % 64);
  if (bit_since_[bit] == Clock::time_point()) bit_since_[bit] = Clock::now();
  bits_changed_ = true;
}

void EngineImpl::AddFull(int rank, std::vector<Request> requests) {
  for (const auto& r : requests) {
    if (r.type == OpType::kJoin) {
      for (size_t bit = 0; bit < bit_since_.size(); ++bit) DemoteBit(static_cast<uint32_t>(bit));
    } else if (int bit = cache_->SlotOf(r.name); bit >= 0) {
      DemoteBit(static_cast<uint32_t>(bit));
    }
  }
  coordinator_->AddRequests(rank, std::move(requests));
}

void EngineImpl::DemoteBit(uint32_t bit, const Request* as) {
  if (bit >= bit_since_.size() || bit_since_[bit] == Clock::time_point()) return;
  bit_since_[bit] = Clock::time_point();
  Request r;
  if (as) {
    r = *as;
  } else if (!cache_->Decode(bit, cache_->epoch(), &r)) {
    return;
  }
  const uint64_t mask = uint64_t{1} << (bit % 64);
  for (int q = 0; q < options_.size; ++q) {
    uint64_t& word = ready_bits_[q][bit / 64];
    if (!(word & mask)) continue;
    word &= ~mask;
    coordinator_->AddRequests(q, {r});
  }
}

std::vector<uint64_t> EngineImpl::AgreedBits() const {
  std::vector<uint64_t> agreed = ready_bits_[0];
  for (int q = 1; q < options_.size; ++q) {
    for (size_t w = 0; w < agreed.size(); ++w) agreed[w] &= ready_bits_[q][w];
  }
  const bool any = std::any_of(agreed.begin(), agreed.end(), [](uint64_t w) { return w != 0; });
  if (!any) agreed.clear();
  return agreed;
}

std::vector<uint64_t> EngineImpl::AgreeOnBits() {
  std::vector<uint64_t> agreed = AgreedBits();
  for (size_t w = 0; w < agreed.size(); ++w) {
    for (auto& row : ready_bits_) row[w] &= ~agreed[w];
    for (uint64_t word = agreed[w]; word; word &= word - 1) {
      bit_since_[w * 64 + __builtin_ctzll(word)] = Clock::time_point();
    }
  }
  return agreed;
}

void EngineImpl::DemoteLateBits(Clock::time_point now) {
  if (now - bits_checked_ < std::chrono::milliseconds(100)) return;
  bits_checked_ = now;
  for (size_t bit = 0; bit < bit_since_.size(); ++bit) {
    if (bit_since_[bit] != Clock::time_point() && now - bit_since_[bit] > kBitPatience) {
      DemoteBit(static_cast<uint32_t>(bit));
    }
  }
}

Status EngineImpl::OnResponses(ResponseList&& list) {
  for (auto& r : list.responses) {
    if (!r.cache_bits.empty()) {
      std::vector<uint32_t> bits = std::move(r.cache_bits);
      if (!cache_->Rebuild(bits, &r)) {
        return Status::InvalidArgument("response names an empty response-cache bit");
      }
    }
    HVD_RETURN_IF_ERROR(CheckResponse(r, options_.size));
  }
  if (!list.ready_bits.empty()) {
    std::vector<Response> cached;
    if (!cache_->RebuildAll(list.ready_bits, list.fusion_threshold, &cached)) {
      return Status::InvalidArgument("ready bits name an empty response-cache bit");
    }
    for (auto& r : cached) list.responses.push_back(std::move(r));
  }
  cache_->Apply(list.responses);
  for (auto& r : list.responses) to_execute_.push_back(std::move(r));
  return Status::OK();
}

Clock::duration EngineImpl::CycleWindow() const {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(options_.cycle_time_ms));
}

// When responses wait for HVD_CYCLE_TIME to gather more tensors to fuse, how long until the
// coordinator's go (CoordinatorStep also sleeps no longer than that for agreed bits).
Clock::duration EngineImpl::CycleRemaining() const {
  if (!coordinator_ || options_.cycle_time_ms <= 0) return Clock::duration::zero();
  Clock::duration left = Clock::duration::max();
  if (coordinator_->has_ready()) left = coordinator_->ready_since() + CycleWindow() - Clock::now();
  if (agreed_since_ != Clock::time_point()) {
    left = std::min(left, agreed_since_ + CycleWindow() - Clock::now());
  }
  if (left == Clock::duration::max()) return Clock::duration::zero();
  return left > Clock::duration::zero() ? left : Clock::duration::zero();
}

// One response list: the coordinator's responses (after HVD_CYCLE_TIME), then the cached
// tensors every rank has announced (at once).
void EngineImpl::CoordinatorStep() {
  const auto now = Clock::now();
  coordinator_->CheckStalls(now);
  DemoteLateBits(now);
  std::vector<Response> ready;
  if (!coordinator_->has_ready() ||
      coordinator_->ready_since() + CycleWindow() <= now) {
    ready = coordinator_->ComputeResponses();
  }
  // Agreed bits wait HVD_CYCLE_TIME too, from when the first became agreed.
  if (bits_changed_) {
    bits_changed_ = false;
    if (agreed_since_ == Clock::time_point() && !AgreedBits().empty()) agreed_since_ = now;
  }
  std::vector<uint64_t> agreed;
  if (agreed_since_ != Clock::time_point() && now - agreed_since_ >= CycleWindow()) {
    agreed = AgreeOnBits();
    agreed_since_ = Clock::time_point();
  }
  if (ready.empty() && agreed.empty()) return;
  if (options_.size > 1) {
    ResponseList wire;
    for (const auto& r : ready) {
      Response w;
      if (cache_->Encodable(r, &w.cache_bits)) {
        cache_hits_.fetch_add(1);
      } else {
        w = r;
      }
      wire.responses.push_back(std::move(w));
    }
    wire.ready_bits = agreed;
    wire.fusion_threshold = options_.fusion_threshold_bytes;
    BroadcastControl(static_cast<uint8_t>(MessageType::kResponses), Payload(Encode(wire)));
  }
  if (!agreed.empty()) {
    std::vector<Response> cached;
    cache_->RebuildAll(agreed, options_.fusion_threshold_bytes, &cached);
    for (auto& r : cached) ready.push_back(std::move(r));
  }
  ApplyOnRankZero(ready);
  for (auto& r : ready) to_execute_.push_back(std::move(r));
}

// Applying a list may give a bit to another tensor: bits still waiting on such an entry go to
// the coordinator as the requests they meant.
void EngineImpl::ApplyOnRankZero(const std::vector<Response>& list) {
  std::vector<std::pair<uint32_t, Request>> waiting;
  for (size_t w = 0; w < ready_bits_[0].size(); ++w) {
    uint64_t any = 0;
    for (const auto& row : ready_bits_) any |= row[w];
    for (; any; any &= any - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(any));
      Request r;
      if (cache_->Decode(bit, cache_->epoch(), &r)) waiting.emplace_back(bit, std::move(r));
    }
  }
  cache_->Apply(list);
  for (const auto& [bit, r] : waiting) {
    if (cache_->Lookup(r) != static_cast<int>(bit)) DemoteBit(bit, &r);
  }
}

void EngineImpl::BroadcastControl(uint8_t type, std::shared_ptr<const std::vector<uint8_t>> p) {
  for (auto& c : control_) {
    if (c && c->open()) c->Send(type, p);
  }
}

// Liveness: every background thread sends a heartbeat on its control connections each
// interval, from a timer that also fires inside long collectives (they run io_). A peer silent
// for longer than HVD_TIMEOUT_SECONDS (stopped, hung, unreachable) fails the job with Timeout
// naming it, so no rank waits forever on a negotiation that cannot finish.
void EngineImpl::StartHeartbeat() {
  last_heard_.assign(control_.size(), Clock::now());
  heartbeat_ = std::make_unique<asio::steady_timer>(io_);
  OnHeartbeatTimer();
}

void EngineImpl::OnHeartbeatTimer() {
  if (done_ || !abort_.ok()) return;
  auto now = Clock::now();
  auto limit = std::chrono::duration<double>(options_.timeout_seconds);
  auto empty = Payload({});
  for (auto& c : control_) {
    if (!c || !c->open()) continue;
    if (now - last_heard_[c->peer()] > limit) {
      std::ostringstream os;
      os << "nothing heard for " << options_.timeout_seconds
         << " s (HVD_TIMEOUT_SECONDS): the process is stopped, hung or unreachable";
      return OnControlError(c->peer(), os.str(), StatusCode::kTimeout);
    }
    c->Send(static_cast<uint8_t>(MessageType::kHeartbeat), empty);
  }
  auto interval = std::min(std::chrono::duration<double>(1.0), limit / 4);
  heartbeat_->expires_after(std::chrono::duration_cast<Clock::duration>(interval));
  heartbeat_->async_wait([this](const asio::error_code& ec) {
    if (!ec) OnHeartbeatTimer();
  });
}

// A collective that broke because a survivor closed its connections names that survivor;
// the rank that saw the real loss tells the coordinator, which tells everyone. Wait briefly
// for that message so that every survivor reports the rank that was actually lost.
Status EngineImpl::AwaitRootCause(const Status& local) {
  auto limit = Clock::now() + std::chrono::seconds(1);
  while (abort_.ok() && Clock::now() < limit) {
    if (io_.stopped()) io_.restart();
    io_.run_one_for(std::chrono::milliseconds(50));
  }
  return abort_.ok() ? local : abort_;
}

void EngineImpl::OnControlMessage(int peer, uint8_t type, std::vector<uint8_t>&& payload) {
  auto mt = static_cast<MessageType>(type);
  if (peer >= 0 && static_cast<size_t>(peer) < last_heard_.size()) last_heard_[peer] = Clock::now();
  if (mt == MessageType::kHeartbeat) return;
  if (mt == MessageType::kRequests && coordinator_) {
    RequestList list;
    Status s = Decode(payload.data(), payload.size(), &list);
    if (s.ok()) s = OnRequests(peer, std::move(list));
    if (!s.ok()) return OnControlError(peer, s.message());
  } else if (mt == MessageType::kResponses && !coordinator_) {
    ResponseList list;
    Status s = Decode(payload.data(), payload.size(), &list);
    if (s.ok()) s = OnResponses(std::move(list));
    if (!s.ok()) return OnControlError(peer, s.message());
  } else if (mt == MessageType::kShutdown && payload.size() == 4) {
    int by;
    std::memcpy(&by, payload.data(), 4);
    if (shutdown_by_ < 0) shutdown_by_ = (by >= 0 && by < options_.size) ? by : peer;
  } else if (mt == MessageType::kAbort) {
    std::string why(payload.begin(), payload.end());
    if (!abort_.ok()) return;  // the first cause is the one reported
    if (coordinator_) {
      // A worker saw the communicator break: tell everyone else.
      BroadcastControl(type, Payload(std::move(payload)));
    }
    abort_ = Status::PeerLost(why);
    transport_->Abort(abort_);
  } else {
    OnControlError(peer, "unexpected control message type " + std::to_string(type));
  }
}

void EngineImpl::OnControlError(int peer, const std::string& what, StatusCode code) {
  if (shutdown_by_ >= 0 || done_) return;  // connections close as the job ends
  if (!abort_.ok()) return;                 // already failing for an earlier cause
  std::ostringstream os;
  if (coordinator_) {
    os << "rank " << peer << " lost: control connection: " << what;
  } else {
    os << "rank 0 (the coordinator) lost: control connection: " << what;
  }
  Status s(code, os.str());
  HVD_LOG(kError) << s.message();
  if (coordinator_) {
    std::string msg = s.message();
    BroadcastControl(static_cast<uint8_t>(MessageType::kAbort),
                     Payload(std::vector<uint8_t>(msg.begin(), msg.end())));
  }
  if (abort_.ok()) abort_ = s;
  transport_->Abort(abort_);
}

void EngineImpl::FailAll(const Status& status, bool notify) {
  if (notify && !coordinator_ && control_.size() == 1 && control_[0] && control_[0]->open()) {
    // Tell the coordinator, which relays it, so that every rank fails fast.
    std::string msg = status.message();
    control_[0]->Send(static_cast<uint8_t>(MessageType::kAbort),
                      Payload(std::vector<uint8_t>(msg.begin(), msg.end())));
  }
  transport_->Abort(status);
  std::deque<TensorEntry> queued;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (dead_.ok()) dead_ = status;
    queued.swap(queue_);
    in_flight_.clear();
  }
  for (auto& e : queued) e.handle->Complete(status);
  for (auto& kv : pending_) kv.second.handle->Complete(status);
  pending_.clear();
  to_execute_.clear();
  FlushControl(Clock::now() + std::chrono::seconds(2));
  for (auto& c : control_) {
    if (c) c->Close();
  }
}

void EngineImpl::FinishShutdown(int requested_by) {
  if (coordinator_ && options_.size > 1) {
    BroadcastControl(static_cast<uint8_t>(MessageType::kShutdown), Payload(IntPayload(requested_by)));
  }
  Status s = Status::Aborted("hvd has been shut down (rank " + std::to_string(requested_by) +
                             " called shutdown)");
  done_ = true;  // connection errors from here on are the job ending, not a lost peer
  FailAll(s, /*notify=*/false);
}

void EngineImpl::FlushControl(Deadline deadline) {
  auto busy = [this] {
    for (auto& c : control_) {
      if (c && c->open() && !c->idle()) return true;
    }
    return false;
  };
  while (busy() && Clock::now() < deadline) {
    if (poller_ && poller_->Poll()) continue;
    if (io_.stopped()) io_.restart();
    io_.run_one_for(std::chrono::milliseconds(poller_ ? 1 : 50));
  }
}

}  // namespace hvd
