#include "bootstrap/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

namespace hvd {
namespace auth {

Nonce RandomNonce() {
  Nonce n;
  size_t got = 0;
  while (got < n.size()) {
    ssize_t r = ::getrandom(n.data() + got, n.size() - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      break;
    }
  }
  if (got == n.size()) return n;
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    std::random_device rd;  // no generator worked: still never a fixed nonce
    for (auto& b : n) b = static_cast<uint8_t>(rd());
  }
  return n;
}

Mac Proof(const std::string& secret, const char* role, const Nonce& first, const Nonce& second,
          const std::string& context) {
  std::string msg(role);
  msg.append(reinterpret_cast<const char*>(first.data()), first.size());
  msg.append(reinterpret_cast<const char*>(second.data()), second.size());
  msg += context;
  Mac mac{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac.data(), &len);
  return mac;
}

bool Equal(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

std::string Hex(const uint8_t* data, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += hex[data[i] >> 4];
    out += hex[data[i] & 15];
  }
  return out;
}

Status CheckClientProof(const std::string& secret, const Nonce& ns, const uint8_t* msg, size_t len,
                        size_t context_len, std::string* context, Nonce* nc) {
  const Status refused = Status::InvalidArgument("failed authentication (wrong or no job secret)");
  if (len != context_len + kNonceBytes + kMacBytes) return refused;
  context->assign(reinterpret_cast<const char*>(msg), context_len);
  Mac mac;
  std::memcpy(nc->data(), msg + context_len, kNonceBytes);
  std::memcpy(mac.data(), msg + context_len + kNonceBytes, kMacBytes);
  if (!Equal(mac, Proof(secret, "hvd client", ns, *nc, *context))) return refused;
  return Status::OK();
}

Status VerdictStatus(uint8_t verdict) {
  switch (verdict) {
    case kVerdictAccepted:
      return Status::OK();
    case kVerdictRefused:
      return Status::PeerLost("authentication refused by the peer: this process does not have "
                              "the job's secret (is HVD_SECRET the job's?)");
    case kVerdictClaimRefused:
      return Status::PeerLost("the peer refused this connection's claim (it is not the rank or "
                              "service this address was published for: a stale address?)");
    default:
      return Status::PeerLost("the peer answered the handshake with an unknown verdict byte " +
                              std::to_string(verdict) + ": not an hvd process of this version");
  }
}

namespace {

struct ServerState : std::enable_shared_from_this<ServerState> {
  asio::ip::tcp::socket* sock;
  std::string secret;
  size_t context_len;
  std::shared_ptr<void> keepalive;
  AcceptFn done;
  ContextCheck check;
  Nonce ns;
  std::vector<uint8_t> in;
  std::vector<uint8_t> reply;
  std::unique_ptr<asio::steady_timer> timer;
  bool finished = false;

  void Finish(const Status& s, const std::string& context) {
    if (finished) return;
    finished = true;
    timer->cancel();
    if (!s.ok()) {
      asio::error_code ignored;
      sock->close(ignored);
    }
    done(s, context);
  }

