// Forming the TCP mesh (transport/tcp/tcp_mesh.h) against a lower rank that is alive but
// drops every connection before authenticating it, as a rank short of file descriptors does to
// free one: the dialling rank gives up at its deadline and says that the peer kept closing its
// connections, pointing at the peer's own message for the cause.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <asio.hpp>
#include <gtest/gtest.h>

#include "bootstrap/store.h"
#include "transport/tcp/tcp_mesh.h"

namespace hvd {
namespace {

constexpr char kSecret[] = "mesh-test-secret";

// A loopback listener whose thread accepts every connection and closes it at once.
class DroppingListener {
 public:
  DroppingListener() {
    acceptor_.open(asio::ip::tcp::v4());
    acceptor_.bind({asio::ip::address_v4::loopback(), 0});
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this] {
      const int fd = acceptor_.native_handle();
      while (!stop_) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 20) != 1) continue;
        const int c = ::accept(fd, nullptr, nullptr);
        if (c >= 0) {
          ::close(c);
          ++accepted_;
        }
      }
    });
  }
  ~DroppingListener() {
    stop_ = true;
    thread_.join();
  }
  int port() const { return port_; }
  int accepted() const { return accepted_; }

 private:
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_{io_};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

// Rank 1 of 2 forming the mesh, with rank 0's address in the store at `rank0_port`: what it
// fails with within `seconds`.
Status FormAsRankOne(int rank0_port, double seconds) {
  auto server = StoreServer::Start("127.0.0.1", 0, kSecret);
  if (!server.ok()) return server.status();
  auto store =
      StoreClient::Connect("127.0.0.1", (*server)->port(), DeadlineAfterSeconds(5), kSecret);
  if (!store.ok()) return store.status();
  Status set = (*store)->Set(RankAddressKey(0), "127.0.0.1:" + std::to_string(rank0_port),
                             DeadlineAfterSeconds(5));
  if (!set.ok()) return set;
  Options o;
  o.rank = 1;
  o.size = 2;
  o.secret = kSecret;
  asio::io_context io;
  auto mesh = TcpMesh::Create(io, o, **store, DeadlineAfterSeconds(seconds));
  return mesh.ok() ? Status::Internal("the mesh formed") : mesh.status();
}

TEST(TcpMesh, PeerThatDropsEveryConnectionIsSaidToHaveDroppedThem) {
  DroppingListener rank0;
  const auto start = Clock::now();
  const Status s = FormAsRankOne(rank0.port(), 2);
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string& m = s.message();
  EXPECT_EQ(s.code(), StatusCode::kPeerLost) << m;
  // The last attempt's own error comes first: the peer's close ("... connecting to rank 0"),
  // or, where the deadline fell inside a connect (under load), "cannot connect to rank 0 at
  // ...: timed out". The note follows either.
  EXPECT_NE(m.find("to rank 0"), std::string::npos) << m;
  EXPECT_NE(m.find("(rank 0 closed "), std::string::npos) << m;
  EXPECT_NE(m.find(" of this rank's connections before authenticating them: it may be short of "
                   "file descriptors or overloaded; see its own message)"),
            std::string::npos)
      << m;
  EXPECT_GE(rank0.accepted(), 2);
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 10.0);
}

// A peer whose port is closed: no such note (the peer is gone, not dropping this rank's
// connections).
TEST(TcpMesh, PeerThatIsGoneIsNotSaidToDropConnections) {
  int port = 0;
  {
    DroppingListener gone;  // closed again at once: a port where nothing listens
    port = gone.port();
  }
  const Status s = FormAsRankOne(port, 1);
  const std::string& m = s.message();
  EXPECT_EQ(s.code(), StatusCode::kPeerLost) << m;
  EXPECT_NE(m.find("cannot connect to rank 0"), std::string::npos) << m;
  EXPECT_EQ(m.find("of this rank's connections"), std::string::npos) << m;
}

}  // namespace
}  // namespace hvd
