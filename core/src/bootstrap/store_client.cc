// StoreClient: a blocking client of the rendezvous store (protocol in store.h).
//
// Every socket operation is an Asio async operation driven by this client's private
// io_context with run_one_for, so every call honours its deadline. Connecting retries, with
// backoff, both a refused TCP connect (the server may still be starting) and a connection the
// server dropped before its handshake verdict; a refused handshake fails at once. When a deadline passes or
// the connection breaks, the socket is closed (a late answer could otherwise be taken for the
// next request's) and the next call reconnects within its own deadline.
#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include <asio.hpp>

#include "bootstrap/auth.h"
#include "bootstrap/store.h"
#include "bootstrap/store_wire.h"
#include "common/inheritance.h"
#include "common/logging.h"

namespace hvd {
namespace {

using asio::ip::tcp;

std::string Printable(const std::string& key) {
  std::string out;
  for (char c : key.substr(0, 200)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out.push_back(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[u >> 4]);
      out.push_back(hex[u & 15]);
    }
  }
  if (key.size() > 200) out += "...";
  return out;
}

class StoreClientImpl : public StoreClient {
 public:
  StoreClientImpl(std::string host, int port, std::string secret)
      : host_(std::move(host)), port_(port), where_(host_ + ":" + std::to_string(port)),
        secret_(std::move(secret)), socket_(io_), resolver_(io_) {}

  Status ConnectLoop(Deadline deadline);
  Status Set(const std::string& key, const std::string& value, Deadline deadline) override;
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override;
  StatusOr<bool> TryGet(const std::string& key, std::string* value, Deadline deadline) override;

 private:
  bool RunUntil(Deadline deadline, const bool* done);
  asio::error_code ConnectOnce(Deadline deadline, bool* timed_out);
  // *absent (when given) is set for a TryGet's "no such key" answer instead of an error.
  Status RoundTrip(const std::string& payload, Deadline deadline, const std::string& what,
                   std::string* value, bool* absent = nullptr);
  Status IoError(const asio::error_code& ec, const std::string& what);
  void Disconnect() {
    asio::error_code ec;
    socket_.close(ec);
    connected_ = false;
  }

  const std::string host_;
  const int port_;
  const std::string where_;
  const std::string secret_;
  asio::io_context io_;
  tcp::socket socket_;
  tcp::resolver resolver_;
  bool connected_ = false;
};

// Runs handlers until *done or the deadline. On the deadline, cancels the outstanding
// operations, lets their handlers run (bounded) and returns false.
bool StoreClientImpl::RunUntil(Deadline deadline, const bool* done) {
  io_.restart();
  while (!*done) {
    Clock::time_point now = Clock::now();
    if (now >= deadline) {
      asio::error_code ec;
      socket_.cancel(ec);
      resolver_.cancel();
      io_.restart();
      io_.run_for(std::chrono::seconds(1));
      return false;
    }
    auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(100));
    io_.run_one_for(slice);
    if (io_.stopped()) io_.restart();
  }
  return true;
}

asio::error_code StoreClientImpl::ConnectOnce(Deadline deadline, bool* timed_out) {
  asio::error_code result;
  bool done = false;
  asio::error_code aec;
  asio::ip::address addr = asio::ip::make_address(host_, aec);
  auto on_connect = [&](asio::error_code ec, const tcp::endpoint&) {
    result = ec;
    done = true;
  };
  if (!aec) {
    std::vector<tcp::endpoint> eps{tcp::endpoint(addr, static_cast<unsigned short>(port_))};
    asio::async_connect(socket_, eps, on_connect);
  } else {
    resolver_.async_resolve(host_, std::to_string(port_),
                            [&](asio::error_code ec, tcp::resolver::results_type results) {
                              if (ec) {
                                result = ec;
                                done = true;
                                return;
                              }
                              asio::async_connect(socket_, results, on_connect);
                            });
  }
  *timed_out = !RunUntil(deadline, &done);
  if (done && !result) KeepFromChildren(socket_.native_handle());
  return result;
}