  // Tells the client it is refused (a final answer, so it does not retry), then fails with `s`.
  void Refuse(uint8_t verdict, const Status& s) {
    reply.assign(1, verdict);
    asio::async_write(*sock, asio::buffer(reply),
                      [this, keep = shared_from_this(), s](const asio::error_code&, size_t) {
                        Finish(s, "");
                      });
  }
};

std::string Describe(const asio::ip::tcp::socket& s) {
  asio::error_code ec;
  auto ep = s.remote_endpoint(ec);
  if (ec) return "a peer";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

}  // namespace

void AcceptHandshake(asio::ip::tcp::socket& sock, const std::string& secret, size_t context_len,
                     std::shared_ptr<void> keepalive, AcceptFn done, ContextCheck check,
                     Clock::duration timeout) {
  auto st = std::make_shared<ServerState>();
  st->sock = &sock;
  st->secret = secret;
  st->context_len = context_len;
  st->keepalive = std::move(keepalive);
  st->done = std::move(done);
  st->check = std::move(check);
  st->ns = RandomNonce();
  st->in.resize(context_len + kNonceBytes + kMacBytes);
  st->timer = std::make_unique<asio::steady_timer>(sock.get_executor(), timeout);
  const std::string who = Describe(sock);
  const double seconds = std::chrono::duration<double>(timeout).count();
  st->timer->async_wait([st, who, seconds](const asio::error_code& ec) {
    if (!ec) {
      std::ostringstream os;
      os << "no handshake from " << who << " within " << seconds << " s (the start timeout)";
      st->Finish(Status::Timeout(os.str()), "");
    }
  });
  // The listener closes a connection still authenticating itself (to make room, or as it
  // stops): not the peer's doing, whatever error the pending operation then reports.
  auto closed_here = [](const asio::error_code& ec) {
    return ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor;
  };
  asio::async_write(sock, asio::buffer(st->ns), [st, who, closed_here](const asio::error_code& ec,
                                                                       size_t) {
    if (ec && closed_here(ec)) {
      return st->Finish(Status::Aborted(who + ": closed by this process before its handshake"), "");
    }
    if (ec) return st->Finish(Status::PeerLost(who + ": " + ec.message()), "");
    asio::async_read(*st->sock, asio::buffer(st->in), [st, who, closed_here](
                                                          const asio::error_code& ec2, size_t) {
      if (ec2 && closed_here(ec2)) {
        return st->Finish(
            Status::Aborted(who + ": closed by this process before its handshake completed"), "");
      }
      if (ec2) {
        return st->Finish(Status::PeerLost(who + " sent no complete handshake: " + ec2.message()), "");
      }
      std::string context;
      Nonce nc;
      Status proof = CheckClientProof(st->secret, st->ns, st->in.data(), st->in.size(),
                                      st->context_len, &context, &nc);
      if (!proof.ok()) return st->Refuse(kVerdictRefused, proof.WithContext(who));
      if (st->check) {
        Status claim = st->check(context);
        if (!claim.ok()) return st->Refuse(kVerdictClaimRefused, claim.WithContext(who));
      }
      Mac server_mac = Proof(st->secret, "hvd server", nc, st->ns, context);
      st->reply.assign(1, kVerdictAccepted);
      st->reply.insert(st->reply.end(), server_mac.begin(), server_mac.end());
      asio::async_write(*st->sock, asio::buffer(st->reply),
                        [st, who, context](const asio::error_code& ec3, size_t) {
                          if (ec3) return st->Finish(Status::PeerLost(who + ": " + ec3.message()), "");
                          st->Finish(Status::OK(), context);
                        });
    });
  });
}

namespace {

// TCP keepalive, probing after `seconds` of silence, once a second, three times; or off.
// A connect can complete on this side while the listener closes without ever taking it (a
// peer that gave up forming the job as the connection arrived): no state is left there, and
// the client, which speaks second, would wait for the challenge until its deadline. A probe
// draws a reset from such a peer at once; a live peer's kernel answers it even before the
// peer accepts, however busy the peer is.
void ProbeSilence(asio::ip::tcp::socket& sock, int seconds) {
  const int fd = sock.native_handle();
  const int on = seconds > 0 ? 1 : 0, interval = 1, count = 3;
  if (on) {
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &seconds, sizeof(seconds));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  }
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
}

}  // namespace

Status ClientHandshake(asio::io_context& io, asio::ip::tcp::socket& sock,
                       const std::string& secret, const std::string& context, Deadline deadline,
                       bool* dropped) {
  if (dropped) *dropped = false;
  Nonce ns, nc = RandomNonce();
  Mac server_mac;
  uint8_t verdict = 0;
  asio::error_code result = asio::error::would_block;
  bool past_deadline = false;
  auto run = [&](auto start) -> asio::error_code {
    result = asio::error::would_block;
    start();
    while (result == asio::error::would_block) {
      auto now = Clock::now();
      if (now >= deadline) {
        asio::error_code ignored;
        sock.close(ignored);
        // Let the cancelled operation finish before its buffers go away.
        while (result == asio::error::would_block) {
          if (io.stopped()) io.restart();
          io.run_one_for(std::chrono::milliseconds(100));
        }
        past_deadline = true;
        return asio::error::timed_out;
      }
      if (io.stopped()) io.restart();
      io.run_one_for(std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(200)));
    }
    return result;
  };
  auto on_done = [&](const asio::error_code& ec, size_t) { result = ec ? ec : asio::error_code(); };
  // Closed before the server said anything final: the caller may reconnect. (A connection the
  // probes below found dead ends with timed_out too, but before the deadline.)
  auto closed = [&](const char* when, const asio::error_code& ec) {
    if (past_deadline) {
      return Status::PeerLost(std::string("authentication: no answer from the peer before the "
                                          "deadline (") + when + ")");
    }
    if (dropped) *dropped = true;
    return Status::PeerLost(std::string("authentication: the peer closed the connection (") +
                            when + "): " + ec.message());
  };
  ProbeSilence(sock, 1);
  asio::error_code ec = run([&] { asio::async_read(sock, asio::buffer(ns), on_done); });
  if (ec) return closed("waiting for its challenge", ec);
  // The peer took the connection: off again, since the job's own timeouts judge a quiet link.
  ProbeSilence(sock, 0);
  Mac mac = Proof(secret, "hvd client", ns, nc, context);
  std::string out = context;
  out.append(reinterpret_cast<const char*>(nc.data()), nc.size());
  out.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  ec = run([&] { asio::async_write(sock, asio::buffer(out), on_done); });
  if (!ec) ec = run([&] { asio::async_read(sock, asio::buffer(&verdict, 1), on_done); });
  if (ec) return closed("waiting for its verdict", ec);
  HVD_RETURN_IF_ERROR(VerdictStatus(verdict));
  ec = run([&] { asio::async_read(sock, asio::buffer(server_mac), on_done); });
  if (ec) return closed("waiting for its proof", ec);
  if (!Equal(server_mac, Proof(secret, "hvd server", nc, ns, context))) {
    return Status::PeerLost("the peer failed authentication: it does not know the job's secret");
  }
  return Status::OK();
}

}  // namespace auth
}  // namespace hvd
