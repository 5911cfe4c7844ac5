// An in-process Transport for unit tests: the ranks of one world are threads of the test
// process, one InProcTransport per rank, all sharing an InProcWorld.
//
// Like TCP, each ordered pair of ranks is a byte stream through a bounded pipe (a ring buffer
// with its own mutex): a send completes once all its bytes are in the pipe, a receive once it
// has taken all its bytes out, so a receive may be filled by several sends and one send may fill
// several receives. A sender whose pipe is full waits for the receiver to drain it, so an
// algorithm that relies on unbounded buffering deadlocks here as it would on a socket, and one
// that writes into a buffer with a pending send sends the corrupted bytes.
//
// Bytes move only inside the owning rank's own calls (Isend, Irecv, Wait), so a rank's buffers
// are touched only by its own thread. Wait blocks on the rank's condition variable, woken by
// peers that moved bytes to or from a shared pipe, until the deadline (no spinning).
//
// Faults: KillRank(x) models rank x dying in a full-mesh TCP world, where every rank watches a
// socket to every other: every request of every other rank that is not complete, pending or
// posted later, fails with PeerLost naming rank x; rank x's own requests fail with Aborted.
// A rank whose thread never calls in leaves its peers to fail with Timeout at their deadline.
//
// Thread-safety: InProcWorld is thread-safe. Each InProcTransport is used by one thread only
// (its rank's), as the Transport contract says.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "transport/transport.h"

namespace hvd {
namespace test {

class InProcWorld;

class InProcTransport : public Transport {
 public:
  InProcTransport(InProcWorld* world, int rank);  // world owns this transport

  int rank() const override { return rank_; }
  int size() const override;
  TransportRequest Isend(int peer, const void* buf, size_t len) override;
  TransportRequest Irecv(int peer, void* buf, size_t len) override;
  Status Wait(TransportRequest r, Deadline deadline) override;
  // Pending and later requests of this rank fail with `why` (the others are untouched).
  void Abort(const Status& why) override {
    if (aborted_.ok()) aborted_ = why;
  }

 private:
  struct Request {
    int peer;
    bool is_send;
    uint8_t* buf;
    size_t len;
    size_t done;
    bool failed;  // posted after a rank was lost
    bool bad_peer = false;
  };
  TransportRequest Post(int peer, bool is_send, uint8_t* buf, size_t len);
  void Progress();
  void PumpSends(int peer);
  void PumpRecvs(int peer);
  Status Failure(const Request& req) const;
  Status TimeoutStatus(const Request& req) const;

  InProcWorld* world_;  // owns this transport
  int rank_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Request> requests_;
  std::vector<std::deque<uint64_t>> send_queue_;  // per peer, ids in post order
  std::vector<std::deque<uint64_t>> recv_queue_;  // per peer, ids in post order
  Status aborted_;
};

class InProcWorld {
 public:
  // pipe_capacity: bytes buffered per ordered pair of ranks (a socket buffer).
  explicit InProcWorld(int size, size_t pipe_capacity = 64 * 1024);
  ~InProcWorld();

  int size() const { return size_; }
  Transport& transport(int rank) { return *transports_[rank]; }
  void KillRank(int rank);

  // Used by InProcTransport.
  struct Pipe {
    std::mutex mu;
    std::vector<uint8_t> data;  // ring buffer, GUARDED_BY(mu) with head and used
    size_t head = 0;
    size_t used = 0;
    size_t Write(const uint8_t* src, size_t n);  // returns the bytes taken; mu held
    size_t Read(uint8_t* dst, size_t n);         // returns the bytes given; mu held
  };
  Pipe& pipe(int from, int to) { return *pipes_[from * size_ + to]; }
  uint64_t Generation(int rank);
  // Blocks until rank's generation differs from `seen` or the deadline passes (false then).
  bool WaitForChange(int rank, uint64_t seen, Deadline deadline);
  void Notify(int rank);
  bool dead(int rank) const { return dead_[rank].load(); }
  int lost_rank() const { return lost_rank_.load(); }

 private:
  struct Signal {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t generation = 0;  // GUARDED_BY(mu)
  };
  int size_;
  std::vector<std::unique_ptr<Pipe>> pipes_;
  std::vector<std::unique_ptr<Signal>> signals_;
  std::unique_ptr<std::atomic<bool>[]> dead_;
  std::atomic<int> lost_rank_{-1};  // the first rank killed
  std::vector<std::unique_ptr<InProcTransport>> transports_;
};

// Runs fn(transport of rank r) on one thread per rank of `world` (ranks listed in `skip` do
// not run: they never show up) and returns every rank's status.
std::vector<Status> RunRanks(InProcWorld& world, const std::function<Status(Transport&)>& fn,
                             const std::vector<int>& skip = {});

}  // namespace test
}  // namespace hvd
