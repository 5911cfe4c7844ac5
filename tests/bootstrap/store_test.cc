// Tests of the rendezvous store: client and server in one process, plus raw sockets that send
// garbage the real client never would.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "bootstrap/auth.h"
#include "bootstrap/elastic.h"
#include "bootstrap/store.h"
#include "bootstrap/store_wire.h"

namespace hvd {
namespace {

std::unique_ptr<StoreServer> StartServer() {
  auto s = StoreServer::Start("127.0.0.1", 0);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

std::unique_ptr<StoreClient> Connect(int port) {
  auto c = StoreClient::Connect("127.0.0.1", port, DeadlineAfterSeconds(5));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

// A raw TCP connection to the server that has passed the authentication handshake (empty
// secret, as StartServer's), for sending malformed frames.
int RawConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(0, ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)));
  auth::Nonce ns, nc = auth::RandomNonce();
  EXPECT_EQ(static_cast<ssize_t>(ns.size()), ::recv(fd, ns.data(), ns.size(), MSG_WAITALL));
  auth::Mac mac = auth::Proof("", "hvd client", ns, nc, "store");
  std::string hello = "store";
  hello.append(reinterpret_cast<const char*>(nc.data()), nc.size());
  hello.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  EXPECT_EQ(static_cast<ssize_t>(hello.size()), ::send(fd, hello.data(), hello.size(), 0));
  uint8_t reply[1 + auth::kMacBytes];  // the verdict, then the server's proof
  EXPECT_EQ(static_cast<ssize_t>(sizeof(reply)), ::recv(fd, reply, sizeof(reply), MSG_WAITALL));
  EXPECT_EQ(reply[0], auth::kVerdictAccepted);
  return fd;
}

// True when the server closes `fd` within `ms` milliseconds.
bool ClosedWithin(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, 0) <= 0;
}

TEST(Store, SetThenGet) {
  auto server = StartServer();
  auto c = Connect(server->port());
  ASSERT_TRUE(c->Set("a", "1", DeadlineAfterSeconds(5)).ok());
  auto v = c->Get("a", DeadlineAfterSeconds(5));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ("1", *v);
  ASSERT_TRUE(c->Set("a", "2", DeadlineAfterSeconds(5)).ok());  // overwrite
  EXPECT_EQ("2", *c->Get("a", DeadlineAfterSeconds(5)));
  ASSERT_TRUE(c->Set("empty", "", DeadlineAfterSeconds(5)).ok());
  EXPECT_EQ("", *c->Get("empty", DeadlineAfterSeconds(5)));
}

TEST(Store, GetBeforeSetWakes) {
  auto server = StartServer();
  auto waiter = Connect(server->port());
  std::atomic<bool> got{false};
  std::string value;
  std::thread t([&] {
    auto v = waiter->Get("late", DeadlineAfterSeconds(10));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    value = *v;
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(got.load());
  auto setter = Connect(server->port());
  ASSERT_TRUE(setter->Set("late", "here", DeadlineAfterSeconds(5)).ok());
  t.join();
  EXPECT_EQ("here", value);
}

TEST(Store, ManyConcurrentClients) {
  auto server = StartServer();
  const int n = 32;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto c = StoreClient::Connect("127.0.0.1", server->port(), DeadlineAfterSeconds(10));
      if (!c.ok()) return;
      // Everyone publishes, then everyone reads everyone (an all-gather of addresses).
      if (!(*c)->Set("rank/" + std::to_string(i), "addr" + std::to_string(i),
                     DeadlineAfterSeconds(10)).ok()) return;
      for (int j = 0; j < n; ++j) {
        auto v = (*c)->Get("rank/" + std::to_string(j), DeadlineAfterSeconds(10));
        if (!v.ok() || *v != "addr" + std::to_string(j)) return;
      }
      ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(n, ok.load());
}

TEST(Store, GetTimesOutNamingKey) {
  auto server = StartServer();
  auto c = Connect(server->port());
  auto start = std::chrono::steady_clock::now();
  auto v = c->Get("never-set", DeadlineAfterSeconds(0.3));
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(StatusCode::kTimeout, v.status().code());
  EXPECT_NE(std::string::npos, v.status().message().find("never-set")) << v.status().ToString();
  EXPECT_LT(took, std::chrono::seconds(2));
  // The client recovers: a late answer to the old Get is not taken for the next request.
  ASSERT_TRUE(c->Set("never-set", "now", DeadlineAfterSeconds(5)).ok());
  ASSERT_TRUE(c->Set("other", "x", DeadlineAfterSeconds(5)).ok());
  EXPECT_EQ("x", *c->Get("other", DeadlineAfterSeconds(5)));
}

TEST(Store, ConnectRetriesUntilServerStarts) {
  // Find a free port, release it, start the server there a little later.
  auto probe = StartServer();
  int port = probe->port();
  probe.reset();
  std::unique_ptr<StoreServer> server;
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto s = StoreServer::Start("127.0.0.1", port);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server = std::move(s).value();
  });
  auto c = StoreClient::Connect("127.0.0.1", port, DeadlineAfterSeconds(10));
  later.join();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->Set("k", "v", DeadlineAfterSeconds(5)).ok());
}

