// Authentication of the job's connections (bootstrap/auth.h), through the rendezvous store:
// strangers without the secret, with a wrong one, replaying a recorded handshake, sending
// garbage or nothing are each refused, and the job's data is unaffected.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "bootstrap/auth.h"
#include "bootstrap/store.h"
#include "bootstrap/store_wire.h"

namespace hvd {
namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";

int Dial(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(0, ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)));
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// True when the server closes `fd` within `ms` milliseconds (EOF or reset).
bool ClosedWithin(int fd, int ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char c[64];
    ssize_t n = ::recv(fd, c, sizeof(c), 0);
    if (n <= 0) return true;
  }
  return false;
}

// The client's half of the handshake for challenge `ns`, as a byte string.
std::string ClientMessage(const std::string& secret, const auth::Nonce& ns, const auth::Nonce& nc) {
  auth::Mac mac = auth::Proof(secret, "hvd client", ns, nc, "store");
  std::string m = "store";
  m.append(reinterpret_cast<const char*>(nc.data()), nc.size());
  m.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  return m;
}

auth::Nonce ReadChallenge(int fd) {
  auth::Nonce ns{};
  EXPECT_EQ(static_cast<ssize_t>(ns.size()), ::recv(fd, ns.data(), ns.size(), MSG_WAITALL));
  return ns;
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = StoreServer::Start("127.0.0.1", 0, kSecret);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    auto c = StoreClient::Connect("127.0.0.1", server_->port(), DeadlineAfterSeconds(5), kSecret);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    good_ = std::move(c).value();
    ASSERT_TRUE(good_->Set("weights", "v1", DeadlineAfterSeconds(5)).ok());
  }
  // The job goes on: the good client still reads what it wrote and can write more.
  void ExpectJobUnaffected() {
    auto v = good_->Get("weights", DeadlineAfterSeconds(5));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ("v1", *v);
    ASSERT_TRUE(good_->Set("after", "x", DeadlineAfterSeconds(5)).ok());
  }
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> good_;
};

TEST_F(AuthTest, ClientWithTheSecretWorks) {
  auto c = StoreClient::Connect("127.0.0.1", server_->port(), DeadlineAfterSeconds(5), kSecret);
  ASSERT_TRUE(c.ok());
  auto v = (*c)->Get("weights", DeadlineAfterSeconds(5));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ("v1", *v);
}

TEST_F(AuthTest, ClientWithoutOrWithWrongSecretIsRefused) {
  for (const std::string& secret : {std::string(), std::string("wrong-secret")}) {
    auto start = std::chrono::steady_clock::now();
    auto c = StoreClient::Connect("127.0.0.1", server_->port(), DeadlineAfterSeconds(5), secret);
    EXPECT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kPeerLost) << c.status().ToString();
    EXPECT_NE(c.status().message().find("rendezvous store"), std::string::npos);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  }
  ExpectJobUnaffected();
}

TEST_F(AuthTest, ServerWithoutTheSecretIsDetectedByTheClient) {
  auto impostor = StoreServer::Start("127.0.0.1", 0, "other-job");
  ASSERT_TRUE(impostor.ok());
  auto c = StoreClient::Connect("127.0.0.1", (*impostor)->port(), DeadlineAfterSeconds(5), kSecret);
  EXPECT_FALSE(c.ok());
}

TEST_F(AuthTest, ReplayedHandshakeIsRefused) {
  // Record a valid handshake on one connection...
  int fd1 = Dial(server_->port());
  auth::Nonce ns1 = ReadChallenge(fd1);
  std::string recorded = ClientMessage(kSecret, ns1, auth::RandomNonce());
  ASSERT_EQ(static_cast<ssize_t>(recorded.size()), ::send(fd1, recorded.data(), recorded.size(), 0));
  auth::Mac reply;
  ASSERT_EQ(static_cast<ssize_t>(reply.size()), ::recv(fd1, reply.data(), reply.size(), MSG_WAITALL));
  ::close(fd1);
  // ...and replay it on another: the server's challenge differs, so the proof does not match.
  int fd2 = Dial(server_->port());
  auth::Nonce ns2 = ReadChallenge(fd2);
  EXPECT_NE(ns1, ns2);
  ASSERT_EQ(static_cast<ssize_t>(recorded.size()), ::send(fd2, recorded.data(), recorded.size(), 0));
  EXPECT_TRUE(ClosedWithin(fd2, 3000));
  ::close(fd2);
  ExpectJobUnaffected();
}

TEST_F(AuthTest, GarbageAndFramesWithoutHandshakeAreRefused) {
  int fd = Dial(server_->port());
  ReadChallenge(fd);
  std::string garbage(200, '\xff');
  ASSERT_EQ(static_cast<ssize_t>(garbage.size()), ::send(fd, garbage.data(), garbage.size(), 0));
  EXPECT_TRUE(ClosedWithin(fd, 3000));
  ::close(fd);
  // A well-formed store request with no handshake: its bytes do not prove anything either.
  fd = Dial(server_->port());
  ReadChallenge(fd);
  std::string set = store_wire::Frame(store_wire::RequestPayload('S', "weights", "evil"));
  set.resize(5 + auth::kNonceBytes + auth::kMacBytes, 'x');
  ASSERT_EQ(static_cast<ssize_t>(set.size()), ::send(fd, set.data(), set.size(), 0));
  EXPECT_TRUE(ClosedWithin(fd, 3000));
  ::close(fd);
  ExpectJobUnaffected();
}

TEST_F(AuthTest, SilentClientIsDroppedAfterTheHandshakeTimeout) {
  int fd = Dial(server_->port());
  ReadChallenge(fd);
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(ClosedWithin(fd, 9000));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  ::close(fd);
  ExpectJobUnaffected();
}

TEST(AuthProof, DependsOnEveryInput) {
  auth::Nonce a = auth::RandomNonce(), b = auth::RandomNonce();
  auth::Mac base = auth::Proof("s", "hvd client", a, b, "ctx");
  EXPECT_TRUE(auth::Equal(base, auth::Proof("s", "hvd client", a, b, "ctx")));
  EXPECT_FALSE(auth::Equal(base, auth::Proof("t", "hvd client", a, b, "ctx")));
  EXPECT_FALSE(auth::Equal(base, auth::Proof("s", "hvd server", a, b, "ctx")));
  EXPECT_FALSE(auth::Equal(base, auth::Proof("s", "hvd client", b, a, "ctx")));
  EXPECT_FALSE(auth::Equal(base, auth::Proof("s", "hvd client", a, b, "ctx2")));
}

}  // namespace
}  // namespace hvd
