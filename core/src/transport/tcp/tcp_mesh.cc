#include "transport/tcp/tcp_mesh.h"

#include <poll.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "bootstrap/auth.h"
#include "common/inheritance.h"
#include "common/descriptors.h"
#include "common/logging.h"
#include "transport/tcp/mesh_hello.h"
#include "transport/tcp/tcp_transport.h"

namespace hvd {

namespace {

using asio::ip::tcp;

// Runs `io` until `done()` or the deadline; false on deadline.
template <typename Pred>
bool RunUntil(asio::io_context& io, Deadline deadline, Pred done) {
  while (!done()) {
    auto now = Clock::now();
    if (now >= deadline) return false;
    if (io.stopped()) io.restart();
    io.run_one_for(std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(200)));
  }
  return true;
}

std::string GaveUpKey(int rank) { return "hvd/gave-up/" + std::to_string(rank); }

// True when the peer has closed (or reset) a connection nothing has been read from yet.
bool PeerClosed(tcp::socket& sock) {
  pollfd p{sock.native_handle(), POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) != 1) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  asio::error_code ec;
  return (p.revents & POLLIN) && sock.available(ec) == 0;
}

// Formation is sequential (each rank dials the lower ranks in order), so a rank this one waits
// for may itself be waiting on another. Appends the ranks that never published their address:
// those are the cause. Returns whether there were any.
bool NameAbsentRanks(StoreClient& store, const Options& o, std::ostringstream& os) {
  // Only the store's answer "not there" names a rank: a store busy with a large job's ranks,
  // all failing at once, may not answer in time, and a rank it did not answer for is not
  // named. A failed request ends the walk (the connection may still owe its answer); so does
  // the deadline.
  std::vector<int> absent;
  const Deadline deadline = Clock::now() + std::chrono::seconds(2);
  int unasked = -1;  // the first rank not asked about
  for (int j = 0; j < o.size; ++j) {
    if (j == o.rank) continue;
    std::string addr;
    StatusOr<bool> there = Clock::now() < deadline ? store.TryGet(RankAddressKey(j), &addr, deadline)
                                                   : StatusOr<bool>(Status::Timeout("deadline"));
    if (!there.ok()) {
      unasked = j;
      break;
    }
    if (!*there) absent.push_back(j);
  }
  if (absent.empty()) return false;
  os << "; ranks [" << RankList(absent)
     << "] never reached the rendezvous (not started, died, or its init failed before it "
        "connected: see its own output)";
  if (unasked >= 0) os << " (the store did not answer about ranks " << unasked << " and up)";
  return true;
}

StatusOr<tcp::endpoint> ParseAddr(const std::string& s, int peer) {
  auto colon = s.rfind(':');
  asio::error_code ec;
  if (colon != std::string::npos) {
    auto addr = asio::ip::make_address(s.substr(0, colon), ec);
    int port = std::atoi(s.c_str() + colon + 1);
    if (!ec && port > 0 && port < 65536) return tcp::endpoint(addr, static_cast<uint16_t>(port));
  }
  return Status::InvalidArgument("rendezvous: bad address '" + s + "' published by rank " +
                                 std::to_string(peer));
}