TEST(Store, ConnectTimesOutNamingAddress) {
  auto probe = StartServer();
  int port = probe->port();
  probe.reset();
  auto c = StoreClient::Connect("127.0.0.1", port, DeadlineAfterSeconds(0.3));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(StatusCode::kTimeout, c.status().code());
  EXPECT_NE(std::string::npos, c.status().message().find("127.0.0.1:" + std::to_string(port)));
}

TEST(Store, ClosedServerGivesClearStatus) {
  auto server = StartServer();
  int port = server->port();
  auto c = Connect(port);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    server->Stop();
    server->Stop();  // idempotent
  });
  auto v = c->Get("pending", DeadlineAfterSeconds(10));
  stopper.join();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(StatusCode::kPeerLost, v.status().code()) << v.status().ToString();
  EXPECT_NE(std::string::npos, v.status().message().find("127.0.0.1:" + std::to_string(port)));
  // Later calls fail within their deadline rather than hang.
  auto s = c->Set("x", "y", DeadlineAfterSeconds(0.3));
  EXPECT_FALSE(s.ok());
}

TEST(Store, GarbageFramesCloseOnlyThatConnection) {
  auto server = StartServer();
  auto good = Connect(server->port());
  ASSERT_TRUE(good->Set("k", "v", DeadlineAfterSeconds(5)).ok());

  // Oversize length.
  int fd = RawConnect(server->port());
  unsigned char big[4] = {0xff, 0xff, 0xff, 0x7f};
  ASSERT_EQ(4, ::send(fd, big, 4, 0));
  EXPECT_TRUE(ClosedWithin(fd, 5000));
  ::close(fd);

  // Unknown op.
  fd = RawConnect(server->port());
  std::string bad = store_wire::Frame(store_wire::RequestPayload('X', "k", ""));
  ASSERT_EQ(static_cast<ssize_t>(bad.size()), ::send(fd, bad.data(), bad.size(), 0));
  EXPECT_TRUE(ClosedWithin(fd, 5000));
  ::close(fd);

  // Key longer than 4 KiB.
  fd = RawConnect(server->port());
  bad = store_wire::Frame(store_wire::RequestPayload('G', std::string(5000, 'k'), ""));
  ASSERT_EQ(static_cast<ssize_t>(bad.size()), ::send(fd, bad.data(), bad.size(), 0));
  EXPECT_TRUE(ClosedWithin(fd, 5000));
  ::close(fd);

  // Key length pointing past the frame, and a short frame.
  fd = RawConnect(server->port());
  std::string p = "S";
  store_wire::PutU32(&p, 100);
  bad = store_wire::Frame(p) + store_wire::Frame("G");
  ASSERT_EQ(static_cast<ssize_t>(bad.size()), ::send(fd, bad.data(), bad.size(), 0));
  EXPECT_TRUE(ClosedWithin(fd, 5000));
  ::close(fd);

  // A client that connects and leaves while its Get is parked.
  fd = RawConnect(server->port());
  std::string get = store_wire::Frame(store_wire::RequestPayload('G', "parked", ""));
  ASSERT_EQ(static_cast<ssize_t>(get.size()), ::send(fd, get.data(), get.size(), 0));
  ::close(fd);

  // The good client and new clients are still served.
  EXPECT_EQ("v", *good->Get("k", DeadlineAfterSeconds(5)));
  ASSERT_TRUE(good->Set("parked", "p", DeadlineAfterSeconds(5)).ok());
  auto fresh = Connect(server->port());
  EXPECT_EQ("p", *fresh->Get("parked", DeadlineAfterSeconds(5)));
}

