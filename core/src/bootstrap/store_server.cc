// StoreServer: the rendezvous store hosted by hvdrun (protocol in store.h).
//
// One io_context thread owns all state: the key-value map, the sessions and the Get waiters.
// Each connection is a Session that keeps itself alive with shared_from_this while it has an
// operation outstanding, and serves one request at a time:
//   1. read the 4-byte length (no deadline: a rank may stay connected for the whole job);
//   2. read the payload within kFrameSeconds of its header (a half-sent frame is dropped);
//   3. Set stores the value, answers, and answers every session waiting on that key;
//      Get answers at once, or parks the session in the waiter list and watches the socket so
//      a client that goes away while waiting is cleaned up;
//   4. back to 1 once the answer is written.
// A bad frame (too long, unknown op, key > 4 KiB) closes that connection only, with a warning.
// A connection has until the handshake timeout (the job's start timeout) to authenticate; at
// most kMaxPendingHandshakes may be authenticating at once (fewer under a low descriptor limit:
// AuthenticatingCap, so that a flood leaves hvdrun descriptors to start its ranks with), and
// past that the oldest of them is dropped (its client, if it is a slow rank, reconnects).
// Stop() closes the acceptor and every session on the io thread, then joins it.
#include <algorithm>
#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <asio.hpp>

#include "bootstrap/auth.h"
#include "bootstrap/store.h"
#include "bootstrap/store_wire.h"
#include "common/descriptors.h"
#include "common/inheritance.h"
#include "common/logging.h"

namespace hvd {
namespace {

using asio::ip::tcp;
constexpr int kFrameSeconds = 30;
constexpr size_t kMaxPendingHandshakes = 256;

const std::string kAuthContext = "store";

class StoreServerImpl;

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `server` owns the registry this session is in and outlives it (Stop closes all sessions
  // on the io thread before the server is destroyed).
  Session(tcp::socket socket, StoreServerImpl* server)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), server_(server) {
    asio::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("unknown peer") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void Start(const std::string& secret, Clock::duration handshake_timeout);
  void Close();
  bool authenticating() const { return !authenticated_ && !closed_; }
  const std::string& peer() const { return peer_; }
  // Answers the parked Get with `value` (io thread only).
  void Deliver(const std::string& value);

 private:
  void ReadHeader();
  void ReadPayload(uint32_t len);
  void Handle();
  void Watch();
  void Reply(const std::string& value, uint8_t code = store_wire::kCodeOk);
  void Reject(const std::string& why);

  tcp::socket socket_;
  asio::steady_timer timer_;
  StoreServerImpl* server_;  // not owned
  std::string peer_;
  unsigned char header_[store_wire::kHeaderBytes] = {};
  std::string payload_;
  std::string out_;
  bool closed_ = false;
  bool authenticated_ = false;
  bool waiting_ = false;
  uint64_t watch_gen_ = 0;
  std::string waiting_key_;
};

class StoreServerImpl : public StoreServer {
 public:
  StoreServerImpl(std::string secret, Clock::duration handshake_timeout)
      : acceptor_(io_), accept_retry_(io_), secret_(std::move(secret)),
        handshake_timeout_(handshake_timeout) {}
  ~StoreServerImpl() override { Stop(); }

  Status Listen(const std::string& bind_addr, int port);
  int port() const override { return port_; }
  void Stop() override;
  bool Lookup(const std::string& key, std::string* value) const override {
    std::lock_guard<std::mutex> l(data_mu_);
    auto it = data_.find(key);
    if (it == data_.end()) return false;
    *value = it->second;
    return true;
  }

  // io thread only.
  void SetKey(const std::string& key, std::string value);
  const std::string* Find(const std::string& key) const {
    auto it = data_.find(key);
    return it == data_.end() ? nullptr : &it->second;
  }
  void AddWaiter(const std::string& key, std::shared_ptr<Session> s) {
    waiters_[key].push_back(std::move(s));
  }
  void Forget(Session* s, const std::string* waiting_key);

  // Connections that failed the handshake (any thread): a stranger may open thousands.
  LimitedWarning dropped{"store: dropped a connection"};

 private:
  void Accept();
  // Makes room for one more connection authenticating (`now`: drops the oldest of them anyway,
  // to free its descriptor).
  void LimitPendingHandshakes(bool now = false);
  void CloseAllOnIoThread();

