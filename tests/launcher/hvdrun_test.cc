// Runs the real hvdrun binary (HVDRUN_PATH) with tiny shell commands as ranks: the
// environment contract, output prefixes, exit codes, failure and signal handling, usage errors.
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  int code = -1;  // exit code, 128+signal when hvdrun itself was killed, -1 on timeout
  std::string out, err;
  double seconds = 0;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/hvdrun_test.XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Where a Job's hvdrun writes: files; no stdout and no stderr (closed); no stdin and no stderr;
// stdout a pipe that nobody reads (stderr a file).
enum class Console { kFiles, kClosed, kClosedInAndErr, kUnreadPipe };

// hvdrun running in the background with stdout and stderr going to files.
class Job {
 public:
  // own_group: hvdrun leads a process group of its own (as a shell's job does).
  explicit Job(const std::vector<std::string>& args, bool own_group = false,
               Console console = Console::kFiles) {
    out_ = dir_.path() + "/out";
    err_ = dir_.path() + "/err";
    std::vector<std::string> argv = {HVDRUN_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    int unread[2] = {-1, -1};
    if (console == Console::kUnreadPipe && ::pipe(unread) != 0) unread[0] = unread[1] = -1;
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      if (own_group) ::setpgid(0, 0);
      int o = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(console == Console::kUnreadPipe ? unread[1] : o, 1);
      ::dup2(e, 2);
      if (console == Console::kClosed) ::close(1);
      if (console == Console::kClosedInAndErr) ::close(0);
      if (console == Console::kClosed || console == Console::kClosedInAndErr) ::close(2);
      for (int fd : {o, e, unread[0], unread[1]}) {
        if (fd > 2) ::close(fd);
      }
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
      cargv.push_back(nullptr);
      ::execv(cargv[0], cargv.data());
      ::_exit(126);
    }
    if (unread[1] >= 0) ::close(unread[1]);
    unread_ = unread[0];
  }
  ~Job() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (unread_ >= 0) ::close(unread_);
  }
  pid_t pid() const { return pid_; }
  // Console::kUnreadPipe: how many bytes wait in hvdrun's stdout.
  int Unread() const {
    int n = 0;
    return unread_ >= 0 && ::ioctl(unread_, FIONREAD, &n) == 0 ? n : 0;
  }

  // What hvdrun has written so far (hvdrun still running).
  Result Peek() const {
    Result r;
    r.out = ReadFile(out_);
    r.err = ReadFile(err_);
    return r;
  }

  // Waits at most `timeout` seconds for hvdrun to exit.
  Result Wait(double timeout = 30) {
    Result r;
    auto deadline = start_ + std::chrono::duration<double>(timeout);
    int status = 0;
    while (Clock::now() < deadline) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    r.out = ReadFile(out_);
    r.err = ReadFile(err_);
    return r;
  }

 private:
  TempDir dir_;
  std::string out_, err_;
  pid_t pid_ = -1;
  int unread_ = -1;
  Clock::time_point start_;
};

