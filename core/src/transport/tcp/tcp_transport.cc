#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <sstream>

#include "common/logging.h"
#include "transport/tcp/connection_error.h"

namespace hvd {

namespace {

// Completion condition that lets every read/write syscall move all remaining bytes (Asio's
// own conditions cap each syscall at 64 KiB, which quadruples the syscalls of a segment), and
// notes when bytes last moved on the connection.
auto Whole(size_t len, Clock::time_point* moved) {
  return [len, moved](const asio::error_code& ec, size_t done) -> size_t {
    if (done > 0) *moved = Clock::now();
    return ec ? 0 : len - done;
  };
}

// Where this rank's wait timed out: a connection of its own whose sent bytes go unacknowledged
// while the kernel retransmits them (the link, or the route to the peer's host, drops them).
// Named, since the wait that timed out may be on a rank that only waits in turn (in a ring,
// each rank waits on the one before it, whichever link broke). A peer that merely stopped
// reading acknowledges what it got and closes its window instead: not named here.
std::string DroppingLinkHint(int me, const std::vector<int>& fds) {
  int worst = -1;
  uint32_t worst_unacked = 0;
  for (size_t q = 0; q < fds.size(); ++q) {
    if (fds[q] < 0) continue;
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (::getsockopt(fds[q], IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
    if (info.tcpi_unacked == 0 || info.tcpi_retransmits == 0) continue;
    if (worst < 0 || info.tcpi_unacked > worst_unacked) {
      worst = static_cast<int>(q);
      worst_unacked = info.tcpi_unacked;
    }
  }
  if (worst < 0) return "";
  std::ostringstream os;
  os << "; the link between ranks " << me << " and " << worst << " drops what is sent on it (the "
     << "kernel retransmits " << worst_unacked << " unacknowledged segment"
     << (worst_unacked == 1 ? "" : "s") << " on it)";  // (not "to rank N": read as a wait's)
  return os.str();
}

}  // namespace

void TuneSocket(asio::ip::tcp::socket& s) {
  asio::error_code ec;
  s.set_option(asio::ip::tcp::no_delay(true), ec);
  // Large kernel buffers keep a whole pipeline of segments in flight between two waits.
  s.set_option(asio::socket_base::send_buffer_size(4 << 20), ec);
  s.set_option(asio::socket_base::receive_buffer_size(4 << 20), ec);
}

TcpTransport::TcpTransport(asio::io_context& io, int rank,
                           std::vector<std::unique_ptr<asio::ip::tcp::socket>> sockets,
                           std::chrono::microseconds spin, Clock::duration progress_window)
    : io_(io), rank_(rank), peers_(sockets.size()), spin_(spin), progress_window_(progress_window) {
  for (size_t i = 0; i < sockets.size(); ++i) peers_[i].sock = std::move(sockets[i]);
}

TcpTransport::~TcpTransport() {
  Abort(Status::Aborted("transport closed"));
  // Let the cancelled handlers run before the queues they refer to go away.
  auto limit = Clock::now() + std::chrono::seconds(5);
  while (in_flight_ > 0 && Clock::now() < limit) {
    if (io_.stopped()) io_.restart();
    io_.run_one_for(std::chrono::milliseconds(100));
  }
}

TransportRequest TcpTransport::Isend(int peer, const void* buf, size_t len) {
  return Post(peer, static_cast<char*>(const_cast<void*>(buf)), len, true);
}

TransportRequest TcpTransport::Irecv(int peer, void* buf, size_t len) {
  return Post(peer, static_cast<char*>(buf), len, false);
}

TransportRequest TcpTransport::Post(int peer, char* buf, size_t len, bool is_send) {
  uint64_t id = next_id_++;
  OpState& st = ops_[id];
  st.peer = peer;
  st.is_send = is_send;
  st.len = len;
  if (peer < 0 || peer >= size() || peer == rank_) {
    st.done = true;
    st.status = Status::InvalidArgument("transport: bad peer rank " + std::to_string(peer));
    return {id};
  }
  if (!broken_.ok()) {
    st.done = true;
    st.status = broken_;
    return {id};
  }
  if (len == 0) {
    st.done = true;
    return {id};
  }
  Peer& p = peers_[peer];
  (is_send ? p.sends : p.recvs).push_back(Op{id, buf, len});
  if (is_send && !p.sending) StartSend(peer);
  if (!is_send && !p.receiving) StartRecv(peer);
  return {id};
}

void TcpTransport::StartSend(int peer) {
  Peer& p = peers_[peer];
  if (p.sends.empty() || !broken_.ok()) return;
  p.sending = true;
  Op op = p.sends.front();
  ++in_flight_;
  asio::async_write(*p.sock, asio::buffer(op.buf, op.len), Whole(op.len, &p.moved),
                    [this, peer, id = op.id](const asio::error_code& ec, size_t) {
                      --in_flight_;
                      Peer& q = peers_[peer];
                      q.sending = false;
                      if (!broken_.ok()) return;  // aborted meanwhile: queues are gone
                      if (ec) return OnError(peer, true, ec);
                      q.sends.pop_front();
                      Finish(id, Status::OK());
                      StartSend(peer);
                    });
}

void TcpTransport::StartRecv(int peer) {
  Peer& p = peers_[peer];
  if (p.recvs.empty() || !broken_.ok()) return;
  p.receiving = true;
  Op op = p.recvs.front();
  ++in_flight_;
  asio::async_read(*p.sock, asio::buffer(op.buf, op.len), Whole(op.len, &p.moved),
                   [this, peer, id = op.id](const asio::error_code& ec, size_t) {
                     --in_flight_;
                     Peer& q = peers_[peer];
                     q.receiving = false;
                     if (!broken_.ok()) return;
                     if (ec) return OnError(peer, false, ec);
                     q.recvs.pop_front();
                     Finish(id, Status::OK());
                     StartRecv(peer);
                   });
}

void TcpTransport::Finish(uint64_t id, Status st) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  it->second.done = true;
  it->second.status = std::move(st);
}

void TcpTransport::OnError(int peer, bool is_send, const asio::error_code& ec) {
  if (!broken_.ok()) return;  // already aborted; this is the cancellation
  lost_peer_ = peer;
  std::ostringstream os;
  os << "rank " << peer << " lost: " << ConnectionErrorText(ec) << " while "
     << (is_send ? "sending to" : "receiving from") << " it (rank " << rank_ << ")";
  Abort(Status::PeerLost(os.str()));
}

void TcpTransport::Abort(const Status& why) {
  if (!broken_.ok()) return;
  broken_ = why;
  for (auto& p : peers_) {
    if (!p.sock) continue;
    asio::error_code ec;
    p.sock->shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    p.sock->close(ec);
    for (auto* q : {&p.sends, &p.recvs}) {
      for (const Op& op : *q) Finish(op.id, why);
      q->clear();
    }
  }
  // Closing cancels the reads and writes in flight: the kernel copies no more bytes into or out
  // of callers' buffers, and the cancelled handlers only decrement in_flight_. Abort may run
  // inside a handler (an abort message arriving mid-collective), so it does not run io_.
}

bool TcpTransport::Finished(TransportRequest r) const {
  auto it = ops_.find(r.id);
  return it == ops_.end() || it->second.done;
}

Status TcpTransport::Take(TransportRequest r) {
  auto it = ops_.find(r.id);
  if (it == ops_.end()) return Status::Internal("transport: unknown request");
  Status s = it->second.status;
  ops_.erase(it);
  return s;
}

Status TcpTransport::CheckDeadline(TransportRequest r, Deadline deadline) {
  auto it = ops_.find(r.id);
  if (it == ops_.end() || it->second.done) return Status::OK();
  const OpState& st = it->second;
  // Bytes still moving to or from the peer: the wait is slow, not stuck (a large buffer on a
  // slow or lossy link). It fails once the peer has been silent for the whole window.
  if (Clock::now() < Stretched(deadline, peers_[st.peer].moved, progress_window_)) {
    return Status::OK();
  }
  std::vector<int> fds(peers_.size(), -1);
  for (size_t q = 0; q < peers_.size(); ++q) {
    if (peers_[q].sock && peers_[q].sock->is_open()) fds[q] = peers_[q].sock->native_handle();
  }
  Status timeout = Status::Timeout(StallMessage(st.is_send, st.len, st.peer, "", progress_window_) +
                                   DroppingLinkHint(rank_, fds));
  if (broken_.ok()) lost_peer_ = st.peer;
  Abort(timeout);
  return timeout;
}

Status TcpTransport::Wait(TransportRequest r, Deadline deadline) {
  auto it = ops_.find(r.id);
  if (it == ops_.end()) return Status::Internal("transport: unknown request");
  while (!it->second.done) {
    if (io_.stopped()) io_.restart();
    if (!CheckDeadline(r, deadline).ok()) break;
    auto now = Clock::now();
    // Poll briefly first: the peer is mid-collective, so the bytes are usually microseconds
    // away, and sleeping in the kernel costs a wake-up on each side.
    if (spin_.count() > 0) {
      auto spin_until = std::min<Clock::time_point>(now + spin_, deadline);
      while (!it->second.done && Clock::now() < spin_until) {
        if (io_.poll() == 0) sched_yield();
        if (io_.stopped()) io_.restart();
      }
      if (it->second.done) break;
    }
    io_.run_one_for(std::min<Clock::duration>(
        std::max<Clock::duration>(deadline - now, std::chrono::milliseconds(1)),
        std::chrono::seconds(1)));
    it = ops_.find(r.id);
  }
  return Take(r);
}

}  // namespace hvd
