// Transport over TCP (Asio): one connection per pair of ranks, progressed by the io_context that
// the background thread runs (Wait runs it), so sending, receiving and the caller's reductions
// interleave on one thread without busy-waiting.
//
// Per peer there is a queue of sends and a queue of receives; the head of each is in flight as
// one async_write / async_read, so bytes keep their posting order. Any failure (a reset, EOF,
// a passed deadline) aborts the whole transport: every socket is closed, every pending request
// fails with the first error (which names the peer), and later requests fail at once.
//
// Thread-safety: not thread-safe; only the background thread that runs `io` may use it.
#pragma once

#include <asio.hpp>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "transport/transport.h"

namespace hvd {

class TcpTransport : public Transport {
 public:
  // sockets[peer] is null for this rank; the transport takes ownership. `spin` is how long a
  // Wait polls without sleeping before it blocks in the kernel (zero when ranks outnumber
  // cores: a spinning rank would take the core its peer needs). With a `progress_window`, a
  // Wait past its deadline goes on while bytes moved to or from its peer within the window: a
  // deadline then bounds how long a peer may stall, not how long a large transfer may take.
  TcpTransport(asio::io_context& io, int rank, std::vector<std::unique_ptr<asio::ip::tcp::socket>> sockets,
               std::chrono::microseconds spin = std::chrono::microseconds(0),
               Clock::duration progress_window = Clock::duration::zero());
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  TransportRequest Isend(int peer, const void* buf, size_t len) override;
  TransportRequest Irecv(int peer, void* buf, size_t len) override;
  Status Wait(TransportRequest r, Deadline deadline) override;

  // Fails everything with `why` and closes the sockets (idempotent).
  void Abort(const Status& why) override;

  // For a transport that runs this one's io_context in a wait loop of its own (the shared
  // memory router, transport/shm/shm_transport.h). Finished: `r` completed or failed. Take: its
  // status, forgetting it. CheckDeadline: past `deadline` (stretched while bytes move, as in
  // Wait) aborts with the Timeout that Wait would give and returns it; OK otherwise.
  bool Finished(TransportRequest r) const;
  Status Take(TransportRequest r);
  Status CheckDeadline(TransportRequest r, Deadline deadline);
  asio::io_context& io() { return io_; }
  const Status& broken() const { return broken_; }
  // The peer whose connection broke first, or that went silent for the whole window first
  // (a wait that timed out), or -1.
  int lost_peer() const { return lost_peer_; }

 private:
  struct Op {
    uint64_t id;
    char* buf;
    size_t len;
  };
  struct Peer {
    std::unique_ptr<asio::ip::tcp::socket> sock;
    std::deque<Op> sends, recvs;
    bool sending = false, receiving = false;
    Clock::time_point moved;  // when bytes last moved either way
  };
  struct OpState {
    bool done = false;
    Status status;
    int peer = -1;
    bool is_send = false;
    size_t len = 0;
  };

  TransportRequest Post(int peer, char* buf, size_t len, bool is_send);
  void StartSend(int peer);
  void StartRecv(int peer);
  void Finish(uint64_t id, Status st);
  void OnError(int peer, bool is_send, const asio::error_code& ec);

  asio::io_context& io_;
  const int rank_;
  std::vector<Peer> peers_;
  std::unordered_map<uint64_t, OpState> ops_;
  uint64_t next_id_ = 1;
  int in_flight_ = 0;  // async operations whose handler has not run yet
  const std::chrono::microseconds spin_;
  const Clock::duration progress_window_;
  Status broken_;
  int lost_peer_ = -1;
};

// Applies the socket options hvd wants on every connection (no Nagle, larger buffers).
void TuneSocket(asio::ip::tcp::socket& s);

}  // namespace hvd
