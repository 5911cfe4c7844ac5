// Strangers on a forming job's ports: while the ranks are connecting, something without the
// job's secret connects to every rank's listening port and stays silent, sends garbage, sends
// a hello with a wrong proof, or replays nothing useful. The job still forms, computes the
// right values, and no rank crashes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "bootstrap/auth.h"
#include "bootstrap/store.h"
#include "hvd/engine.h"
#include "mp_fork.h"

namespace {

const char kSecret[] = "5ecre7-of-the-job-5ecre7-of-the-job";

int Connect(const std::string& addr) {
  auto colon = addr.rfind(':');
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The four strangers, against one rank's address. Returns the sockets it left open.
std::vector<int> Harass(const std::string& addr) {
  std::vector<int> open;
  int silent = Connect(addr);  // says nothing at all
  if (silent >= 0) open.push_back(silent);
  int garbage = Connect(addr);
  if (garbage >= 0) {
    std::string junk(300, '\x5a');
    (void)!::send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL);
    open.push_back(garbage);
  }
  int wrong = Connect(addr);  // a well-formed handshake with the wrong secret, claiming rank 1
  if (wrong >= 0) {
    hvd::auth::Nonce ns{}, nc = hvd::auth::RandomNonce();
    if (::recv(wrong, ns.data(), ns.size(), MSG_WAITALL) == static_cast<ssize_t>(ns.size())) {
      std::string hello(17, '\0');  // transport/tcp/mesh_hello.h
      uint32_t magic = 0x31445648;
      int32_t rank = 1, target = 0, world = 3;
      std::memcpy(&hello[0], &magic, 4);
      std::memcpy(&hello[4], &rank, 4);
      std::memcpy(&hello[9], &target, 4);
      std::memcpy(&hello[13], &world, 4);
      auto mac = hvd::auth::Proof("not-the-secret", "hvd client", ns, nc, hello);
      std::string msg = hello + std::string(reinterpret_cast<char*>(nc.data()), nc.size()) +
                        std::string(reinterpret_cast<char*>(mac.data()), mac.size());
      (void)!::send(wrong, msg.data(), msg.size(), MSG_NOSIGNAL);
    }
    open.push_back(wrong);
  }
  return open;
}

int RunRank(int rank, int size, int port) {
  if (rank == size - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  hvd::Options o;
  o.rank = rank;
  o.size = size;
  o.local_rank = rank;
  o.local_size = size;
  o.rendezvous_addr = "127.0.0.1";
  o.rendezvous_port = port;
  o.secret = kSecret;
  o.timeout_seconds = 20;
  o.start_timeout_seconds = 20;
  auto e = hvd::Engine::Create(o);
  if (!e.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.status().ToString().c_str());
    return 2;
  }
  std::vector<double> v(1000, rank + 1.0);
  hvd::TensorView t(v.data(), hvd::DataType::kFloat64, {1000});
  hvd::Status s = (*e)->Allreduce("x", t, t, hvd::ReduceOp::kSum)->Wait();
  if (!s.ok()) return 3;
  for (double x : v) {
    if (x != size * (size + 1) / 2.0) return 4;
  }
  (*e)->Shutdown();
  return 0;
}

TEST(Strangers, JobFormsAndComputesDespiteThem) {
  const int size = 3;
  // The store runs in a process of its own, so this one is single-threaded when it forks the
  // ranks (mp_fork.h says why).
  mp::StoreProcess server(kSecret);
  ASSERT_TRUE(server.ok());
  const int port = server.port();
  ASSERT_EQ(mp::ThreadCount(), 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t p = fork();
    if (p == 0) {
      alarm(60);
      _exit(RunRank(r, size, port));
    }
    pids.push_back(p);
  }
  // The owner of the job reads the ranks' addresses (it has the secret) and lets the strangers
  // loose on them while rank 2 is still on its way.
  auto store = hvd::StoreClient::Connect("127.0.0.1", port, hvd::DeadlineAfterSeconds(10), kSecret);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<int> sockets;
  for (int r = 0; r < size - 1; ++r) {
    auto addr = (*store)->Get("hvd/addr/" + std::to_string(r), hvd::DeadlineAfterSeconds(10));
    ASSERT_TRUE(addr.ok()) << addr.status().ToString();
    auto open = Harass(*addr);
    EXPECT_FALSE(open.empty()) << "rank " << r << " was not listening at " << *addr;
    sockets.insert(sockets.end(), open.begin(), open.end());
  }
  for (int r = 0; r < size; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << " ended with status " << status;
  }
  for (int fd : sockets) ::close(fd);
}

// Processes of one job that do not form one world: a rank started with another HVD_SIZE, or two
// processes given the same rank (a launcher of one's own, or an environment overridden on one
// host). The rank they connect to names them at once, and the others hear it from there,
// instead of a start timeout that blames a rank that never came or "died".
struct Identity {
  int rank, size;
  const char* secret = kSecret;
};

// Starts one process per identity and returns what each one's engine creation said ("ok" or the
// status), in order.
std::vector<std::string> StartWith(const std::vector<Identity>& ids) {
  mp::StoreProcess server(kSecret);
  EXPECT_TRUE(server.ok());
  const int port = server.port();
  EXPECT_EQ(mp::ThreadCount(), 1);
  char dir_template[] = "/tmp/mp_identity.XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  std::vector<pid_t> pids;
  for (size_t i = 0; i < ids.size(); ++i) {
    pid_t p = fork();
    if (p == 0) {
      alarm(60);
      hvd::Options o;
      o.rank = ids[i].rank;
      o.size = ids[i].size;
      o.local_rank = ids[i].rank;
      o.local_size = ids[i].size;
      o.rendezvous_addr = "127.0.0.1";
      o.rendezvous_port = port;
      o.secret = ids[i].secret;
      o.timeout_seconds = 10;
      o.start_timeout_seconds = 30;
      auto e = hvd::Engine::Create(o);
      const std::string said = e.ok() ? "ok" : e.status().ToString();
      FILE* f = std::fopen((dir + "/" + std::to_string(i)).c_str(), "w");
      if (f) {
        std::fputs(said.c_str(), f);
        std::fclose(f);
      }
      _exit(0);
    }
    pids.push_back(p);
  }
  std::vector<std::string> said;
  for (size_t i = 0; i < ids.size(); ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    std::string text;
    if (FILE* f = std::fopen((dir + "/" + std::to_string(i)).c_str(), "r")) {
      char buf[4096];
      size_t n = std::fread(buf, 1, sizeof(buf), f);
      text.assign(buf, n);
      std::fclose(f);
    }
    said.push_back(text);
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  return said;
}

TEST(Identities, AWorldSizeThatDiffersOnOneRankIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const auto said = StartWith({{0, 3}, {1, 3}, {2, 4}});
  ASSERT_EQ(said.size(), 3u);
  EXPECT_NE(said[0].find("rank 2 was started in a world of 4 ranks and rank 0 in a world of 3 "
                         "(HVD_SIZE differs between ranks)"),
            std::string::npos)
      << said[0];
  for (const auto& s : said) {
    EXPECT_NE(s.find("HVD_SIZE differs between ranks"), std::string::npos) << s;
  }
  // At once, not at the 30 s start timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(Identities, ARankGivenToTwoProcessesIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const auto said = StartWith({{0, 3}, {1, 3}, {1, 3}});
  ASSERT_EQ(said.size(), 3u);
  EXPECT_NE(said[0].find("two processes claim rank 1 (each connected to rank 0): every process "
                         "needs its own HVD_RANK"),
            std::string::npos)
      << said[0];
  for (const auto& s : said) {
    EXPECT_NE(s, "ok");
    EXPECT_NE(s.find("two processes claim rank 1"), std::string::npos) << s;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// A process given another job's secret: the store refuses it at once, and the error names the
// store once and says what to check.
TEST(Identities, ARankWithAnotherSecretIsRefusedByTheStore) {
  const auto start = std::chrono::steady_clock::now();
  const auto said = StartWith({{0, 2, "the-secret-of-another-job-entirely"}});
  ASSERT_EQ(said.size(), 1u);
  const std::string& s = said[0];
  const size_t at = s.find("rendezvous store at 127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << s;
  EXPECT_EQ(s.find("rendezvous store at", at + 1), std::string::npos) << "said twice: " << s;
  EXPECT_NE(s.find("secret"), std::string::npos) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

}  // namespace