// Connects to `ep` and sends the hello, within the deadline. *dropped: the peer took the
// connection and closed it before its verdict (auth::ClientHandshake).
StatusOr<std::unique_ptr<tcp::socket>> Dial(asio::io_context& io, const tcp::endpoint& ep,
                                            const Hello& hello, int peer,
                                            const std::string& secret, Deadline deadline,
                                            bool* dropped) {
  *dropped = false;
  auto sock = std::make_unique<tcp::socket>(io);
  asio::error_code result = asio::error::would_block;
  sock->open(ep.protocol(), result);
  if (result) {
    return Status::PeerLost("cannot connect to rank " + std::to_string(peer) + ": " +
                            result.message() +
                            (result.category() == asio::system_category()
                                 ? DescriptorLimitNote(result.value())
                                 : std::string()));
  }
  KeepFromChildren(sock->native_handle());
  result = asio::error::would_block;
  sock->async_connect(ep, [&](const asio::error_code& ec) { result = ec; });
  bool finished = RunUntil(io, deadline, [&] { return result != asio::error::would_block; });
  if (!finished || result) {
    asio::error_code ignored;
    sock->close(ignored);
    if (!finished) RunUntil(io, Clock::now() + std::chrono::seconds(1), [&] { return result != asio::error::would_block; });
    std::ostringstream os;
    os << "cannot connect to rank " << peer << " at " << ep << ": "
       << (finished ? result.message() : "timed out");
    return Status::PeerLost(os.str());
  }
  TuneSocket(*sock);
  Status st = auth::ClientHandshake(io, *sock, secret, PackHello(hello), deadline, dropped);
  if (!st.ok()) return st.WithContext("connecting to rank " + std::to_string(peer));
  return sock;
}