  asio::io_context io_;  // declared first: destroyed after everything that uses it
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;  // the next accept after a failed one
  int port_ = 0;
  const std::string secret_;
  const Clock::duration handshake_timeout_;
  const size_t max_pending_ = AuthenticatingCap(kMaxPendingHandshakes);
  std::thread thread_;
  std::mutex stop_mu_;
  bool stopped_ = false;  // guarded by stop_mu_
  // Written on the io thread only, under data_mu_ (Lookup reads it from any thread; the io
  // thread's own reads need no lock).
  mutable std::mutex data_mu_;
  std::unordered_map<std::string, std::string> data_;
  // io thread only:
  std::unordered_map<std::string, std::vector<std::shared_ptr<Session>>> waiters_;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions_;
  std::deque<std::weak_ptr<Session>> authenticating_;  // in the order they were accepted
  LimitedWarning evicted_{"store: dropped the oldest connection authenticating"};
  LimitedWarning accept_failed_{"store: accepting a connection failed (accepting goes on)"};
};

void Session::Start(const std::string& secret, Clock::duration handshake_timeout) {
  auto self = shared_from_this();
  auto check = [](const std::string& context) {
    return context == kAuthContext ? Status::OK()
                                   : Status::InvalidArgument("handshake for another service");
  };
  auth::AcceptHandshake(
      socket_, secret, kAuthContext.size(), self,
      [self](const Status& st, const std::string&) {
        if (self->closed_) return;
        if (!st.ok()) {
          self->server_->dropped.Note(st.message());
          return self->Close();
        }
        self->authenticated_ = true;
        self->ReadHeader();
      },
      check, handshake_timeout);
}

void Session::ReadHeader() {
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(header_), [self](asio::error_code ec, size_t) {
    if (ec) {
      if (ec != asio::error::operation_aborted && ec != asio::error::eof) {
        HVD_LOG(kDebug) << "store: connection from " << self->peer_ << ": " << ec.message();
      }
      self->Close();
      return;
    }
    uint32_t len = store_wire::GetU32(self->header_);
    if (len > store_wire::kMaxPayload) {
      self->Reject("frame of " + std::to_string(len) + " bytes exceeds 16 MiB");
      return;
    }
    self->ReadPayload(len);
  });
}

void Session::ReadPayload(uint32_t len) {
  auto self = shared_from_this();
  payload_.assign(len, '\0');
  timer_.expires_after(std::chrono::seconds(kFrameSeconds));
  timer_.async_wait([self](asio::error_code ec) {
    if (!ec) self->Reject("frame not completed within " + std::to_string(kFrameSeconds) + " s");
  });
  asio::async_read(socket_, asio::buffer(&payload_[0], len), [self](asio::error_code ec, size_t) {
    self->timer_.cancel();
    if (ec) {
      self->Close();
      return;
    }
    self->Handle();
  });
}

void Session::Handle() {
  store_wire::Request req;
  std::string why;
  if (!store_wire::ParseRequest(payload_, &req, &why)) {
    Reject(why);
    return;
  }
  payload_.clear();
  if (req.op == store_wire::kOpSet) {
    server_->SetKey(req.key, std::move(req.value));
    Reply(std::string());
    return;
  }
  if (const std::string* v = server_->Find(req.key)) {
    Reply(*v);
    return;
  }
  if (req.op == store_wire::kOpTryGet) {
    Reply(std::string(), store_wire::kCodeAbsent);
    return;
  }
  waiting_ = true;
  waiting_key_ = req.key;
  server_->AddWaiter(req.key, shared_from_this());
  Watch();
}

// While a Get is parked, wait for the socket to become readable: readable with nothing to
// read means the client closed; readable with data means it pipelined a request, which is
// read after the Get is answered.
void Session::Watch() {
  auto self = shared_from_this();
  uint64_t gen = ++watch_gen_;
  socket_.async_wait(tcp::socket::wait_read, [self, gen](asio::error_code ec) {
    if (ec == asio::error::operation_aborted || gen != self->watch_gen_ || !self->waiting_) return;
    asio::error_code aec;
    size_t avail = ec ? 0 : self->socket_.available(aec);
    if (ec || aec || avail == 0) self->Close();
  });
}

void Session::Deliver(const std::string& value) {
  if (closed_) return;
  waiting_ = false;
  ++watch_gen_;
  asio::error_code ec;
  socket_.cancel(ec);  // the watch
  Reply(value);
}

void Session::Reply(const std::string& value, uint8_t code) {
  std::string payload;
  payload.reserve(1 + value.size());
  payload.push_back(static_cast<char>(code));
  payload += value;
  out_ = store_wire::Frame(payload);
  auto self = shared_from_this();
  asio::async_write(socket_, asio::buffer(out_), [self](asio::error_code ec, size_t) {
    self->out_.clear();
    if (ec) {
      self->Close();
      return;
    }
    self->ReadHeader();
  });
}

void Session::Reject(const std::string& why) {
  if (closed_) return;
  HVD_LOG(kWarning) << "store: closing connection from " << peer_ << ": " << why;
  Close();
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  asio::error_code ec;
  timer_.cancel();
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  server_->Forget(this, waiting_ ? &waiting_key_ : nullptr);
  waiting_ = false;
}

Status StoreServerImpl::Listen(const std::string& bind_addr, int port) {
  const std::string where = bind_addr + ":" + std::to_string(port);
  if (port < 0 || port > 65535) return Status::InvalidArgument("store: port out of range: " + where);
  asio::error_code ec;
  asio::ip::address addr = asio::ip::make_address(bind_addr, ec);
  if (ec) return Status::InvalidArgument("store: bad bind address '" + bind_addr + "': " + ec.message());
  tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) KeepFromChildren(acceptor_.native_handle());
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::Internal("store: cannot listen on " + where + ": " + ec.message());
  port_ = acceptor_.local_endpoint(ec).port();
  Accept();
  thread_ = std::thread([this] {
    // Handlers do not throw; this catch only keeps a foreign exception from ending the
    // process through std::terminate.
    try {
      io_.run();
    } catch (const std::exception& e) {
      HVD_LOG(kError) << "store: io thread stopped: " << e.what();
    }
  });
  return Status::OK();
}