Status StoreClientImpl::ConnectLoop(Deadline deadline) {
  auto backoff = std::chrono::milliseconds(10);
  std::string last_error = "no attempt made";
  while (true) {
    bool timed_out = false;
    asio::error_code ec = ConnectOnce(deadline, &timed_out);
    if (!timed_out && !ec) {
      asio::error_code opt_ec;
      socket_.set_option(tcp::no_delay(true), opt_ec);
      bool dropped = false;
      Status st = auth::ClientHandshake(io_, socket_, secret_, "store", deadline, &dropped);
      if (st.ok()) {
        connected_ = true;
        return Status::OK();
      }
      // Dropped before a verdict (the server gave up waiting, or restarted): try again. A
      // refusal is final.
      if (!dropped) {
        Disconnect();
        return st.WithContext("rendezvous store at " + where_);
      }
      HVD_LOG(kDebug) << "rendezvous store at " << where_ << ": " << st.message() << "; retrying";
      last_error = st.message();
    } else if (ec && !timed_out) {  // a connect cut short by the deadline says nothing new
      last_error = ec.message();
    }
    Disconnect();
    Clock::time_point now = Clock::now();
    if (timed_out || now >= deadline) {
      return Status::Timeout("could not connect to the rendezvous store at " + where_ +
                             " before the deadline (last error: " + last_error + ")");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

Status StoreClientImpl::IoError(const asio::error_code& ec, const std::string& what) {
  if (ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == asio::error::broken_pipe || ec == asio::error::connection_aborted) {
    return Status::PeerLost("rendezvous store at " + where_ + " closed the connection while " +
                            what + " (has the launcher exited?)");
  }
  return Status::Internal("rendezvous store at " + where_ + ": " + what + ": " + ec.message());
}

// Sends one request frame and reads one response frame into *value (code byte stripped).
Status StoreClientImpl::RoundTrip(const std::string& payload, Deadline deadline,
                                  const std::string& what, std::string* value, bool* absent) {
  if (!connected_) {
    Status st = ConnectLoop(deadline);
    if (!st.ok()) return st.WithContext(what);
  }
  const std::string frame = store_wire::Frame(payload);
  unsigned char header[store_wire::kHeaderBytes];
  std::string body;
  bool done = false;
  bool bad_length = false;
  asio::error_code result;
  auto finish = [&](asio::error_code ec) {
    result = ec;
    done = true;
  };
  auto on_header = [&](asio::error_code ec, size_t) {
    if (ec) return finish(ec);
    uint32_t len = store_wire::GetU32(header);
    if (len < 1 || len > store_wire::kMaxPayload) {
      bad_length = true;
      return finish(ec);
    }
    body.assign(len, '\0');
    asio::async_read(socket_, asio::buffer(&body[0], len),
                     [&](asio::error_code rec, size_t) { finish(rec); });
  };
  asio::async_write(socket_, asio::buffer(frame), [&](asio::error_code ec, size_t) {
    if (ec) return finish(ec);
    asio::async_read(socket_, asio::buffer(header), on_header);
  });
  if (!RunUntil(deadline, &done)) {
    Disconnect();
    return Status::Timeout("timed out " + what + " at the rendezvous store " + where_ +
                           " (no answer before the deadline)");
  }
  if (result) {
    Disconnect();
    return IoError(result, what);
  }
  if (bad_length) {
    Disconnect();
    return Status::Internal("rendezvous store at " + where_ + " sent a malformed frame for " + what);
  }
  if (absent != nullptr) *absent = static_cast<uint8_t>(body[0]) == store_wire::kCodeAbsent;
  if (absent != nullptr && *absent) return Status::OK();
  if (static_cast<uint8_t>(body[0]) != store_wire::kCodeOk) {
    return Status::Internal("rendezvous store at " + where_ + " answered " + what + " with code " +
                            std::to_string(static_cast<uint8_t>(body[0])) + ": " +
                            body.substr(1));
  }
  value->assign(body, 1, std::string::npos);
  return Status::OK();
}

Status CheckSizes(const std::string& key, size_t value_size) {
  if (key.size() > store_wire::kMaxKey) {
    return Status::InvalidArgument("store key of " + std::to_string(key.size()) +
                                   " bytes exceeds 4 KiB: '" + Printable(key) + "'");
  }
  if (1 + 4 + key.size() + value_size > store_wire::kMaxPayload) {
    return Status::InvalidArgument("store value for key '" + Printable(key) + "' (" +
                                   std::to_string(value_size) + " bytes) exceeds 16 MiB");
  }
  return Status::OK();
}

Status StoreClientImpl::Set(const std::string& key, const std::string& value, Deadline deadline) {
  HVD_RETURN_IF_ERROR(CheckSizes(key, value.size()));
  std::string ignored;
  return RoundTrip(store_wire::RequestPayload(store_wire::kOpSet, key, value), deadline,
                   "setting key '" + Printable(key) + "'", &ignored);
}

StatusOr<std::string> StoreClientImpl::Get(const std::string& key, Deadline deadline) {
  HVD_RETURN_IF_ERROR(CheckSizes(key, 0));
  std::string value;
  Status st = RoundTrip(store_wire::RequestPayload(store_wire::kOpGet, key, std::string()),
                        deadline, "waiting for key '" + Printable(key) + "'", &value);
  if (!st.ok()) return st;
  return value;
}

StatusOr<bool> StoreClientImpl::TryGet(const std::string& key, std::string* value,
                                       Deadline deadline) {
  HVD_RETURN_IF_ERROR(CheckSizes(key, 0));
  bool absent = false;
  Status st = RoundTrip(store_wire::RequestPayload(store_wire::kOpTryGet, key, std::string()),
                        deadline, "looking up key '" + Printable(key) + "'", value, &absent);
  if (!st.ok()) return st;
  return !absent;
}

}  // namespace

StatusOr<bool> StoreClient::TryGet(const std::string& key, std::string*, Deadline) {
  return Status::FailedPrecondition("this rendezvous store cannot look up key '" + key +
                                    "' without waiting");
}

StatusOr<std::unique_ptr<StoreClient>> StoreClient::Connect(const std::string& host, int port,
                                                            Deadline deadline,
                                                            const std::string& secret) {
  if (port <= 0 || port > 65535) {
    return Status::InvalidArgument("rendezvous store at " + host + ":" + std::to_string(port) +
                                   ": port out of range");
  }
  auto client = std::make_unique<StoreClientImpl>(host, port, secret);
  HVD_RETURN_IF_ERROR(client->ConnectLoop(deadline));
  return std::unique_ptr<StoreClient>(std::move(client));
}

}  // namespace hvd