// Reads rank j's address from the store and dials it. A refused or misdirected connection
// (the address of an earlier engine of this job, not yet replaced) is retried with the address
// read again, until the deadline.
StatusOr<std::unique_ptr<tcp::socket>> DialRank(asio::io_context& io, StoreClient& store,
                                                const Options& o, int j, uint8_t kind,
                                                Deadline deadline) {
  Status last;  // the last dial's error, once one failed
  Clock::time_point next_check = Clock::now();
  int drops = 0;  // connections rank j took and closed before its verdict
  // The last dial's error at the deadline; where rank j is alive and listening, yet dropped
  // this rank again and again, with a note that its own message says why (a rank short of file
  // descriptors frees them so, TcpMesh's acceptor).
  auto give_up = [&]() -> Status {
    if (drops < 2) return last;
    std::ostringstream os;
    os << last.message() << " (rank " << j << " closed " << drops
       << " of this rank's connections before authenticating them: it may be short of file "
          "descriptors or overloaded; see its own message)";
    return Status(last.code(), os.str());
  };
  while (true) {
    auto a = store.Get(RankAddressKey(j), deadline);
    if (!a.ok()) {
      // The deadline fell while reading the address again after a failed dial (a slow
      // machine): the dial's error is the news, not the store's timeout.
      if (!last.ok() && a.status().code() == StatusCode::kTimeout) return give_up();
      return a.status().WithContext("rendezvous with rank " + std::to_string(j));
    }
    auto ep = ParseAddr(*a, j);
    if (!ep.ok()) return ep.status();
    bool dropped = false;
    auto s = Dial(io, *ep, Hello{kHelloMagic, o.rank, kind, j, o.size}, j, o.secret, deadline,
                  &dropped);
    drops += dropped ? 1 : 0;
    if (s.ok()) return s;
    last = s.status();
    if (Clock::now() + std::chrono::milliseconds(50) >= deadline) return give_up();
    // Rank j may have given up forming the job (its listener is closed): pass its reason on
    // instead of retrying until the deadline. Checked at most twice a second.
    if (!store.collective() && Clock::now() >= next_check) {
      next_check = Clock::now() + std::chrono::milliseconds(500);
      auto why = store.Get(GaveUpKey(j), Clock::now() + std::chrono::milliseconds(50));
      if (why.ok() && !why->empty()) {
        return Status::PeerLost("rank " + std::to_string(j) + " gave up forming the job: " +
                                why->substr((*why)[0] == '?' ? 1 : 0));
      }
    }
    HVD_LOG(kDebug) << "retrying rank " << j << ": " << last.message();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Accepts connections and sorts them by hello into the mesh.
// Shared with its handlers (each holds it), so that one still queued on the io_context after
// formation ended finds it alive; once stopped, no handler touches the mesh or the listener,
// which end with formation.
class Acceptor : public std::enable_shared_from_this<Acceptor> {
 public:
  // Connections are accepted until `deadline` (the job's start deadline), and each has until
  // then to authenticate.
  // `name_identities`: a hello of another world size, or a second one for a rank, fails
  // formation naming it (mismatch()). Not in an elastic job: there a worker of an earlier world
  // (of another size, or the rank's earlier process) may reach a later world's listener on a
  // reused port, and is only dropped, as any stale hello.
  Acceptor(asio::io_context& io, tcp::acceptor& acc, TcpMesh& mesh, int rank, int size,
           bool worker_links, std::string secret, Deadline deadline, bool name_identities)
      : io_(io), acc_(acc), mesh_(mesh), rank_(rank), size_(size), worker_links_(worker_links),
        name_identities_(name_identities), secret_(std::move(secret)), deadline_(deadline),
        retry_(io) {}

  void Start() { AcceptNext(); }
  int remaining() const { return expected_ - got_; }
  void set_expected(int n) { expected_ = n; }
  void Stop() {
    stopped_ = true;
    retry_.cancel();
    for (auto& w : incoming_) {
      if (auto in = w.lock()) {
        asio::error_code ignored;
        if (in->sock) in->sock->close(ignored);  // null once placed in the mesh
      }
    }
  }
  int pending() const { return pending_; }
  // A higher rank whose data connection said it makes links between workers where this rank
  // does not, or the reverse (-1: none).
  int knob_mismatch() const { return knob_mismatch_; }
  // Ranks that do not form one world: another world size, or a rank claimed twice (none: empty).
  const std::optional<std::string>& mismatch() const { return mismatch_; }
  // Why accepting failed for lack of descriptors, for the timeout's message ("": it did not).
  const std::string& short_of_descriptors() const { return short_of_descriptors_; }

 private:
  struct Incoming {
    std::unique_ptr<tcp::socket> sock;  // null once placed in the mesh (or dropped)
  };
  // Connections authenticating at once, at most (as the store's; fewer under a low descriptor
  // limit, AuthenticatingCap, but never fewer than the job's other ranks, which may all dial
  // this one at once): past it the oldest is dropped, so that strangers holding silent
  // connections cannot use up this rank's file descriptors. A rank's own dial authenticates in
  // milliseconds, and one dropped is dialled again (DialRank).
  static constexpr size_t kMaxAuthenticating = 256;

  void AcceptNext() {
    if (stopped_) return;
    auto sock = std::make_shared<std::unique_ptr<tcp::socket>>(std::make_unique<tcp::socket>(io_));
    ++pending_;
    acc_.async_accept(**sock, [this, self = shared_from_this(), sock](const asio::error_code& ec) {
      --pending_;
      if (stopped_ || ec == asio::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors (EMFILE), or a connection gone before it was taken: no reason to
        // stop accepting for good. The oldest connection still authenticating makes room, and
        // the next accept comes a moment later (not a spin while the shortage lasts).
        accept_failed_.Note(ec.message());
        if (ec.category() == asio::system_category() &&
            (ec.value() == EMFILE || ec.value() == ENFILE)) {
          short_of_descriptors_ = ec.message() + DescriptorLimitNote(ec.value());
        }
        DropAuthenticating(0, /*one=*/true);
        ++pending_;
        retry_.expires_after(std::chrono::milliseconds(20));
        retry_.async_wait([this, self](const asio::error_code& wait_ec) {
          --pending_;
          if (!wait_ec && !stopped_) AcceptNext();
        });
        return;
      }
      KeepFromChildren((*sock)->native_handle());
      DropAuthenticating(max_authenticating_ - 1);
      auto in = std::make_shared<Incoming>();
      in->sock = std::move(*sock);
      incoming_.push_back(in);
      ReadHello(in);
      AcceptNext();
    });
  }

  // Closes the oldest connections still authenticating until at most `keep` are (`one`: the
  // oldest, to free its descriptor); forgets the ones done.
  void DropAuthenticating(size_t keep, bool one = false) {
    std::vector<std::shared_ptr<Incoming>> live;
    for (auto& w : incoming_) {
      auto in = w.lock();
      if (in && in->sock) live.push_back(std::move(in));
    }
    incoming_.assign(live.begin(), live.end());
    if (one) keep = std::max<size_t>(live.size(), 1) - 1;
    for (size_t i = 0; i + keep < live.size(); ++i) {
      evicted_.Note(one ? std::string("to free a descriptor")
                        : std::to_string(max_authenticating_) + " connections were authenticating");
      asio::error_code ignored;
      live[i]->sock->close(ignored);  // its handshake fails and drops it
    }
  }

  // The hello travels as the authenticated context of the handshake (bootstrap/auth.h), so
  // a peer can only claim a rank if it knows the job's secret.
  void ReadHello(std::shared_ptr<Incoming> in) {
    ++pending_;
    auto check = [this, self = shared_from_this()](const std::string& context) {
      return CheckHello(UnpackHello(context), rank_, size_, worker_links_);
    };
    auto left = std::max<Clock::duration>(deadline_ - Clock::now(), std::chrono::milliseconds(1));
    auth::AcceptHandshake(*in->sock, secret_, kHelloBytes, in,
                          [this, self = shared_from_this(), in](const Status& st,
                                                                const std::string& context) {
                            --pending_;
                            if (stopped_) return;  // (Stop closed it: nothing to report)
                            if (!st.ok()) {
                              dropped_.Note(st.message());
                              return;
                            }
                            Place(UnpackHello(context), std::move(in->sock));
                          },
                          check, left);
  }

  void Place(const Hello& h, std::unique_ptr<tcp::socket> sock) {
    if (h.size != size_) {  // (authenticated: a process of this job, started with another size)
      if (!mismatch_ && name_identities_) {
        mismatch_ = "rank " + std::to_string(h.rank) + " was started in a world of " +
                    std::to_string(h.size) + " ranks and rank " + std::to_string(rank_) +
                    " in a world of " + std::to_string(size_) + " (HVD_SIZE differs between ranks)";
      }
      dropped_.Note("a hello from a world of " + std::to_string(h.size) + " ranks");
      asio::error_code ignored;
      sock->close(ignored);
      return;
    }
    bool ok = CheckHello(h, rank_, size_, worker_links_).ok();
    if (ok && IsData(h.kind) && (h.kind == kKindDataWorkerLinks) != worker_links_ &&
        knob_mismatch_ < 0) {
      knob_mismatch_ = h.rank;
    }
    auto& slot = !ok ? sock : (IsData(h.kind) ? mesh_.data[h.rank] : mesh_.control[h.rank]);
    if (ok && slot && !mismatch_ && name_identities_) {
      // A rank dials each lower rank once per kind: a second authenticated hello is another
      // process of this job that was given the same rank.
      mismatch_ = "two processes claim rank " + std::to_string(h.rank) +
                  " (each connected to rank " + std::to_string(rank_) +
                  "): every process needs its own HVD_RANK";
    }
    if (!ok || slot) {
      std::ostringstream os;
      os << "an unexpected hello (magic " << std::hex << h.magic << std::dec << ", rank "
         << h.rank << ", kind " << int(h.kind) << ")";
      dropped_.Note(os.str());
      asio::error_code ignored;
      sock->close(ignored);
      return;
    }
    TuneSocket(*sock);
    slot = std::move(sock);
    ++got_;
  }

  asio::io_context& io_;
  tcp::acceptor& acc_;
  TcpMesh& mesh_;
  const int rank_, size_;
  const size_t max_authenticating_ =
      std::max(AuthenticatingCap(kMaxAuthenticating), static_cast<size_t>(std::max(size_ - 1, 1)));
  const bool worker_links_;
  const bool name_identities_;
  const std::string secret_;
  const Deadline deadline_;
  std::vector<std::weak_ptr<Incoming>> incoming_;
  int expected_ = 0, got_ = 0, pending_ = 0, knob_mismatch_ = -1;
  std::optional<std::string> mismatch_;
  std::string short_of_descriptors_;
  bool stopped_ = false;
  asio::steady_timer retry_;  // the next accept after a failed one
  // A stranger may open any number of connections while the job forms.
  LimitedWarning dropped_{"dropped a connection"};
  LimitedWarning evicted_{"dropped the oldest connection still authenticating"};
  LimitedWarning accept_failed_{"accepting a connection failed (accepting goes on)"};
};

}  // namespace

// A rank that gives up forming the job leaves its reason in the store (one rank's own write: not
// with the MPI bootstrap, whose Set is collective), so that a peer that sees its connections
// close can tell "gave up, because ..." from "died".
StatusOr<std::unique_ptr<TcpMesh>> TcpMesh::Create(asio::io_context& io, const Options& o,
                                                    StoreClient& store, Deadline deadline) {
  // An empty reason: this rank has not given up (again, should an engine start once more).
  if (!store.collective()) HVD_RETURN_IF_ERROR(store.Set(GaveUpKey(o.rank), "", deadline));
  auto mesh = Form(io, o, store, deadline);
  if (!mesh.ok()) LeaveGaveUpNote(store, o.rank, mesh.status());
  return mesh;
}

// A provisional note starts with '?': its writer is still finding out why its own peer went.
void LeaveGaveUpNote(StoreClient& store, int rank, const Status& why, bool provisional) {
  if (store.collective()) return;
  Status ignored = store.Set(GaveUpKey(rank), (provisional ? "?" : "") + why.message(),
                             Clock::now() + std::chrono::seconds(1));
  (void)ignored;
}

// A peer that gave up writes its reason right after closing: wait for it briefly, and a little
// longer for the final version of a provisional one. Empty: none came.
static std::string GaveUpReason(StoreClient& store, int peer) {
  auto until = Clock::now() + std::chrono::milliseconds(500);
  bool extended = false;
  std::string last;
  while (Clock::now() < until) {
    StatusOr<std::string> why = store.Get(GaveUpKey(peer), until);
    if (!why.ok()) break;
    if (!why->empty()) {
      const bool provisional = (*why)[0] == '?';
      last = provisional ? why->substr(1) : *why;
      if (!provisional) break;
      if (!extended) {
        until = Clock::now() + std::chrono::milliseconds(1500);
        extended = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return last;
}

Status ExplainLostPeer(StoreClient& store, int peer, const Status& what) {
  if (store.collective() || peer < 0) return what;
  const std::string why = GaveUpReason(store, peer);
  if (why.empty()) return what;
  return Status::PeerLost("rank " + std::to_string(peer) + " gave up forming the job: " + why);
}

StatusOr<std::unique_ptr<TcpMesh>> TcpMesh::Form(asio::io_context& io, const Options& o,
                                                  StoreClient& store, Deadline deadline) {
  auto mesh = std::make_unique<TcpMesh>();
  mesh->data.resize(o.size);
  const bool worker_links =
      WorkerLinks(o.size, o.symmetric_negotiation == Options::Toggle::kOn);
  mesh->control.resize(o.rank == 0 || worker_links ? o.size : 1);
  const bool control_from_higher = o.rank == 0 || worker_links;

  // 1. Listen and publish.
  asio::error_code ec;
  auto bind = asio::ip::make_address(o.bind_addr, ec);
  if (ec) return Status::InvalidArgument("HVD_BIND_ADDR='" + o.bind_addr + "' is not an IP address");
  tcp::acceptor acc(io);
  acc.open(bind.is_v6() ? tcp::v6() : tcp::v4(), ec);
  if (!ec) KeepFromChildren(acc.native_handle());
  if (!ec) acc.bind(tcp::endpoint(bind, 0), ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::Internal("cannot listen on " + o.bind_addr + ": " + ec.message());
  std::ostringstream addr;
  addr << acc.local_endpoint().address().to_string() << ":" << acc.local_endpoint().port();
  HVD_RETURN_IF_ERROR(store.Set(RankAddressKey(o.rank), addr.str(), deadline));

  auto acceptor_ptr =
      std::make_shared<Acceptor>(io, acc, *mesh, o.rank, o.size, worker_links, o.secret, deadline,
                                 /*name_identities=*/!o.elastic);
  Acceptor& acceptor = *acceptor_ptr;
  acceptor.set_expected((o.size - 1 - o.rank) * (control_from_higher ? 2 : 1));
  acceptor.Start();
  // Whichever way formation ends (a lower rank that cannot be reached returns at once), the
  // acceptor stops: connections half accepted are closed, and no handler left on the
  // io_context reaches the mesh or the listener after them.
  struct StopOnExit {
    Acceptor& a;
    ~StopOnExit() { a.Stop(); }
  } stop_on_exit{acceptor};

  // 2. Dial the lower ranks.
  for (int j = 0; j < o.rank; ++j) {
    auto s = DialRank(io, store, o, j, worker_links ? kKindDataWorkerLinks : kKindData, deadline);
    if (!s.ok()) return s.status();
    mesh->data[j] = std::move(*s);
    if (j == 0 || worker_links) {
      auto c = DialRank(io, store, o, j, kKindControl, deadline);
      if (!c.ok()) return c.status();
      mesh->control[j] = std::move(*c);
    }
  }

  // 3. Accept the higher ranks. A peer that closes a connection it already made has died or
  //    given up: stop waiting at once and name it, rather than at the start deadline.
  int gone = -1;
  Clock::time_point next_check = Clock::now();
  bool all = RunUntil(io, deadline, [&] {
    if (acceptor.remaining() == 0 || acceptor.knob_mismatch() >= 0 || acceptor.mismatch()) {
      return true;
    }
    if (Clock::now() < next_check) return false;
    next_check = Clock::now() + std::chrono::milliseconds(100);
    for (int j = 0; j < o.size && gone < 0; ++j) {
      if (mesh->data[j] && PeerClosed(*mesh->data[j])) gone = j;
    }
    return gone >= 0;
  });
  // 4. Close the listener and let the cancelled handlers run.
  acceptor.Stop();
  acc.close(ec);
  RunUntil(io, Clock::now() + std::chrono::seconds(2), [&] { return acceptor.pending() == 0; });
  if (acceptor.mismatch()) {
    return Status::FailedPrecondition(*acceptor.mismatch() +
                                      "; every rank of a job must be started with the same "
                                      "HVD_SIZE and a rank of its own (hvdrun, mpirun and Slurm "
                                      "do both)");
  }
  if (acceptor.knob_mismatch() >= 0) {
    const std::string j = std::to_string(acceptor.knob_mismatch()), me = std::to_string(o.rank);
    return Status::FailedPrecondition(
        "HVD_SYMMETRIC_NEGOTIATION differs between ranks: rank " + (worker_links ? me : j) +
        " has it on and rank " + (worker_links ? j : me) + " does not (rank " + j +
        "'s connection says so); it must be the same on every rank");
  }
  if (gone >= 0) {
    const std::string why = GaveUpReason(store, gone);
    std::ostringstream os;
    if (!why.empty()) {
      os << "rank " << gone << " gave up forming the job: " << why;
    } else {
      os << "rank " << gone << " closed its connection to rank " << o.rank
         << " while the job was forming (it died)";
      NameAbsentRanks(store, o, os);
    }
    // A peer that gave up waiting for this rank to take its connections gave up because of it.
    if (!acceptor.short_of_descriptors().empty()) {
      os << "; accepting the peers' connections failed here: " << acceptor.short_of_descriptors();
    }
    return Status::PeerLost(os.str());
  }
  if (!all) {
    std::ostringstream os;
    os << "rank " << o.rank << " timed out waiting for connections from ranks [";
    bool first = true;
    for (int j = o.rank + 1; j < o.size; ++j) {
      if (!mesh->data[j] || (control_from_higher && !mesh->control[j])) {
        os << (first ? "" : ", ") << j;
        first = false;
      }
    }
    os << "]";
    if (!acceptor.short_of_descriptors().empty()) {
      os << "; accepting their connections failed here: " << acceptor.short_of_descriptors();
    } else if (!NameAbsentRanks(store, o, os)) {
      os << " (are all ranks started, with the same HVD_SIZE?)";
    }
    return Status::Timeout(os.str());
  }
  return mesh;
}

}  // namespace hvd