Result RunHvdrun(const std::vector<std::string>& args, double timeout = 30) { return Job(args).Wait(timeout); }

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// True while `pid` exists and is not a zombie.
bool Alive(pid_t pid) {
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// Waits (bounded) until `n` files named PREFIX.<rank> exist in dir; returns the pids in them.
std::vector<pid_t> WaitForPidFiles(const std::string& dir, const std::string& prefix, int n) {
  std::vector<pid_t> pids;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    pids.clear();
    for (int r = 0; r < n; ++r) {
      std::string text = ReadFile(dir + "/" + prefix + "." + std::to_string(r));
      if (!text.empty() && text.back() == '\n') pids.push_back(std::atoi(text.c_str()));
    }
    if (static_cast<int>(pids.size()) == n) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pids;
}

class EnvContract : public ::testing::TestWithParam<int> {};

TEST_P(EnvContract, EveryRankGetsItsIdentity) {
  int np = GetParam();
  Result r = RunHvdrun({"-np", std::to_string(np), "sh", "-c",
                  "echo \"$HVD_RANK $HVD_SIZE $HVD_LOCAL_RANK $HVD_LOCAL_SIZE $HVD_CROSS_RANK "
                  "$HVD_CROSS_SIZE $HVD_HOSTNAME $HVD_RENDEZVOUS_ADDR $HVD_RENDEZVOUS_PORT "
                  "$HVD_SECRET\"; echo \"horovod $HOROVOD_RANK $HOROVOD_SIZE "
                  "$HOROVOD_LOCAL_RANK $HOROVOD_LOCAL_SIZE $HOROVOD_CROSS_RANK "
                  "$HOROVOD_CROSS_SIZE $HOROVOD_HOSTNAME\""});
  ASSERT_EQ(0, r.code) << r.err;
  std::vector<std::string> lines, horovod;
  for (const auto& line : Lines(r.out)) {
    (line.find(":horovod ") != std::string::npos ? horovod : lines).push_back(line);
  }
  ASSERT_EQ(static_cast<size_t>(np), lines.size()) << r.out;
  // horovodrun's names carry the same identity.
  ASSERT_EQ(static_cast<size_t>(np), horovod.size()) << r.out;
  for (const auto& line : horovod) {
    int tag = -1;
    ASSERT_EQ(1, std::sscanf(line.c_str(), "[%d]", &tag)) << line;
    EXPECT_EQ("[" + std::to_string(tag) + "]<stdout>:horovod " + std::to_string(tag) + " " +
                  std::to_string(np) + " " + std::to_string(tag) + " " + std::to_string(np) +
                  " 0 1 localhost",
              line);
  }
  std::set<int> ranks;
  std::set<std::string> secrets, ports;
  for (const auto& line : lines) {
    int rank, size, lr, ls, cr, cs;
    char host[64], addr[64], port[16], secret[129];
    int tag;
    ASSERT_EQ(11, std::sscanf(line.c_str(), "[%d]<stdout>:%d %d %d %d %d %d %63s %63s %15s %128s",
                              &tag, &rank, &size, &lr, &ls, &cr, &cs, host, addr, port, secret))
        << line;
    EXPECT_EQ(tag, rank);
    EXPECT_EQ(np, size);
    EXPECT_EQ(rank, lr);
    EXPECT_EQ(np, ls);
    EXPECT_EQ(0, cr);
    EXPECT_EQ(1, cs);
    EXPECT_STREQ("localhost", host);
    EXPECT_STREQ("127.0.0.1", addr);
    EXPECT_GT(std::atoi(port), 0);
    EXPECT_EQ(64u, std::string(secret).size());
    EXPECT_EQ(std::string::npos, std::string(secret).find_first_not_of("0123456789abcdef"));
    ranks.insert(rank);
    secrets.insert(secret);
    ports.insert(port);
  }
  EXPECT_EQ(static_cast<size_t>(np), ranks.size());
  EXPECT_EQ(1u, secrets.size());
  EXPECT_EQ(1u, ports.size());
}

INSTANTIATE_TEST_SUITE_P(Sizes, EnvContract, ::testing::Values(1, 2, 3, 4));

TEST(Hvdrun, TwoHostNamesGiveCrossRanks) {
  Result r = RunHvdrun({"-H", "localhost:2,127.0.0.1:2", "sh", "-c",
                  "echo $HVD_RANK $HVD_LOCAL_RANK $HVD_CROSS_RANK $HVD_CROSS_SIZE $HVD_HOSTNAME"});
  ASSERT_EQ(0, r.code) << r.err;
  for (const char* want : {"[0]<stdout>:0 0 0 2 localhost", "[1]<stdout>:1 1 0 2 localhost",
                           "[2]<stdout>:2 0 1 2 127.0.0.1", "[3]<stdout>:3 1 1 2 127.0.0.1"}) {
    EXPECT_TRUE(Contains(r.out, want)) << want << "\n" << r.out;
  }
}

TEST(Hvdrun, SecretIsNotOnAnyCommandLine) {
  Result r = RunHvdrun({"-np", "1", "sh", "-c",
                  "tr '\\0' ' ' < /proc/$PPID/cmdline; echo; tr '\\0' ' ' < /proc/$$/cmdline; "
                  "echo; echo \"secret=$HVD_SECRET\""});
  ASSERT_EQ(0, r.code) << r.err;
  size_t at = r.out.find("secret=");
  ASSERT_NE(std::string::npos, at);
  std::string secret = r.out.substr(at + 7, 64);
  EXPECT_EQ(std::string::npos, r.out.substr(0, at).find(secret)) << r.out;
}

TEST(Hvdrun, PrefixesBothStreamsAndFlushesPartialLines) {
  Result r = RunHvdrun({"-np", "2", "sh", "-c", "echo out$HVD_RANK; echo err$HVD_RANK >&2; printf tail"});
  ASSERT_EQ(0, r.code);
  for (int k = 0; k < 2; ++k) {
    std::string t = "[" + std::to_string(k) + "]";
    EXPECT_TRUE(Contains(r.out, t + "<stdout>:out" + std::to_string(k) + "\n")) << r.out;
    EXPECT_TRUE(Contains(r.out, t + "<stdout>:tail\n")) << r.out;
    EXPECT_TRUE(Contains(r.err, t + "<stderr>:err" + std::to_string(k) + "\n")) << r.err;
  }
  EXPECT_FALSE(Contains(r.out, "<stderr>"));
  EXPECT_FALSE(Contains(r.err, "<stdout>"));
}

// As horovodrun: '\r' ends a line too (a progress bar goes out as it is redrawn, not at the
// next newline), and "\r\n" is one line end.
TEST(Hvdrun, CarriageReturnsEndLines) {
  Result r = RunHvdrun({"-np", "1", "sh", "-c", "printf 'a\\rb\\rc\\nx\\r\\ny\\n'"});
  EXPECT_EQ(0, r.code) << r.err;
  EXPECT_EQ("[0]<stdout>:a\r[0]<stdout>:b\r[0]<stdout>:c\n[0]<stdout>:x\r\n[0]<stdout>:y\n", r.out);
}

TEST(Hvdrun, AProgressBarShowsAsItIsDrawn) {
  Job job({"-np", "1", "sh", "-c", "printf '\\r10%%'; printf '\\r20%%'; sleep 30"});
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  Result r;
  while (Clock::now() < deadline && !Contains(r.out, "10%\r")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r = job.Peek();
  }
  EXPECT_EQ("[0]<stdout>:\r[0]<stdout>:10%\r", r.out);
}

TEST(Hvdrun, NoPrefix) {
  Result r = RunHvdrun({"-np", "2", "--no-prefix", "sh", "-c", "echo plain"});
  ASSERT_EQ(0, r.code);
  EXPECT_EQ("plain\nplain\n", r.out);
}

TEST(Hvdrun, LinesDoNotInterleave) {
  // 4 ranks x 3000 lines of 200 characters each, written in odd-sized chunks.
  std::string script =
      "awk -v r=$HVD_RANK 'BEGIN { s = sprintf(\"%0200d\", 0); gsub(0, r, s); "
      "for (i = 0; i < 3000; i++) print s }'";
  Result r = RunHvdrun({"-np", "4", "sh", "-c", script});
  ASSERT_EQ(0, r.code) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(12000u, lines.size());
  for (const auto& line : lines) {
    ASSERT_EQ(12u + 200u, line.size()) << line.substr(0, 40);
    char rank = line[1];
    ASSERT_EQ(std::string(200, rank), line.substr(12)) << line.substr(0, 40);
  }
}

TEST(Hvdrun, LongLinesStayWhole) {
  // 300 KB lines (a JSON record, say) from 2 ranks, with and without the prefix: each comes out
  // as one line, nothing inserted, as horovodrun keeps them; a short line after each.
  std::string script =
      "awk -v r=$HVD_RANK 'BEGIN { s = r; while (length(s) < 300000) s = s s; "
      "print substr(s, 1, 300000); print \"end\" }'";
  for (bool prefix : {true, false}) {
    std::vector<std::string> args = {"-np", "2", "sh", "-c", script};
    if (!prefix) args.insert(args.begin(), "--no-prefix");
    Result r = RunHvdrun(args);
    ASSERT_EQ(0, r.code) << r.err;
    auto lines = Lines(r.out);
    ASSERT_EQ(4u, lines.size());
    int long_lines = 0;
    for (const auto& line : lines) {
      if (line.size() < 1000) {
        EXPECT_EQ(prefix ? 15u : 3u, line.size()) << line;
        continue;
      }
      ++long_lines;
      ASSERT_EQ((prefix ? 12u : 0u) + 300000u, line.size());
      const size_t start = prefix ? 12 : 0;
      const char rank = line[start];
      EXPECT_EQ(std::string(300000, rank), line.substr(start));
    }
    EXPECT_EQ(2, long_lines);
  }
}

TEST(Hvdrun, LinesLongerThanTheBufferComeWholeInPieces) {
  // 2.5 MB, more than hvdrun holds of a line (1 MiB): it goes out in pieces, nothing inserted,
  // one prefix; the last line of one rank has no newline (hvdrun ends it).
  std::string script =
      "awk 'BEGIN { s = \"x\"; while (length(s) < 2500000) s = s s; "
      "printf \"%s\\nend\", substr(s, 1, 2500000) }'";
  Result r = RunHvdrun({"-np", "1", "sh", "-c", script});
  ASSERT_EQ(0, r.code) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(2u, lines.size());
  EXPECT_EQ(12u + 2500000u, lines[0].size());
  EXPECT_EQ("[0]<stdout>:" + std::string(2500000, 'x'), lines[0]);
  EXPECT_EQ("[0]<stdout>:end", lines[1]);
}

TEST(Hvdrun, PiecesOfLongLinesFromSeveralRanksEachSayWhose) {
  // 3 MB lines from 3 ranks at once, more than hvdrun holds of a line: where another rank's
  // piece comes between two pieces of a line, the line is broken there and goes on under its
  // rank's prefix again; every byte is there, under the prefix of the rank that wrote it.
  std::string script =
      "awk -v r=$HVD_RANK 'BEGIN { s = r; while (length(s) < 3000000) s = s s; "
      "print substr(s, 1, 3000000); print \"end\" }'";
  Result r = RunHvdrun({"-np", "3", "sh", "-c", script});
  ASSERT_EQ(0, r.code) << r.err;
  std::vector<size_t> digits(3, 0), ends(3, 0);
  for (const auto& line : Lines(r.out)) {
    ASSERT_GE(line.size(), 12u) << line.substr(0, 40);
    ASSERT_EQ("[", line.substr(0, 1));
    const int rank = line[1] - '0';
    ASSERT_TRUE(rank >= 0 && rank < 3) << line.substr(0, 40);
    ASSERT_EQ("]<stdout>:", line.substr(2, 10)) << line.substr(0, 40);
    const std::string text = line.substr(12);
    if (text == "end") {
      ++ends[rank];
      continue;
    }
    ASSERT_EQ(std::string(text.size(), line[1]), text)
        << "rank " << rank << "'s line holds another's bytes: " << text.substr(0, 40);
    digits[rank] += text.size();
  }
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(3000000u, digits[k]) << "rank " << k;
    EXPECT_EQ(1u, ends[k]) << "rank " << k;
  }
}

