// LimitedWarning (common/logging.h): what a stranger can repeat at will fills no log.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "common/logging.h"

namespace hvd {
namespace {

// Runs `body` with stderr (where the log goes) captured; returns what it wrote.
template <typename Body>
std::string CaptureStderr(Body body) {
  std::fflush(stderr);
  char path[] = "/tmp/hvd_logging_test.XXXXXX";
  const int file = ::mkstemp(path);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(file, STDERR_FILENO);
  body();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::string out;
  ::lseek(file, 0, SEEK_SET);
  char buf[4096];
  for (ssize_t n; (n = ::read(file, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(file);
  ::unlink(path);
  return out;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(LimitedWarning, FirstOnesThenACount) {
  const std::string out = CaptureStderr([] {
    LimitedWarning w("dropped a connection", 3, std::chrono::seconds(3600));
    for (int i = 0; i < 1000; ++i) w.Note("stranger " + std::to_string(i));
  });  // the count still open is logged when it goes
  EXPECT_EQ(5, Count(out, "\n")) << out;  // 3 one by one, the notice, the count
  EXPECT_NE(out.find("dropped a connection: stranger 2"), std::string::npos) << out;
  EXPECT_EQ(out.find("stranger 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("are counted, one line at most every 3600 s"), std::string::npos) << out;
  EXPECT_NE(out.find("dropped a connection: 997 more since the last line; the last: stranger 999"),
            std::string::npos)
      << out;
}

TEST(LimitedWarning, ACountEveryPeriod) {
  const std::string out = CaptureStderr([] {
    LimitedWarning w("dropped", 1, std::chrono::seconds(0));
    for (int i = 0; i < 4; ++i) w.Note("x" + std::to_string(i));
    w.Flush();  // nothing left to tell
  });
  EXPECT_EQ(1, Count(out, "dropped: x0")) << out;
  EXPECT_EQ(3, Count(out, "1 more in the last")) << out;
  EXPECT_EQ(0, Count(out, "since the last line")) << out;
}

}  // namespace
}  // namespace hvd
