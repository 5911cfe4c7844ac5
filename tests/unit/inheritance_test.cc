// What a process forked from a rank inherits of hvd's descriptors (common/inheritance.h).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "common/inheritance.h"

namespace hvd {
namespace {

std::string LinkOf(int fd) {
  char target[256] = {0};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  if (::readlink(link.c_str(), target, sizeof(target) - 1) <= 0) return "(none)";
  return target;
}

// Forks; the child runs `check` and exits with its result (0: passed). Returns the exit code,
// or -1 when the child did not exit normally within 20 s.
template <typename Fn>
int InChild(Fn check) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(check());
  if (pid < 0) return -1;
  for (int i = 0; i < 2000; ++i) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

TEST(Inheritance, MarksCloseOnExec) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ASSERT_EQ(::fcntl(sv[0], F_GETFD) & FD_CLOEXEC, 0);
  KeepFromChildren(sv[0]);
  EXPECT_NE(::fcntl(sv[0], F_GETFD) & FD_CLOEXEC, 0);
  ::close(sv[0]);
  ::close(sv[1]);
}

TEST(Inheritance, ForkedChildDropsTheSocketSoThePeerSeesTheEnd) {
  int sv[2], hold[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ASSERT_EQ(::pipe(hold), 0);
  KeepFromChildren(sv[0]);  // the rank's end; sv[1] stands for the peer
  const uint64_t generation = ForkGeneration();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: its copy is /dev/null, still close-on-exec; it lives on until the parent
    // lets it go, as a DataLoader worker would.
    int code = LinkOf(sv[0]) == "/dev/null" ? 0 : 1;
    if ((::fcntl(sv[0], F_GETFD) & FD_CLOEXEC) == 0) code = 2;
    if (ForkGeneration() != generation + 1) code = 3;
    ::close(hold[1]);
    char c;
    (void)!::read(hold[0], &c, 1);  // until the parent closes its end
    ::_exit(code);
  }
  ::close(hold[0]);
  EXPECT_EQ(ForkGeneration(), generation);
  EXPECT_EQ(LinkOf(sv[0]).rfind("socket:", 0), 0u) << "the parent's own stays a socket";
  // The rank ends its connection (as its death would) while the child is alive.
  ::close(sv[0]);
  pollfd p{sv[1], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1) << "the peer saw no end while the forked child lived";
  char c;
  EXPECT_EQ(::read(sv[1], &c, 1), 0);
  ::close(hold[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: not /dev/null, 2: not close-on-exec, 3: generation";
  ::close(sv[1]);
}

TEST(Inheritance, ANumberReusedForAnotherFileIsLeftAlone) {
  int sv[2], pipe_fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  KeepFromChildren(sv[0]);
  const int number = sv[0];
  ::close(sv[0]);  // closed without a word to the registry, as Asio closes sockets
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ASSERT_EQ(::dup2(pipe_fds[0], number), number);  // the caller's own file takes the number
  EXPECT_EQ(InChild([&] { return LinkOf(number).rfind("pipe:", 0) == 0 ? 0 : 1; }), 0);
  ::close(number);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ::close(sv[1]);
}

TEST(Inheritance, ManyRegistrationsOfClosedSocketsStayCorrect) {
  // Past the registry's pruning point: the live one is still dropped in a child.
  for (int i = 0; i < 300; ++i) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    KeepFromChildren(sv[0]);
    ::close(sv[0]);
    ::close(sv[1]);
  }
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  KeepFromChildren(sv[0]);
  EXPECT_EQ(InChild([&] { return LinkOf(sv[0]) == "/dev/null" ? 0 : 1; }), 0);
  EXPECT_EQ(LinkOf(sv[0]).rfind("socket:", 0), 0u);
  ::close(sv[0]);
  ::close(sv[1]);
}

}  // namespace
}  // namespace hvd
