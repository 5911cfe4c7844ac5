#include "inproc_transport.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

namespace hvd {
namespace test {

// ---- InProcWorld ----

InProcWorld::InProcWorld(int size, size_t pipe_capacity)
    : size_(size), dead_(new std::atomic<bool>[size]) {
  for (int i = 0; i < size * size; ++i) {
    pipes_.push_back(std::make_unique<Pipe>());
    pipes_.back()->data.resize(pipe_capacity);
  }
  for (int r = 0; r < size; ++r) {
    signals_.push_back(std::make_unique<Signal>());
    dead_[r].store(false);
  }
  for (int r = 0; r < size; ++r) transports_.push_back(std::make_unique<InProcTransport>(this, r));
}

InProcWorld::~InProcWorld() = default;

size_t InProcWorld::Pipe::Write(const uint8_t* src, size_t n) {
  const size_t cap = data.size();
  n = std::min(n, cap - used);
  const size_t tail = (head + used) % cap;
  const size_t first = std::min(n, cap - tail);
  std::memcpy(data.data() + tail, src, first);
  std::memcpy(data.data(), src + first, n - first);
  used += n;
  return n;
}

size_t InProcWorld::Pipe::Read(uint8_t* dst, size_t n) {
  const size_t cap = data.size();
  n = std::min(n, used);
  const size_t first = std::min(n, cap - head);
  std::memcpy(dst, data.data() + head, first);
  std::memcpy(dst + first, data.data(), n - first);
  head = (head + n) % cap;
  used -= n;
  return n;
}

uint64_t InProcWorld::Generation(int rank) {
  Signal& s = *signals_[rank];
  std::lock_guard<std::mutex> lock(s.mu);
  return s.generation;
}

bool InProcWorld::WaitForChange(int rank, uint64_t seen, Deadline deadline) {
  Signal& s = *signals_[rank];
  std::unique_lock<std::mutex> lock(s.mu);
  auto changed = [&] { return s.generation != seen; };
  if (deadline == Deadline::max()) {
    s.cv.wait(lock, changed);
    return true;
  }
  return s.cv.wait_until(lock, deadline, changed);
}

void InProcWorld::Notify(int rank) {
  Signal& s = *signals_[rank];
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.generation;
  }
  s.cv.notify_all();
}

void InProcWorld::KillRank(int rank) {
  dead_[rank].store(true);
  int none = -1;
  lost_rank_.compare_exchange_strong(none, rank);
  for (int r = 0; r < size_; ++r) Notify(r);
}

// ---- InProcTransport ----

InProcTransport::InProcTransport(InProcWorld* world, int rank)
    : world_(world), rank_(rank), send_queue_(world->size()), recv_queue_(world->size()) {}

int InProcTransport::size() const { return world_->size(); }

TransportRequest InProcTransport::Post(int peer, bool is_send, uint8_t* buf, size_t len) {
  const uint64_t id = next_id_++;
  if (peer < 0 || peer >= size() || peer == rank_) {
    requests_[id] = Request{peer, is_send, buf, len, 0, false, true};
    return TransportRequest{id};
  }
  requests_[id] = Request{peer, is_send, buf, len, 0, world_->lost_rank() >= 0};
  if (len > 0 && !requests_[id].failed) {
    (is_send ? send_queue_ : recv_queue_)[peer].push_back(id);
    Progress();
  }
  return TransportRequest{id};
}

TransportRequest InProcTransport::Isend(int peer, const void* buf, size_t len) {
  return Post(peer, true, static_cast<uint8_t*>(const_cast<void*>(buf)), len);
}

TransportRequest InProcTransport::Irecv(int peer, void* buf, size_t len) {
  return Post(peer, false, static_cast<uint8_t*>(buf), len);
}

void InProcTransport::PumpSends(int peer) {
  std::deque<uint64_t>& queue = send_queue_[peer];
  if (queue.empty() || world_->dead(peer)) return;
  InProcWorld::Pipe& pipe = world_->pipe(rank_, peer);
  size_t moved = 0;
  {
    std::lock_guard<std::mutex> lock(pipe.mu);
    while (!queue.empty()) {
      Request& req = requests_[queue.front()];
      const size_t n = pipe.Write(req.buf + req.done, req.len - req.done);
      req.done += n;
      moved += n;
      if (req.done < req.len) break;
      queue.pop_front();
    }
  }
  if (moved > 0) world_->Notify(peer);
}

void InProcTransport::PumpRecvs(int peer) {
  std::deque<uint64_t>& queue = recv_queue_[peer];
  if (queue.empty()) return;
  InProcWorld::Pipe& pipe = world_->pipe(peer, rank_);
  size_t moved = 0;
  {
    std::lock_guard<std::mutex> lock(pipe.mu);
    while (!queue.empty()) {
      Request& req = requests_[queue.front()];
      const size_t n = pipe.Read(req.buf + req.done, req.len - req.done);
      req.done += n;
      moved += n;
      if (req.done < req.len) break;
      queue.pop_front();
    }
  }
  if (moved > 0) world_->Notify(peer);
}

void InProcTransport::Progress() {
  if (world_->dead(rank_)) return;
  for (int peer = 0; peer < size(); ++peer) {
    PumpSends(peer);
    PumpRecvs(peer);
  }
}

static std::string Describe(int rank, bool is_send, size_t len, int peer) {
  return "rank " + std::to_string(rank) + (is_send ? ": send of " : ": receive of ") +
         std::to_string(len) + (is_send ? " bytes to rank " : " bytes from rank ") +
         std::to_string(peer);
}

Status InProcTransport::Failure(const Request& req) const {
  if (world_->dead(rank_)) {
    return Status::Aborted(Describe(rank_, req.is_send, req.len, req.peer) +
                           " aborted: this rank was killed");
  }
  const int lost = world_->lost_rank();
  return Status::PeerLost(Describe(rank_, req.is_send, req.len, req.peer) + " failed: rank " +
                          std::to_string(lost) + " lost (connection closed)");
}

Status InProcTransport::TimeoutStatus(const Request& req) const {
  return Status::Timeout(Describe(rank_, req.is_send, req.len, req.peer) +
                         " timed out waiting for rank " + std::to_string(req.peer));
}

Status InProcTransport::Wait(TransportRequest r, Deadline deadline) {
  auto it = requests_.find(r.id);
  if (it == requests_.end()) {
    return Status::Internal("rank " + std::to_string(rank_) + ": unknown request " +
                            std::to_string(r.id));
  }
  if (it->second.bad_peer) {
    const int peer = it->second.peer;
    requests_.erase(it);
    return Status::InvalidArgument("transport: bad peer rank " + std::to_string(peer));
  }
  for (;;) {
    const uint64_t seen = world_->Generation(rank_);
    Progress();
    const Request req = it->second;
    if (req.done == req.len && !req.failed) {
      requests_.erase(it);
      return Status::OK();
    }
    // A failed request stays queued (and known): the transport is unusable from here on.
    if (world_->lost_rank() >= 0) return Failure(req);
    if (!aborted_.ok()) return aborted_;
    if (!world_->WaitForChange(rank_, seen, deadline)) return TimeoutStatus(req);
  }
}

// ---- RunRanks ----

std::vector<Status> RunRanks(InProcWorld& world, const std::function<Status(Transport&)>& fn,
                             const std::vector<int>& skip) {
  std::vector<Status> statuses(world.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r) {
    if (std::find(skip.begin(), skip.end(), r) != skip.end()) continue;
    threads.emplace_back([&, r] { statuses[r] = fn(world.transport(r)); });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

}  // namespace test
}  // namespace hvd