TEST(Hvdrun, TimestampPrefix) {
  // horovodrun's -prefix-timestamp: "Fri Nov 27 06:30:12 2026[0]<stdout>:text".
  Result r = RunHvdrun({"-np", "1", "-prefix-timestamp", "sh", "-c", "echo stamped"});
  ASSERT_EQ(0, r.code) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(1u, lines.size());
  const std::string& line = lines[0];
  const std::string tail = "[0]<stdout>:stamped";
  ASSERT_GT(line.size(), tail.size());
  EXPECT_EQ(tail, line.substr(line.size() - tail.size())) << line;
  const std::string stamp = line.substr(0, line.size() - tail.size());
  EXPECT_EQ(24u, stamp.size()) << stamp;  // ctime's width: "Fri Nov 27 06:30:12 2026"
  EXPECT_EQ(':', stamp[13]) << stamp;
  EXPECT_EQ(':', stamp[16]) << stamp;
}

TEST(Hvdrun, ArgumentsAfterCommandBelongToIt) {
  Result r = RunHvdrun({"-np", "1", "sh", "-c", "echo \"$@\"", "x", "--lr", "0.1", "-np", "5", "--help"});
  ASSERT_EQ(0, r.code) << r.err;
  EXPECT_EQ("[0]<stdout>:--lr 0.1 -np 5 --help\n", r.out);
}