void StoreServerImpl::Accept() {
  acceptor_.async_accept([this](asio::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE), most likely: the oldest connection authenticating makes
      // room, and the next accept comes a moment later instead of at once (a spin, and a log
      // line each time, while the shortage lasts).
      accept_failed_.Note(ec.message());
      LimitPendingHandshakes(/*now=*/true);
      accept_retry_.expires_after(std::chrono::milliseconds(20));
      accept_retry_.async_wait([this](const asio::error_code& wait_ec) {
        if (!wait_ec && acceptor_.is_open()) Accept();
      });
      return;
    }
    KeepFromChildren(socket.native_handle());
    asio::error_code opt_ec;
    socket.set_option(tcp::no_delay(true), opt_ec);
    LimitPendingHandshakes();
    auto s = std::make_shared<Session>(std::move(socket), this);
    sessions_[s.get()] = s;
    authenticating_.push_back(s);
    s->Start(secret_, handshake_timeout_);
    Accept();
  });
}

// Makes room for one more authenticating connection: forgets finished ones, then drops the
// oldest while there are too many (a flood of silent connections cannot exhaust descriptors).
void StoreServerImpl::LimitPendingHandshakes(bool now) {
  std::deque<std::weak_ptr<Session>> live;
  for (auto& w : authenticating_) {
    auto s = w.lock();
    if (s && s->authenticating()) live.push_back(std::move(w));
  }
  authenticating_.swap(live);
  const size_t keep =
      now ? std::max<size_t>(authenticating_.size(), 1) - 1 : max_pending_ - 1;
  while (authenticating_.size() > keep) {
    if (auto oldest = authenticating_.front().lock()) {
      evicted_.Note(oldest->peer() + (now ? std::string(" (to free a descriptor)")
                                          : " (" + std::to_string(max_pending_) +
                                                " were authenticating at once)"));
      oldest->Close();
    }
    authenticating_.pop_front();
  }
}

void StoreServerImpl::SetKey(const std::string& key, std::string value) {
  std::string* stored;
  {
    std::lock_guard<std::mutex> l(data_mu_);
    stored = &(data_[key] = std::move(value));  // (an unordered_map's values stay in place)
  }
  const std::string& slot = *stored;
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<std::shared_ptr<Session>> ready = std::move(it->second);
  waiters_.erase(it);
  for (auto& s : ready) s->Deliver(slot);
}

void StoreServerImpl::Forget(Session* s, const std::string* waiting_key) {
  sessions_.erase(s);
  if (waiting_key == nullptr) return;
  auto it = waiters_.find(*waiting_key);
  if (it == waiters_.end()) return;
  auto& v = it->second;
  v.erase(std::remove_if(v.begin(), v.end(), [s](const auto& p) { return p.get() == s; }), v.end());
  if (v.empty()) waiters_.erase(it);
}

void StoreServerImpl::CloseAllOnIoThread() {
  asio::error_code ec;
  acceptor_.close(ec);
  accept_retry_.cancel();
  std::vector<std::shared_ptr<Session>> all;
  for (auto& kv : sessions_) {
    if (auto s = kv.second.lock()) all.push_back(std::move(s));
  }
  for (auto& s : all) s->Close();
  waiters_.clear();
}

void StoreServerImpl::Stop() {
  {
    std::lock_guard<std::mutex> l(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (!thread_.joinable()) return;
  auto closed = std::make_shared<std::promise<void>>();
  std::future<void> done = closed->get_future();
  asio::post(io_, [this, closed] {
    CloseAllOnIoThread();
    closed->set_value();
  });
  if (std::this_thread::get_id() != thread_.get_id()) {
    if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      HVD_LOG(kWarning) << "store: io thread did not close its sessions within 5 s; stopping it";
    }
  }
  io_.stop();
  if (std::this_thread::get_id() == thread_.get_id()) {
    thread_.detach();  // Stop from a handler: the thread ends when this handler returns
  } else {
    thread_.join();
  }
}

}  // namespace

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& bind_addr, int port,
                                                          const std::string& secret,
                                                          double handshake_timeout_seconds) {
  if (!(handshake_timeout_seconds > 0)) {
    return Status::InvalidArgument("store: the handshake timeout must be positive");
  }
  auto server = std::make_unique<StoreServerImpl>(
      secret, std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(handshake_timeout_seconds)));
  Status st = server->Listen(bind_addr, port);
  if (!st.ok()) return st;
  return std::unique_ptr<StoreServer>(std::move(server));
}

}  // namespace hvd