TEST(Store, BinaryAndLargeValues) {
  auto server = StartServer();
  auto c = Connect(server->port());
  std::string binary("a\0b\0\0c\xff", 7);
  std::string key("k\0ey", 4);
  ASSERT_TRUE(c->Set(key, binary, DeadlineAfterSeconds(5)).ok());
  auto v = c->Get(key, DeadlineAfterSeconds(5));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(binary, *v);

  std::string large(1 << 20, '\0');
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 131 + 7);
  ASSERT_TRUE(c->Set("large", large, DeadlineAfterSeconds(10)).ok());
  auto other = Connect(server->port());
  auto lv = other->Get("large", DeadlineAfterSeconds(10));
  ASSERT_TRUE(lv.ok()) << lv.status().ToString();
  EXPECT_EQ(large, *lv);
}

TEST(Store, OversizeRequestsRejectedByClient) {
  auto server = StartServer();
  auto c = Connect(server->port());
  EXPECT_EQ(StatusCode::kInvalidArgument,
            c->Set(std::string(5000, 'k'), "v", DeadlineAfterSeconds(5)).code());
  EXPECT_EQ(StatusCode::kInvalidArgument,
            c->Set("k", std::string(17 << 20, 'v'), DeadlineAfterSeconds(5)).code());
  EXPECT_TRUE(c->Set("k", "still fine", DeadlineAfterSeconds(5)).ok());
}