TEST(Hvdrun, KnobsReachRanks) {
  Result r = RunHvdrun({"-np", "1", "--fusion-threshold-mb", "2", "--cycle-time-ms", "5",
                  "--cache-capacity", "7", "--timeout", "9", "--stall-check-seconds", "11",
                  "--log-level", "info", "--timeline", "/tmp/x.json", "sh", "-c",
                  "echo $HVD_FUSION_THRESHOLD $HVD_CYCLE_TIME $HVD_CACHE_CAPACITY "
                  "$HVD_TIMEOUT_SECONDS $HVD_STALL_CHECK_TIME_SECONDS $HVD_LOG_LEVEL $HVD_TIMELINE"});
  ASSERT_EQ(0, r.code) << r.err;
  EXPECT_EQ("[0]<stdout>:2097152 5 7 9 11 info /tmp/x.json\n", r.out);
}

// horovodrun's --config-file: its settings reach every rank, the command line's flags win,
// and a setting hvd has no use for is named on stderr with the file's line.
TEST(Hvdrun, ConfigFileSettingsReachRanks) {
  TempDir dir;
  std::ofstream(dir.path() + "/c.yaml") << "params:\n  fusion_threshold_mb: 4\n  cycle_time_ms: 2\n"
                                           "library_options:\n  num_nccl_streams: 2\n";
  Result r = RunHvdrun({"-np", "2", "--config-file", dir.path() + "/c.yaml", "--cycle-time-ms", "6",
                        "sh", "-c", "echo $HVD_FUSION_THRESHOLD $HVD_CYCLE_TIME"});
  ASSERT_EQ(0, r.code) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ((std::vector<std::string>{"[0]<stdout>:4194304 6", "[1]<stdout>:4194304 6"}), lines);
  EXPECT_TRUE(Contains(r.err, "'library_options.num_nccl_streams' in " + dir.path() +
                                  "/c.yaml line 5 has no effect"))
      << r.err;
}

TEST(Hvdrun, HostfileGivesRankCount) {
  TempDir dir;
  std::ofstream(dir.path() + "/hosts") << "# test\nlocalhost slots=3\n\n";
  Result r = RunHvdrun({"--hostfile", dir.path() + "/hosts", "sh", "-c", "echo $HVD_SIZE"});
  ASSERT_EQ(0, r.code) << r.err;
  EXPECT_EQ(3u, Lines(r.out).size());
}

