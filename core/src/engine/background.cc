// The background thread: negotiation traffic, the coordinator step and the execution order.
// The protocol is described in coordinator/coordinator.h; the threads in engine_impl.h.
#include <cstring>
#include <sstream>

#include "common/logging.h"
#include "engine/engine_impl.h"

namespace hvd {

namespace {
constexpr auto kIdleTick = std::chrono::milliseconds(100);

std::shared_ptr<const std::vector<uint8_t>> Payload(std::vector<uint8_t> v) {
  return std::make_shared<const std::vector<uint8_t>>(std::move(v));
}

std::vector<uint8_t> IntPayload(int v) {
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), &v, 4);
  return out;
}
}  // namespace

void EngineImpl::Loop() {
  while (!done_) {
    bool worked = DrainQueue();
    if (!abort_.ok()) {
      FailAll(abort_);
      break;
    }
    if (coordinator_) CoordinatorStep();
    while (!to_execute_.empty() && abort_.ok()) {
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
    if (worked) continue;
    if (io_.stopped()) io_.restart();
    io_.run_one_for(kIdleTick);
    if (io_.stopped()) io_.restart();
    io_.poll();
  }
  done_ = true;
}

bool EngineImpl::DrainQueue() {
  std::deque<TensorEntry> batch;
  bool shutdown;
  wake_posted_.store(false);
  {
    std::lock_guard<std::mutex> l(mu_);
    batch.swap(queue_);
    shutdown = shutdown_requested_;
  }
  std::vector<Request> requests;
  for (auto& e : batch) {
    if (e.raw) {
      // Benchmark hook: every rank runs it at the same point, without negotiation.
      Status s = e.raw(*transport_, scratch_);
      if (!s.ok() && s.code() != StatusCode::kInvalidArgument) abort_ = s;
      {
        std::lock_guard<std::mutex> l(mu_);
        in_flight_.erase(e.request.name);
      }
      e.handle->Complete(s);
      continue;
    }
    if (options_.size == 1 && e.request.type == OpType::kJoin) joined_ = true;
    if (e.request.type == OpType::kJoin) joined_ = true;
    requests.push_back(e.request);
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
    coordinator_->AddRequests(options_.rank, std::move(requests));
    return;
  }
  RequestList list{std::move(requests)};
  control_[0]->Send(static_cast<uint8_t>(MessageType::kRequests), Payload(Encode(list)));
}

void EngineImpl::CoordinatorStep() {
  coordinator_->CheckStalls(Clock::now());
  std::vector<Response> ready = coordinator_->ComputeResponses();
  if (ready.empty()) return;
  if (options_.size > 1) {
    ResponseList list{ready};
    BroadcastControl(static_cast<uint8_t>(MessageType::kResponses), Payload(Encode(list)));
  }
  for (auto& r : ready) to_execute_.push_back(std::move(r));
}

void EngineImpl::BroadcastControl(uint8_t type, std::shared_ptr<const std::vector<uint8_t>> p) {
  for (auto& c : control_) {
    if (c && c->open()) c->Send(type, p);
  }
}

void EngineImpl::OnControlMessage(int peer, uint8_t type, std::vector<uint8_t>&& payload) {
  auto mt = static_cast<MessageType>(type);
  if (mt == MessageType::kRequests && coordinator_) {
    RequestList list;
    Status s = Decode(payload.data(), payload.size(), &list);
    if (!s.ok()) return OnControlError(peer, s.message());
    coordinator_->AddRequests(peer, std::move(list.requests));
  } else if (mt == MessageType::kResponses && !coordinator_) {
    ResponseList list;
    Status s = Decode(payload.data(), payload.size(), &list);
    if (!s.ok()) return OnControlError(peer, s.message());
    for (auto& r : list.responses) to_execute_.push_back(std::move(r));
  } else if (mt == MessageType::kShutdown && payload.size() == 4) {
    int by;
    std::memcpy(&by, payload.data(), 4);
    if (shutdown_by_ < 0) shutdown_by_ = (by >= 0 && by < options_.size) ? by : peer;
  } else if (mt == MessageType::kAbort) {
    std::string why(payload.begin(), payload.end());
    Status s = Status::PeerLost(why);
    if (coordinator_) {
      // A worker saw the communicator break: tell everyone else.
      BroadcastControl(type, Payload(std::move(payload)));
    }
    if (abort_.ok()) abort_ = s;
    transport_->Abort(abort_);
  } else {
    OnControlError(peer, "unexpected control message type " + std::to_string(type));
  }
}

void EngineImpl::OnControlError(int peer, const std::string& what) {
  if (shutdown_by_ >= 0 || done_) return;  // connections close as the job ends
  std::ostringstream os;
  if (coordinator_) {
    os << "rank " << peer << " lost: control connection: " << what;
  } else {
    os << "rank 0 (the coordinator) lost: control connection: " << what;
  }
  Status s = Status::PeerLost(os.str());
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
    if (io_.stopped()) io_.restart();
    io_.run_one_for(std::chrono::milliseconds(50));
  }
}

}  // namespace hvd