TEST(Store, StopWithManyWaitersIsPrompt) {
  auto server = StartServer();
  std::vector<std::unique_ptr<StoreClient>> clients;
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) clients.push_back(Connect(server->port()));
  std::atomic<int> failed{0};
  for (auto& c : clients) {
    threads.emplace_back([&failed, cl = c.get()] {
      if (!cl->Get("never", DeadlineAfterSeconds(20)).ok()) ++failed;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto start = std::chrono::steady_clock::now();
  server.reset();  // the destructor stops
  for (auto& t : threads) t.join();
  EXPECT_EQ(8, failed.load());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

}  // namespace
}  // namespace hvd

namespace hvd {
namespace {

TEST(Store, TryGetAnswersAtOnce) {
  auto server = StartServer();
  auto c = Connect(server->port());
  std::string v = "untouched";
  auto t0 = Clock::now();
  auto found = c->TryGet("missing", &v, DeadlineAfterSeconds(5));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_FALSE(*found);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  ASSERT_TRUE(c->Set("k", "value", DeadlineAfterSeconds(5)).ok());
  found = c->TryGet("k", &v, DeadlineAfterSeconds(5));
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE(*found);
  EXPECT_EQ("value", v);
  // The connection stays usable after an absent answer.
  EXPECT_EQ("value", *c->Get("k", DeadlineAfterSeconds(5)));
}

// The hosting process reads keys directly (hvdrun's failure notes), while clients write them
// from other threads.
TEST(Store, LookupReadsWhatClientsSet) {
  auto server = StartServer();
  std::string v = "untouched";
  EXPECT_FALSE(server->Lookup("k", &v));
  EXPECT_EQ("untouched", v);
  auto c = Connect(server->port());
  ASSERT_TRUE(c->Set("k", "first", DeadlineAfterSeconds(5)).ok());
  EXPECT_TRUE(server->Lookup("k", &v));
  EXPECT_EQ("first", v);
  std::thread writer([&] {
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(c->Set("k" + std::to_string(i % 7), std::string(i, 'x'), DeadlineAfterSeconds(5)).ok());
    }
  });
  for (int i = 0; i < 2000; ++i) {
    std::string w;
    if (server->Lookup("k" + std::to_string(i % 7), &w)) {
      ASSERT_TRUE(w.find_first_not_of('x') == std::string::npos) << w;
    }
  }
  writer.join();
  EXPECT_TRUE(server->Lookup("k6", &v));
  EXPECT_EQ(std::string(195, 'x'), v);  // the last of i % 7 == 6 below 200
}

// Rank, local and cross places of "<id> <host>" lines, against the definitions: local rank
// counts earlier lines of the host; cross rank counts the hosts (first-appearance order) that
// have that local rank.
TEST(Elastic, PlaceInWorldFollowsTheLines) {
  const std::string world = "w0 a\nw1 b\nw2 a\nw3 c\nw4 a\n";
  struct Want { const char* id; int rank, local_rank, local_size, cross_rank, cross_size; };
  const Want want[] = {{"w0", 0, 0, 3, 0, 3}, {"w1", 1, 0, 1, 1, 3}, {"w2", 2, 1, 3, 0, 1},
                       {"w3", 3, 0, 1, 2, 3}, {"w4", 4, 2, 3, 0, 1}};
  for (const Want& w : want) {
    Options o;
    ASSERT_TRUE(PlaceInWorld(world, w.id, 7, &o).ok()) << w.id;
    EXPECT_EQ(w.rank, o.rank) << w.id;
    EXPECT_EQ(5, o.size);
    EXPECT_EQ(w.local_rank, o.local_rank) << w.id;
    EXPECT_EQ(w.local_size, o.local_size) << w.id;
    EXPECT_EQ(w.cross_rank, o.cross_rank) << w.id;
    EXPECT_EQ(w.cross_size, o.cross_size) << w.id;
    EXPECT_EQ(7, o.elastic_generation);
    EXPECT_EQ("g7/", o.store_prefix);
  }
  Options o;
  Status s = PlaceInWorld(world, "gone", 7, &o);
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code());
  EXPECT_NE(std::string::npos, s.message().find("gone")) << s.message();
  EXPECT_EQ(StatusCode::kInvalidArgument, PlaceInWorld("w0 a extra\n", "w0", 1, &o).code());
  EXPECT_EQ(StatusCode::kInvalidArgument, PlaceInWorld("w0 a\nw0 b\n", "w0", 1, &o).code());
  EXPECT_EQ(StatusCode::kInvalidArgument, PlaceInWorld("", "w0", 1, &o).code());
}

// Two workers join: world 1 names a third worker that never comes; world 2 (published while
// they wait) leaves it out, and both join world 2 with their places in it.
TEST(Elastic, JoinWorldTakesTheNewerWorldWhenOneNeverFills) {
  auto server = StartServer();
  auto driver = Connect(server->port());
  ASSERT_TRUE(driver->Set(ElasticWorldKey(1), "x a\ny a\nz b\n", DeadlineAfterSeconds(5)).ok());
  ASSERT_TRUE(driver->Set(kElasticLatestKey, "1", DeadlineAfterSeconds(5)).ok());
  std::vector<Options> got(2);
  std::vector<Status> st(2);
  std::vector<std::thread> workers;
  const char* ids[] = {"y", "x"};
  for (int i = 0; i < 2; ++i) {
    workers.emplace_back([&, i] {
      auto c = Connect(server->port());
      got[i].elastic_id = ids[i];
      st[i] = JoinWorld(*c, &got[i], DeadlineAfterSeconds(20));
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both wait for "z"
  ASSERT_TRUE(driver->Set(ElasticWorldKey(2), "y a\nx c\n", DeadlineAfterSeconds(5)).ok());
  ASSERT_TRUE(driver->Set(kElasticLatestKey, "2", DeadlineAfterSeconds(5)).ok());
  for (auto& t : workers) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(st[i].ok()) << st[i].ToString();
    EXPECT_EQ(2, got[i].elastic_generation);
    EXPECT_EQ(2, got[i].size);
  }
  EXPECT_EQ(0, got[0].rank);
  EXPECT_EQ(1, got[1].rank);
  EXPECT_EQ("c", got[1].hostname);
  EXPECT_EQ(1, got[1].cross_rank);
  // A worker that already ran world 2 waits for a newer one, and times out naming why.
  Options late;
  late.elastic_id = "x";
  late.elastic_after_generation = 2;
  auto c = Connect(server->port());
  Status s = JoinWorld(*c, &late, DeadlineAfterSeconds(0.3));
  EXPECT_EQ(StatusCode::kTimeout, s.code());
  EXPECT_NE(std::string::npos, s.message().find("generation 2")) << s.message();
  // Once hvdrun says a worker finished, no world comes: a worker that trained (a reset) hears
  // it at once; one that never did (started for a world that did not form) waits on, for
  // hvdrun to stop it.
  const std::string finished = "worker y (rank 0 of world 2) finished (exited 0)";
  ASSERT_TRUE(driver->Set(kElasticFinishedKey, finished, DeadlineAfterSeconds(5)).ok());
  const auto start = std::chrono::steady_clock::now();
  s = JoinWorld(*c, &late, DeadlineAfterSeconds(20), /*trained=*/true);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("no new world will form: " + finished))
      << s.message();
  s = JoinWorld(*c, &late, DeadlineAfterSeconds(0.3), /*trained=*/false);
  EXPECT_EQ(StatusCode::kTimeout, s.code()) << s.ToString();
}

}  // namespace
}  // namespace hvd