TEST(Hvdrun, FailingRankNamedAndOthersStopped) {
  TempDir dir;
  Job job({"-np", "3", "--grace-seconds", "0.5", "sh", "-c",
           "if [ $HVD_RANK = 1 ]; then echo failing >&2; exit 3; fi; "
           "echo $$ > " + dir.path() + "/pid.$HVD_RANK; exec sleep 60"});
  Result r = job.Wait(30);
  EXPECT_EQ(3, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "hvdrun: rank 1 (pid ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "exited with code 3")) << r.err;
  EXPECT_TRUE(Contains(r.err, "[1]<stderr>:failing")) << r.err;
  EXPECT_LT(r.seconds, 10.0);
  for (pid_t pid : WaitForPidFiles(dir.path(), "pid", 0)) EXPECT_FALSE(Alive(pid));
  for (int k : {0, 2}) {
    pid_t pid = std::atoi(ReadFile(dir.path() + "/pid." + std::to_string(k)).c_str());
    if (pid > 0) EXPECT_FALSE(Alive(pid)) << "rank " << k;
  }
}

TEST(Hvdrun, DefaultGraceIsShort) {
  Result r = RunHvdrun({"-np", "2", "sh", "-c", "if [ $HVD_RANK = 0 ]; then exit 4; fi; exec sleep 60"});
  EXPECT_EQ(4, r.code);
  EXPECT_GE(r.seconds, 2.5);
  EXPECT_LT(r.seconds, 10.0);
}

TEST(Hvdrun, KilledRankNamedWithSignal) {
  Result r = RunHvdrun({"-np", "2", "--grace-seconds", "0.2", "sh", "-c",
                  "if [ $HVD_RANK = 1 ]; then kill -9 $$; fi; exec sleep 60"});
  EXPECT_EQ(128 + 9, r.code);
  EXPECT_TRUE(Contains(r.err, "hvdrun: rank 1 (pid ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "was killed by signal 9 (SIGKILL)")) << r.err;
  EXPECT_LT(r.seconds, 10.0);
}

// A survivor's error exit can reach hvdrun before the SIGKILL that caused it (the killed process
// is not reapable yet on a loaded machine): the killed rank, ending right after, is named as
// the cause and gives hvdrun its exit code. Rank 1 exits with an error; rank 2 is killed as soon
// as it sees that (inside the cause window); rank 0 is stopped after the grace period.
TEST(Hvdrun, SignalDeathJustAfterAnErrorExitIsNamedAsTheCause) {
  TempDir dir;
  const std::string flag = dir.path() + "/rank1.exiting";
  Result r = RunHvdrun({"-np", "3", "--grace-seconds", "3", "sh", "-c",
                        "if [ $HVD_RANK = 1 ]; then touch " + flag + "; exit 1; fi; "
                        "if [ $HVD_RANK = 2 ]; then i=0; while [ ! -e " + flag +
                            " ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; "
                            "sleep 0.05; kill -9 $$; fi; exec sleep 60"});
  EXPECT_EQ(128 + 9, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "hvdrun: rank 1 (pid ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "was killed by signal 9 (SIGKILL), just before the failure above"))
      << r.err;
  EXPECT_LT(r.seconds, 10.0);
}

// Outside the window the first failure stands.
TEST(Hvdrun, SignalDeathLongAfterAnErrorExitIsNotTheCause) {
  Result r = RunHvdrun({"-np", "3", "--grace-seconds", "3", "sh", "-c",
                        "if [ $HVD_RANK = 1 ]; then exit 1; fi; "
                        "if [ $HVD_RANK = 2 ]; then sleep 1.8; kill -9 $$; fi; exec sleep 60"});
  EXPECT_EQ(1, r.code) << r.err;
  EXPECT_FALSE(Contains(r.err, "likely cause")) << r.err;
}

// A rank frozen by SIGSTOP makes the others fail (in a real job, after HVD_TIMEOUT_SECONDS, with
// errors naming it); the survivor that exits first is not the cause, and hvdrun says which rank
// is: rank 0 stops itself, rank 1 exits with an error once it sees rank 0 stopped. The stopped
// rank is continued after SIGTERM, so it ends at once rather than at the SIGKILL.
TEST(Hvdrun, StoppedRankNamedAsTheLikelyCause) {
  TempDir dir;
  const std::string pid0 = dir.path() + "/pid.0";
  Job job({"-np", "3", "--grace-seconds", "0.5", "--kill-after-seconds", "8", "sh", "-c",
           "if [ $HVD_RANK = 0 ]; then echo $$ > " + pid0 + "; kill -STOP $$; exec sleep 60; fi; "
           "if [ $HVD_RANK = 1 ]; then i=0; while [ $i -lt 1000 ]; do "
           "if [ -s " + pid0 + " ] && [ \"$(cut -d' ' -f3 /proc/$(cat " + pid0 + ")/stat)\" = T ]; "
           "then exit 1; fi; sleep 0.01; i=$((i+1)); done; exit 2; fi; exec sleep 60"});
  Result r = job.Wait(30);
  EXPECT_EQ(1, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "hvdrun: rank 1 (pid ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "hvdrun: rank 0 (pid ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "is stopped (its process is in state T")) << r.err;
  EXPECT_TRUE(Contains(r.err, "the likely cause of the failure above")) << r.err;
  EXPECT_FALSE(Contains(r.err, "rank 2 (pid ")) << r.err;  // running, not stopped: not named
  EXPECT_FALSE(Contains(r.err, "did not exit within")) << r.err;
  EXPECT_LT(r.seconds, 8.0);
  pid_t pid = std::atoi(ReadFile(pid0).c_str());
  if (pid > 0) EXPECT_FALSE(Alive(pid));
}

TEST(Hvdrun, RankIgnoringSigtermIsKilled) {
  Result r = RunHvdrun({"-np", "2", "--grace-seconds", "0.2", "--kill-after-seconds", "0.5", "sh", "-c",
                  "if [ $HVD_RANK = 0 ]; then exit 5; fi; trap '' TERM; sleep 60"});
  EXPECT_EQ(5, r.code);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(Contains(r.err, "rank 1 did not exit within 0.5 s of SIGTERM; sending SIGKILL"))
      << r.err;
}

TEST(Hvdrun, SigtermStopsEveryProcess) {
  TempDir dir;
  Job job({"-np", "3", "sh", "-c",
           "sleep 60 & echo $! > " + dir.path() + "/bg.$HVD_RANK; echo $$ > " + dir.path() +
               "/pid.$HVD_RANK; wait"});
  std::vector<pid_t> ranks = WaitForPidFiles(dir.path(), "pid", 3);
  std::vector<pid_t> background = WaitForPidFiles(dir.path(), "bg", 3);
  ASSERT_EQ(3u, ranks.size());
  ASSERT_EQ(3u, background.size());
  ASSERT_EQ(0, ::kill(job.pid(), SIGTERM));
  Result r = job.Wait(20);
  EXPECT_EQ(128 + SIGTERM, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "SIGTERM")) << r.err;
  for (pid_t pid : ranks) EXPECT_FALSE(Alive(pid)) << pid;
  for (pid_t pid : background) EXPECT_FALSE(Alive(pid)) << pid;
}

// A job of many ranks takes a while to start: a signal to hvdrun in that time ends the job
// there, instead of once every rank has been started (rank 0 signals at once, so hvdrun has
// started a few of the 1000 ranks by then, not all).
size_t StartedRanks(const std::string& err) {
  size_t n = 0;
  for (const auto& line : Lines(err)) n += Contains(line, "hvdrun: started rank ") ? 1 : 0;
  return n;
}

TEST(Hvdrun, SignalWhileRanksStartStopsStartingThem) {
  Job job({"--verbose", "-np", "1000", "sh", "-c",
           "[ \"$HVD_RANK\" = 0 ] && kill -TERM $PPID; exec sleep 60"});
  Result r = job.Wait(60);
  EXPECT_EQ(128 + SIGTERM, r.code) << r.err.substr(0, 2000);
  EXPECT_TRUE(Contains(r.err, "received SIGTERM, stopping all ranks")) << r.err.substr(0, 2000);
  EXPECT_LT(StartedRanks(r.err), 1000u);
}

TEST(Hvdrun, RankStoppedAfterTheOthersExitedIsNamed) {
  Job job({"-np", "2", "sh", "-c", "[ \"$HVD_RANK\" = 1 ] && kill -STOP $$; exit 0"});
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  Result r;
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    r = job.Peek();
    if (Contains(r.err, "is stopped")) break;
  }
  EXPECT_TRUE(Contains(r.err, "rank 1 (pid ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "is stopped (state T: SIGSTOP, SIGTSTP or a debugger) and every "
                              "other rank has exited"))
      << r.err;
  EXPECT_FALSE(Contains(r.err, "rank 0 (pid")) << r.err;
  ASSERT_EQ(0, ::kill(job.pid(), SIGTERM));
  r = job.Wait(30);
  EXPECT_EQ(128 + SIGTERM, r.code) << r.err;
}

// Started with stdout and stderr closed (or stdin and stderr), hvdrun runs the job as any other:
// no pipe of its own takes those numbers (its watchdog's did, read the ranks' stderr as process
// groups, and stopped the job at the first line of a length that is not a multiple of 4).
TEST(Hvdrun, ClosedStdioRunsTheJobAsAny) {
  for (Console closed : {Console::kClosed, Console::kClosedInAndErr}) {
    TempDir dir;
    Job job({"-np", "2", "sh", "-c",
             "sleep 0.3; for w in a ab abc abcd; do echo $w >&2; done; echo out; sleep 0.5; "
             "touch " + dir.path() + "/done.$HVD_RANK; exit 3"},
            false, closed);
    Result r = job.Wait(30);
    EXPECT_EQ(3, r.code);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(0, ::access((dir.path() + "/done." + std::to_string(rank)).c_str(), F_OK))
          << rank;
    }
  }
}

// A stdout that nobody reads holds the ranks' output back, not the signal that stops the job.
TEST(Hvdrun, SigtermStopsAJobWhoseOutputNobodyReads) {
  TempDir dir;
  Job job({"-np", "2", "sh", "-c",
           "echo $$ > " + dir.path() + "/pid.$HVD_RANK; yes 'spam spam spam' | head -c 4000000; "
           "exec sleep 60"},
          false, Console::kUnreadPipe);
  std::vector<pid_t> ranks = WaitForPidFiles(dir.path(), "pid", 2);
  ASSERT_EQ(2u, ranks.size());
  // Until hvdrun's stdout is full (64 KiB by default), so that its writes wait.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (job.Unread() < 60000 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(job.Unread(), 60000);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(0, ::kill(job.pid(), SIGTERM));
  Result r = job.Wait(40);
  EXPECT_EQ(128 + SIGTERM, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "received SIGTERM, stopping all ranks")) << r.err;
  for (pid_t pid : ranks) EXPECT_FALSE(Alive(pid)) << pid;
}

TEST(Hvdrun, SigintExits130) {
  TempDir dir;
  Job job({"-np", "2", "sh", "-c", "echo $$ > " + dir.path() + "/pid.$HVD_RANK; exec sleep 60"});
  std::vector<pid_t> ranks = WaitForPidFiles(dir.path(), "pid", 2);
  ASSERT_EQ(2u, ranks.size());
  ASSERT_EQ(0, ::kill(job.pid(), SIGINT));
  Result r = job.Wait(20);
  EXPECT_EQ(130, r.code);
  for (pid_t pid : ranks) EXPECT_FALSE(Alive(pid)) << pid;
}

TEST(Hvdrun, RanksDieWithAKilledHvdrun) {
  TempDir dir;
  Job job({"-np", "2", "sh", "-c", "echo $$ > " + dir.path() + "/pid.$HVD_RANK; exec sleep 60"});
  std::vector<pid_t> ranks = WaitForPidFiles(dir.path(), "pid", 2);
  ASSERT_EQ(2u, ranks.size());
  ASSERT_EQ(0, ::kill(job.pid(), SIGKILL));
  job.Wait(10);
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline && (Alive(ranks[0]) || Alive(ranks[1]))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : ranks) EXPECT_FALSE(Alive(pid)) << pid;
}

// A rank run through a shell that does not exec its program (a wrapper script): SIGKILL to
// hvdrun ends the shell (PR_SET_PDEATHSIG) and, through hvdrun's watchdog, the program too;
// also where the SIGKILL goes to hvdrun's whole process group (timeout -s KILL, kill -9 %1).
class KilledHvdrun : public ::testing::TestWithParam<bool> {};

TEST_P(KilledHvdrun, WhatRanksStartedDiesWithIt) {
  const bool whole_group = GetParam();
  TempDir dir;
  Job job({"-np", "2", "sh", "-c",
           "sleep 60 & echo $! > " + dir.path() + "/bg.$HVD_RANK; wait"}, whole_group);
  std::vector<pid_t> background = WaitForPidFiles(dir.path(), "bg", 2);
  ASSERT_EQ(2u, background.size());
  ASSERT_EQ(0, ::kill(whole_group ? -job.pid() : job.pid(), SIGKILL));
  job.Wait(10);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline && (Alive(background[0]) || Alive(background[1]))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : background) EXPECT_FALSE(Alive(pid)) << pid;
  Result r = job.Peek();
  EXPECT_TRUE(Contains(r.err, "is gone; stopping the processes its ranks left (2 process group"))
      << r.err;
}

INSTANTIATE_TEST_SUITE_P(Hvdrun, KilledHvdrun, ::testing::Bool());

// An executable host-discovery script in `dir` that runs `body` under /bin/sh.
std::string DiscoveryScript(const TempDir& dir, const std::string& body) {
  const std::string script = dir.path() + "/discover.sh";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n" << body;
  }
  EXPECT_EQ(0, ::chmod(script.c_str(), 0755));
  return script;
}

// An elastic job waits for enough slots up to --elastic-timeout (600 s): a signal ends the
// wait at once.
TEST(Hvdrun, SignalWhileAnElasticJobWaitsForSlotsEndsIt) {
  TempDir dir;
  const std::string script = DiscoveryScript(dir, "echo localhost:1\n");
  Job job({"-np", "2", "--min-np", "2", "--host-discovery-script", script, "true"});
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_EQ(0, ::kill(job.pid(), SIGTERM));
  Result r = job.Wait(10);
  EXPECT_EQ(128 + SIGTERM, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "received SIGTERM")) << r.err;
}

// The discovery script runs beside hvdrun's loop, not in it: while a call hangs (a slow cloud
// API), a signal still ends the job at once (it waited for the script's 10 s limit before).
TEST(Hvdrun, AHangingDiscoveryScriptDoesNotHoldTheJob) {
  TempDir dir;
  const std::string script = DiscoveryScript(
      dir, "[ -e " + dir.path() + "/called ] && exec sleep 30\ntouch " + dir.path() +
               "/called\necho localhost:2\n");
  Job job({"-np", "2", "--min-np", "2", "--host-discovery-script", script, "sleep", "60"});
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // the second call hangs now
  const auto signalled = Clock::now();
  ASSERT_EQ(0, ::kill(job.pid(), SIGTERM));
  Result r = job.Wait(30);
  const double took = std::chrono::duration<double>(Clock::now() - signalled).count();
  EXPECT_EQ(128 + SIGTERM, r.code) << r.err;
  EXPECT_LT(took, 5.0) << r.err;
}

// Workers that all fail as they start (a missing module, a bad path): no world ever formed, so
// no state was lost, and the summary says so (it said every worker of the world was gone, "so
// none holds the committed state").
TEST(Hvdrun, ElasticWorkersThatFailAtStartAreNamedAsSuch) {
  TempDir dir;
  const std::string script = DiscoveryScript(dir, "echo localhost:2\n");
  Result r = RunHvdrun({"-np", "2", "--min-np", "1", "--host-discovery-script", script, "sh",
                        "-c", "exit 3"});
  EXPECT_NE(0, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "every worker exited before any world formed")) << r.err;
  EXPECT_FALSE(Contains(r.err, "committed state")) << r.err;
}

TEST(Hvdrun, LeftoverBackgroundProcessesAreStoppedOnSuccess) {
  TempDir dir;
  Result r = RunHvdrun({"-np", "2", "sh", "-c",
                  "sleep 60 > /dev/null 2>&1 & echo $! > " + dir.path() + "/bg.$HVD_RANK"});
  EXPECT_EQ(0, r.code);
  for (pid_t pid : WaitForPidFiles(dir.path(), "bg", 2)) EXPECT_FALSE(Alive(pid)) << pid;
}

// hvdrun started under a soft limit of 256 descriptors runs 150 ranks (it holds about three
// descriptors a rank): it raises its soft limit to the hard one, and the ranks inherit it.
TEST(Hvdrun, ManyRanksUnderALowSoftDescriptorLimit) {
  rlimit files{};
  ASSERT_EQ(0, ::getrlimit(RLIMIT_NOFILE, &files));
  if (files.rlim_max != RLIM_INFINITY && files.rlim_max < 2048) {
    GTEST_SKIP() << "the hard descriptor limit here is " << files.rlim_max;
  }
  rlimit low = files;
  low.rlim_cur = 256;
  ASSERT_EQ(0, ::setrlimit(RLIMIT_NOFILE, &low));
  Job job({"--no-prefix", "-np", "150", "sh", "-c", "ulimit -n"});  // forks under the low limit
  ASSERT_EQ(0, ::setrlimit(RLIMIT_NOFILE, &files));
  Result r = job.Wait(120);
  ASSERT_EQ(0, r.code) << r.err;
  const std::string raised = std::to_string(std::min<rlim_t>(files.rlim_max, rlim_t{1} << 20));
  std::vector<std::string> lines = Lines(r.out);
  EXPECT_EQ(150u, lines.size()) << r.out;
  for (const std::string& l : lines) EXPECT_EQ(raised, l);
}

TEST(Hvdrun, UsageErrorsExit2) {
  struct Case { std::vector<std::string> args; const char* message; };
  std::vector<Case> cases = {
      {{"-np", "2", "--bogus", "true"}, "unknown flag '--bogus'"},
      {{"-np", "2"}, "missing COMMAND"},
      {{"true"}, "missing -np"},
      {{"-np", "2", "--log-level", "loud", "true"}, "--log-level"},
      {{"-np", "2", "--fusion-threshold-mb", "lots", "true"}, "--fusion-threshold-mb"},
      {{"-np", "x", "true"}, "-np"},
      {{"-np", "5", "-H", "localhost:4", "true"}, "larger than the 4 slot"},
  };
  for (const auto& c : cases) {
    Result r = RunHvdrun(c.args);
    EXPECT_EQ(2, r.code) << c.message;
    EXPECT_TRUE(Contains(r.err, c.message)) << r.err;
    EXPECT_TRUE(r.out.empty());
  }
}

// An interface this host lacks is an error on one host too (it is needed only across hosts, but
// its name is a mistake): exit 1 before any rank starts.
TEST(Hvdrun, MissingNetworkInterfaceIsAnError) {
  Result r = RunHvdrun({"-np", "2", "--network-interface", "nosuch0", "sh", "-c", "echo started"});
  EXPECT_EQ(1, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "no IPv4 address on interface nosuch0 on this host")) << r.err;
  EXPECT_FALSE(Contains(r.out, "started")) << r.out;
  r = RunHvdrun({"-np", "1", "--network-interface", "lo", "true"});
  EXPECT_EQ(0, r.code) << r.err;
}

// Loopback across hosts: every host has it, so each host's check passed, and every rank then
// failed at the start timeout, unable to reach the store at 127.0.0.1. Refused at once, before
// any ssh ("otherhost" need not exist).
TEST(Hvdrun, LoopbackInterfaceAcrossHostsIsRefusedAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  Result r = RunHvdrun({"-np", "2", "-H", "localhost:1,otherhost:1", "--network-interface", "lo",
                        "sh", "-c", "echo started"});
  EXPECT_EQ(1, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "interface lo is loopback (127.0.0.1 here)")) << r.err;
  EXPECT_TRUE(Contains(r.err, "the other hosts cannot reach")) << r.err;
  EXPECT_FALSE(Contains(r.out, "started")) << r.out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// 127.0.0.2 is not one of hvdrun's local names, so it is a remote host reached with ssh; on
// port 9 of the loopback nobody listens. (Real multi-host jobs: tests/launcher/multihost/.)
TEST(Hvdrun, RemoteHostThatRefusesIsReportedBeforeAnythingStarts) {
  Result r = RunHvdrun({"-H", "localhost:1,127.0.0.2:1", "-p", "9", "--start-timeout", "5", "sh",
                        "-c", "echo started"});
  EXPECT_EQ(1, r.code) << r.err;
  EXPECT_TRUE(Contains(r.err, "hvdrun: host 127.0.0.2 failed the ssh check: ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "Connection refused")) << r.err;  // ssh's own words
  EXPECT_TRUE(Contains(r.err, "1 of 1 remote host(s) cannot be used; no rank was started")) << r.err;
  EXPECT_FALSE(Contains(r.err, "localhost failed")) << r.err;
  EXPECT_EQ("", r.out);
  EXPECT_LT(r.seconds, 10.0);
}

TEST(Hvdrun, HelpExits0) {
  Result r = RunHvdrun({"--help"});
  EXPECT_EQ(0, r.code);
  EXPECT_TRUE(Contains(r.out, "--fusion-threshold-mb"));
  EXPECT_TRUE(Contains(r.out, "HVD_RANK"));
  EXPECT_TRUE(Contains(r.out, "Examples:"));
}

TEST(Hvdrun, CommandNotFound) {
  Result r = RunHvdrun({"-np", "2", "no-such-program-for-hvdrun"});
  EXPECT_EQ(127, r.code);
  EXPECT_TRUE(Contains(r.err, "command not found: no-such-program-for-hvdrun")) << r.err;
}

// An executable script without a "#!" line runs under /bin/sh, as execvp and horovodrun's shell
// run it, with its arguments.
TEST(Hvdrun, ScriptWithoutAnInterpreterLineRunsUnderSh) {
  TempDir dir;
  const std::string script = dir.path() + "/plain.sh";
  std::ofstream(script) << "echo \"plain $HVD_RANK: $#: $2\"\n";
  ASSERT_EQ(0, ::chmod(script.c_str(), 0755));
  Result r = RunHvdrun({"-np", "2", script, "a", "b c"});
  EXPECT_EQ(0, r.code) << r.err;
  EXPECT_TRUE(Contains(r.out, "[0]<stdout>:plain 0: 2: b c\n")) << r.out << r.err;
  EXPECT_TRUE(Contains(r.out, "[1]<stdout>:plain 1: 2: b c\n")) << r.out << r.err;
}

}  // namespace

namespace {

// horovodrun's --output-filename: each rank's lines also land in DIR/rank.N/{stdout,stderr},
// unprefixed, N padded to the width of the largest rank; the console keeps its copy.
TEST(Hvdrun, OutputFilenameWritesAFolderPerRank) {
  char tmpl[] = "/tmp/hvdrun_out_XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string dir = std::string(tmpl) + "/logs/of/the/job";  // made as mkdir -p makes it
  Result r = RunHvdrun({"-np", "11", "--output-filename", dir, "sh", "-c",
                        "echo out$HVD_RANK; echo err$HVD_RANK >&2"});
  ASSERT_EQ(0, r.code) << r.err;
  EXPECT_TRUE(Contains(r.out, "[10]<stdout>:out10\n")) << r.out;
  for (int k = 0; k < 11; ++k) {
    const std::string n = (k < 10 ? "0" : "") + std::to_string(k);
    EXPECT_EQ("out" + std::to_string(k) + "\n", ReadFile(dir + "/rank." + n + "/stdout")) << k;
    EXPECT_EQ("err" + std::to_string(k) + "\n", ReadFile(dir + "/rank." + n + "/stderr")) << k;
  }
  std::string cleanup = "rm -rf " + std::string(tmpl);
  EXPECT_EQ(0, std::system(cleanup.c_str()));
}

// A folder that cannot be made (or is a file) stops the job before it starts, as in horovodrun:
// not a job whose output files go missing.
TEST(Hvdrun, OutputFilenameThatCannotBeMadeIsAnError) {
  TempDir dir;
  const std::string file = dir.path() + "/file";
  std::ofstream(file) << "x";
  for (const std::string& bad : {file, file + "/sub", std::string("/proc/no-such-folder")}) {
    Result r = RunHvdrun({"-np", "2", "--output-filename", bad, "sh", "-c",
                          "touch " + dir.path() + "/ran.$HVD_RANK"});
    EXPECT_NE(0, r.code) << bad;
    EXPECT_TRUE(Contains(r.err, "--output-filename " + bad + ": cannot make or write the folder"))
        << r.err;
    EXPECT_NE(0, ::access((dir.path() + "/ran.0").c_str(), F_OK)) << bad;
  }
}

TEST(Hvdrun, CheckBuildListsWhatThisBuildHas) {
  Result r = RunHvdrun({"--check-build"});
  ASSERT_EQ(0, r.code) << r.err;
  EXPECT_TRUE(Contains(r.out, "Available Controllers:")) << r.out;
  EXPECT_TRUE(Contains(r.out, "Available Tensor Operations:")) << r.out;
  EXPECT_TRUE(Contains(r.out, "[X] TCP and shared memory")) << r.out;
}

}  // namespace
