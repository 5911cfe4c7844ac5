// Unit tests of hvdrun's flag, host-list and hostfile parsing and of rank placement.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "args.h"
#include "config_file.h"
#include "elastic.h"
#include "hosts.h"

namespace hvd {
namespace launcher {
namespace {

LaunchOptions Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "hvdrun");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseArgs(static_cast<int>(argv.size()), argv.data());
}

std::string ErrorOf(std::vector<std::string> args) {
  try {
    Parse(std::move(args));
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "no error";
}

TEST(HostList, SlotsAndDefaults) {
  auto h = ParseHostList("localhost:2,127.0.0.1, node-1.example:16");
  ASSERT_EQ(3u, h.size());
  EXPECT_EQ("localhost", h[0].host);
  EXPECT_EQ(2, h[0].slots);
  EXPECT_EQ("127.0.0.1", h[1].host);
  EXPECT_EQ(1, h[1].slots);
  EXPECT_EQ("node-1.example", h[2].host);
  EXPECT_EQ(16, h[2].slots);
  EXPECT_EQ(19, TotalSlots(h));
}

TEST(HostList, DuplicatesMergeInFirstSeenOrder) {
  auto h = ParseHostList("b:1,a:2,b:3");
  ASSERT_EQ(2u, h.size());
  EXPECT_EQ("b", h[0].host);
  EXPECT_EQ(4, h[0].slots);
  EXPECT_EQ("a", h[1].host);
}

TEST(HostList, Ipv6InBrackets) {
  auto h = ParseHostList("[::1]:3");
  ASSERT_EQ(1u, h.size());
  EXPECT_EQ("[::1]", h[0].host);
  EXPECT_EQ(3, h[0].slots);
}

TEST(HostList, Errors) {
  for (const char* bad : {"", "a:0", "a:-1", "a:x", "a:", ",a", "a,,b", "a,", ":2", "a b:2",
                          "a:99999999999", "localhost:1:2", "[::1]x:2"}) {
    EXPECT_THROW(ParseHostList(bad), LaunchError) << bad;
  }
}

TEST(Hostfile, CommentsBlankLinesAndSlots) {
  std::istringstream in(
      "# the job's hosts\n"
      "\n"
      "localhost slots=2   # two here\n"
      "   127.0.0.1 slots=3 max_slots=8\n"
      "myhost\n"
      "other:4\n"
      "spaced slots = 5 max_slots =6\n"   // Horovod reads what follows the '=', blanks and all
      "tabbed\tslots\t=\t7\r\n");
  auto h = ParseHostfile(in, "hosts.txt");
  ASSERT_EQ(6u, h.size());
  EXPECT_EQ(2, h[0].slots);
  EXPECT_EQ("127.0.0.1", h[1].host);
  EXPECT_EQ(3, h[1].slots);
  EXPECT_EQ(1, h[2].slots);
  EXPECT_EQ(4, h[3].slots);
  EXPECT_EQ("spaced", h[4].host);
  EXPECT_EQ(5, h[4].slots);
  EXPECT_EQ("tabbed", h[5].host);
  EXPECT_EQ(7, h[5].slots);
}

TEST(Hostfile, ErrorsNameFileAndLine) {
  std::istringstream in("localhost slots=2\nnode slots=two\n");
  try {
    ParseHostfile(in, "hosts.txt");
    FAIL();
  } catch (const LaunchError& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("hosts.txt:2")) << e.what();
  }
  std::istringstream junk("node cpus=2\n");
  EXPECT_THROW(ParseHostfile(junk, "f"), LaunchError);
  std::istringstream empty("# nothing\n\n");
  EXPECT_THROW(ParseHostfile(empty, "f"), LaunchError);
  std::istringstream no_count("node slots =\n");
  EXPECT_THROW(ParseHostfile(no_count, "f"), LaunchError);
}

// A file named on the command line that cannot be read says why: missing, a directory, no
// permission (as root every file is readable, so that case is not checked here).
TEST(Args, UnreadableFilesSayWhy) {
  const std::string dir = ::testing::TempDir();
  for (const char* flag : {"--hostfile", "--config-file", "--ssh-config", "--ssh-identity-file"}) {
    std::vector<std::string> args = {flag, dir, "x"};
    if (std::string(flag) != "--hostfile") args.insert(args.begin(), {"-np", "1"});
    EXPECT_EQ("cannot read '" + dir + "' given to " + flag + ": it is a directory (expected a file)",
              ErrorOf(args));
    args[args.size() - 2] = "/nonexistent/f";
    EXPECT_EQ(std::string("cannot read '/nonexistent/f' given to ") + flag +
                  ": No such file or directory",
              ErrorOf(args));
  }
}

TEST(Placement, HostOrderLocalAndCross) {
  auto p = PlaceRanks({{"a", 2}, {"b", 2}, {"c", 1}}, 5);
  ASSERT_EQ(5u, p.size());
  // rank: host local_rank/local_size cross_rank/cross_size
  struct E { const char* host; int lr, ls, cr, cs; };
  E want[] = {{"a", 0, 2, 0, 3}, {"a", 1, 2, 0, 2}, {"b", 0, 2, 1, 3}, {"b", 1, 2, 1, 2},
              {"c", 0, 1, 2, 3}};
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(r, p[r].rank);
    EXPECT_EQ(5, p[r].size);
    EXPECT_EQ(want[r].host, p[r].host) << r;
    EXPECT_EQ(want[r].lr, p[r].local_rank) << r;
    EXPECT_EQ(want[r].ls, p[r].local_size) << r;
    EXPECT_EQ(want[r].cr, p[r].cross_rank) << r;
    EXPECT_EQ(want[r].cs, p[r].cross_size) << r;
  }
}

TEST(Placement, FewerRanksThanSlotsFillFirstHosts) {
  auto p = PlaceRanks({{"a", 4}, {"b", 4}}, 3);
  ASSERT_EQ(3u, p.size());
  for (const auto& x : p) {
    EXPECT_EQ("a", x.host);
    EXPECT_EQ(3, x.local_size);
    EXPECT_EQ(1, x.cross_size);
  }
  EXPECT_THROW(PlaceRanks({{"a", 2}}, 3), LaunchError);
  EXPECT_THROW(PlaceRanks({{"a", 2}}, 0), LaunchError);
}

TEST(LocalHosts, Recognised) {
  EXPECT_TRUE(IsLocalHost("localhost"));
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  char name[256] = {};
  ASSERT_EQ(0, gethostname(name, sizeof(name) - 1));
  EXPECT_TRUE(IsLocalHost(name));
  // Host names are case-insensitive.
  EXPECT_TRUE(IsLocalHost("LOCALHOST"));
  EXPECT_TRUE(IsLocalHost("LocalHost"));
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_TRUE(IsLocalHost(upper));
  EXPECT_FALSE(IsLocalHost("surely-not-this-machine.invalid"));
  // By address, as hostfiles list hosts: every interface's address. Another loopback address
  // is a host of its own (the tests reach "remote" hosts so).
  EXPECT_FALSE(IsLocalHost("127.0.0.2"));
  EXPECT_TRUE(IsLocalHost("::1"));
  EXPECT_TRUE(IsLocalHost("[::1]"));
  ifaddrs* list = nullptr;
  ASSERT_EQ(0, getifaddrs(&list));
  std::vector<std::string> own;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text,
              sizeof(text));
    EXPECT_TRUE(IsLocalHost(text)) << text << " on " << a->ifa_name;
    own.push_back(text);
  }
  freeifaddrs(list);
  EXPECT_FALSE(own.empty());
  // An address none of the interfaces has is another host's.
  for (int last = 1; last < 255; ++last) {
    const std::string other = "198.51.100." + std::to_string(last);
    if (std::find(own.begin(), own.end(), other) != own.end()) continue;
    EXPECT_FALSE(IsLocalHost(other)) << other;
    break;
  }
}

TEST(Args, FlagsStopAtCommand) {
  auto o = Parse({"-np", "2", "--verbose", "python3", "train.py", "--lr", "0.1", "-np", "9"});
  EXPECT_EQ(2, o.np);
  EXPECT_TRUE(o.verbose);
  EXPECT_EQ((std::vector<std::string>{"python3", "train.py", "--lr", "0.1", "-np", "9"}), o.command);
  ASSERT_EQ(1u, o.hosts.size());
  EXPECT_EQ("localhost", o.hosts[0].host);
  EXPECT_EQ(2, o.hosts[0].slots);
}

TEST(Args, SpellingsOfNp) {
  EXPECT_EQ(3, Parse({"-np", "3", "x"}).np);
  EXPECT_EQ(3, Parse({"-np=3", "x"}).np);
  EXPECT_EQ(3, Parse({"--np", "3", "x"}).np);
  EXPECT_EQ(3, Parse({"--np=3", "x"}).np);
  EXPECT_EQ(3, Parse({"-n", "3", "x"}).np);
  EXPECT_EQ(3, Parse({"-n3", "x"}).np);
}

TEST(Args, DoubleDashEndsFlags) {
  auto o = Parse({"-np", "1", "--", "--weird-program", "-v"});
  EXPECT_FALSE(o.verbose);
  EXPECT_EQ((std::vector<std::string>{"--weird-program", "-v"}), o.command);
}

TEST(Args, NpFromHosts) {
  EXPECT_EQ(4, Parse({"-H", "localhost:3,127.0.0.1", "x"}).np);
  EXPECT_EQ(2, Parse({"-H", "localhost:3", "-np", "2", "x"}).np);
}

TEST(Args, KnobsMapToEnvironment) {
  auto o = Parse({"-np", "1", "--fusion-threshold-mb", "32", "--cycle-time-ms", "3.5",
                  "--cache-capacity", "0", "--timeout", "12", "--stall-check-seconds", "0",
                  "--log-level", "DEBUG", "--timeline", "/tmp/tl.json", "--start-timeout", "7",
                  "x"});
  EXPECT_EQ("33554432", o.knobs["HVD_FUSION_THRESHOLD"]);
  EXPECT_EQ("3.5", o.knobs["HVD_CYCLE_TIME"]);
  EXPECT_EQ("0", o.knobs["HVD_CACHE_CAPACITY"]);
  EXPECT_EQ("12", o.knobs["HVD_TIMEOUT_SECONDS"]);
  EXPECT_EQ("0", o.knobs["HVD_STALL_CHECK_TIME_SECONDS"]);
  EXPECT_EQ("debug", o.knobs["HVD_LOG_LEVEL"]);
  EXPECT_EQ("/tmp/tl.json", o.knobs["HVD_TIMELINE"]);
  EXPECT_EQ("7", o.knobs["HVD_START_TIMEOUT"]);
  EXPECT_DOUBLE_EQ(7.0, o.start_timeout_seconds);
}

// Durations a deadline could not hold are refused, as hvdrun's own timers' are.
TEST(Args, DurationsHaveACeiling) {
  EXPECT_NE(ErrorOf({"-np", "1", "--timeout", "1e10", "x"}).find("(at most 1e6 s)"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-np", "1", "--stall-check-shutdown-time-seconds", "inf", "x"}).find("bad value"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-np", "1", "--cycle-time-ms", "1e13", "x"}).find("(at most 1e9 ms)"),
            std::string::npos);
  EXPECT_EQ("1000000", Parse({"-np", "1", "--timeout", "1e6", "x"}).knobs["HVD_TIMEOUT_SECONDS"]);
  EXPECT_NE(ErrorOf({"-np", "1", "--timeout", "0.5", "x"}).find("(at least 1 s)"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"-np", "1", "--gloo-timeout-seconds", "0.01", "x"}).find("(at least 1 s)"),
            std::string::npos);
}

// Without --start-timeout, hvdrun waits for the ranks as long as they wait for each other: the
// environment's value (HVD_, else HOROVOD_), passed on unchanged.
TEST(Args, StartTimeoutFromTheEnvironment) {
  unsetenv("HVD_START_TIMEOUT");
  setenv("HOROVOD_START_TIMEOUT", "12", 1);
  EXPECT_DOUBLE_EQ(12.0, Parse({"-np", "1", "x"}).start_timeout_seconds);
  setenv("HVD_START_TIMEOUT", "7.5", 1);
  auto o = Parse({"-np", "1", "x"});
  EXPECT_DOUBLE_EQ(7.5, o.start_timeout_seconds);
  EXPECT_EQ("7.5", o.knobs["HVD_START_TIMEOUT"]);
  EXPECT_DOUBLE_EQ(3.0, Parse({"-np", "1", "--start-timeout", "3", "x"}).start_timeout_seconds);
  setenv("HVD_START_TIMEOUT", "1e10", 1);
  EXPECT_NE(ErrorOf({"-np", "1", "x"}).find("HVD_START_TIMEOUT (at most 1e6 s)"), std::string::npos);
  unsetenv("HVD_START_TIMEOUT");
  unsetenv("HOROVOD_START_TIMEOUT");
  EXPECT_DOUBLE_EQ(30.0, Parse({"-np", "1", "x"}).start_timeout_seconds);
}

TEST(Args, KnobsAbsentWhenNotGiven) {
  auto o = Parse({"-np", "1", "x"});
  EXPECT_EQ(0u, o.knobs.count("HVD_FUSION_THRESHOLD"));
  EXPECT_EQ(0u, o.knobs.count("HVD_LOG_LEVEL"));
  EXPECT_DOUBLE_EQ(3.0, o.grace_seconds);
  EXPECT_TRUE(o.prefix_output);
}

TEST(Args, JobFlags) {
  auto o = Parse({"-np", "1", "--grace-seconds", "0.5", "--kill-after-seconds", "1", "--no-prefix", "x"});
  EXPECT_DOUBLE_EQ(0.5, o.grace_seconds);
  EXPECT_DOUBLE_EQ(1.0, o.kill_after_seconds);
  EXPECT_FALSE(o.prefix_output);
}

TEST(Args, SshFlags) {
  auto o = Parse({"-H", "node1:2,node2:2", "-p", "2222", "-i", "/dev/null", "--ssh-config",
                  "/dev/null", "--network-interface", "eth0", "x"});
  EXPECT_EQ(4, o.np);
  EXPECT_EQ(2222, o.ssh_port);
  EXPECT_EQ("/dev/null", o.ssh_identity_file);
  EXPECT_EQ("/dev/null", o.ssh_config_file);
  EXPECT_EQ("eth0", o.network_interface);
  EXPECT_EQ(0, o.knobs.count("HVD_BIND_ADDR"));
  auto d = Parse({"-H", "node1:1", "--ssh-port=22", "--ssh-identity-file=/dev/null", "x"});
  EXPECT_EQ(22, d.ssh_port);
  EXPECT_EQ("/dev/null", d.ssh_identity_file);
  EXPECT_EQ("", d.network_interface);
}

TEST(Args, Help) {
  EXPECT_TRUE(Parse({"--help"}).help);
  EXPECT_TRUE(Parse({"-h"}).help);
  std::string text = HelpText();
  for (const char* word : {"--np", "--hosts", "--hostfile", "--fusion-threshold-mb", "--cycle-time-ms",
                           "--cache-capacity", "--timeout", "--stall-check-seconds", "--log-level",
                           "--timeline", "--start-timeout", "--grace-seconds", "--no-prefix",
                           "--verbose", "--ssh-port", "--ssh-identity-file", "--ssh-config",
                           "--network-interface", "HVD_RANK", "HVD_SECRET", "HVD_RENDEZVOUS_ADDR",
                           "HVD_BIND_ADDR", "Example"}) {
    EXPECT_NE(std::string::npos, text.find(word)) << word;
  }
}

TEST(Args, Errors) {
  struct Case { std::vector<std::string> args; const char* message; };
  std::vector<Case> cases = {
      {{"-np", "2"}, "missing COMMAND (usage"},
      {{"-np", "./train.sh"}, "missing COMMAND: './train.sh' was taken as the value of -np"},
      {{"-np", "2", "--timeline", "./train.sh"},
       "missing COMMAND: './train.sh' was taken as the value of --timeline"},
      {{"x"}, "missing -np"},
      {{"--bogus", "x"}, "unknown flag '--bogus'"},
      {{"-np"}, "needs a value"},
      {{"-np", "0", "x"}, "-np"},
      {{"-np", "two", "x"}, "'two'"},
      {{"-np", "99999999999999", "x"}, "(expected a positive integer below 1000000000)"},
      {{"-np", "3", "-H", "localhost:2", "x"}, "larger than the 2 slot"},
      {{"-np", "1", "-p", "0", "x"}, "--ssh-port"},
      {{"-np", "1", "--ssh-port", "70000", "x"}, "1 to 65535"},
      {{"-np", "1", "-i", "/nonexistent/key", "x"}, "--ssh-identity-file"},
      {{"-np", "1", "--ssh-config", "/nonexistent/config", "x"}, "--ssh-config"},
      {{"-np", "1", "--network-interface", "eth0;reboot", "x"}, "--network-interface"},
      {{"-np", "1", "--network-interface", "", "x"}, "--network-interface"},
      {{"-H", "localhost", "--hostfile", "f", "x"}, "not both"},
      {{"--hostfile", "/nonexistent/hosts", "x"}, "cannot read '/nonexistent/hosts' given to --hostfile: No such file"},
      {{"-np", "1", "--fusion-threshold-mb", "-1", "x"}, "--fusion-threshold-mb"},
      {{"-np", "1", "--cycle-time-ms", "-0.5", "x"}, "--cycle-time-ms"},
      {{"-np", "1", "--cache-capacity", "1.5", "x"}, "--cache-capacity"},
      // Values the ranks would refuse are refused here, naming the flag.
      {{"-np", "1", "--cache-capacity", "5000000", "x"}, "--cache-capacity (expected a whole number in [0, 4194304])"},
      {{"-np", "1", "--autotune-warmup-samples", "1001", "x"}, "--autotune-warmup-samples"},
      {{"-np", "1", "--autotune-warmup-samples", "2.5", "x"}, "--autotune-warmup-samples"},
      {{"-np", "1", "--autotune-steps-per-sample", "100001", "x"}, "--autotune-steps-per-sample"},
      {{"-np", "1", "--cycle-time-ms", "0x10", "x"}, "'0x10' for --cycle-time-ms"},
      {{"-np", "1", "--autotune-bayes-opt-max-samples", "abc", "x"}, "--autotune-bayes-opt-max-samples"},
      {{"-np", "1", "--autotune-gaussian-process-noise", "-1", "x"}, "--autotune-gaussian-process-noise"},
      {{"-np", "1", "--timeout", "abc", "x"}, "--timeout"},
      {{"-np", "1", "--timeout", "nan", "x"}, "--timeout"},
      {{"-np", "1", "--stall-check-seconds", "-3", "x"}, "--stall-check-seconds"},
      {{"-np", "1", "--log-level", "loud", "x"}, "--log-level"},
      {{"-np", "1", "--timeline=", "x"}, "--timeline"},
      {{"-np", "1", "--grace-seconds", "-1", "x"}, "--grace-seconds"},
      {{"-np", "1", "--start-timeout", "0", "x"}, "--start-timeout"},
      {{"-np", "1", "--grace-seconds", "1e300", "x"}, "at most"},
      {{"-np", "1", "--verbose=yes", "x"}, "takes no value"},
  };
  for (const auto& c : cases) {
    std::string err = ErrorOf(c.args);
    EXPECT_NE(std::string::npos, err.find(c.message)) << "got: " << err;
  }
}

}  // namespace
}  // namespace launcher
}  // namespace hvd

namespace hvd {
namespace launcher {
namespace {

std::string Refusal(std::vector<std::string> args) {
  std::vector<const char*> argv = {"hvdrun"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    ParseArgs(static_cast<int>(argv.size()), argv.data());
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "";
}

// horovodrun's launch line: each flag maps to hvd's own setting, or is accepted with a warning
// saying why it does nothing, or is refused saying what hvd does instead.
TEST(Args, HorovodrunSpellingsMap) {
  std::vector<std::string> line = {
      "--num-proc", "4", "--timeline-filename", "/tmp/t.json", "--timeline-mark-cycles",
      "--output-filename", "/tmp/out",
      "--disable-cache", "--hierarchical-allreduce", "--no-hierarchical-allgather", "--autotune",
      "--autotune-log-file", "/tmp/a.csv", "--autotune-warmup-samples", "2",
      "--autotune-steps-per-sample", "5", "--autotune-bayes-opt-max-samples", "20",
      "--stall-check-warning-time-seconds", "30", "--stall-check-shutdown-time-seconds", "90",
      "--gloo", "--tcp", "--gloo-timeout-seconds", "15", "--num-nccl-streams", "2",
      "--log-hide-timestamp", "python", "train.py"};
  std::vector<const char*> argv = {"hvdrun"};
  for (const auto& a : line) argv.push_back(a.c_str());
  LaunchOptions o = ParseArgs(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(4, o.np);
  EXPECT_EQ("/tmp/t.json", o.knobs["HVD_TIMELINE"]);
  EXPECT_EQ("1", o.knobs["HVD_TIMELINE_MARK_CYCLES"]);
  EXPECT_EQ("/tmp/out", o.output_dir);
  // horovodrun's --disable-cache is about its cache of start-up checks, not the response cache.
  EXPECT_EQ(0u, o.knobs.count("HVD_CACHE_CAPACITY"));
  EXPECT_EQ("1", o.knobs["HVD_HIERARCHICAL_ALLREDUCE"]);
  EXPECT_EQ("0", o.knobs["HVD_HIERARCHICAL_ALLGATHER"]);
  EXPECT_EQ("1", o.knobs["HVD_AUTOTUNE"]);
  EXPECT_EQ("/tmp/a.csv", o.knobs["HVD_AUTOTUNE_LOG"]);
  EXPECT_EQ("2", o.knobs["HVD_AUTOTUNE_WARMUP_SAMPLES"]);
  EXPECT_EQ("5", o.knobs["HVD_AUTOTUNE_STEPS_PER_SAMPLE"]);
  EXPECT_EQ("30", o.knobs["HVD_STALL_CHECK_TIME_SECONDS"]);
  EXPECT_EQ("90", o.knobs["HVD_STALL_SHUTDOWN_TIME_SECONDS"]);
  EXPECT_EQ("off", o.knobs["HVD_SHM"]);
  EXPECT_EQ("15", o.knobs["HVD_TIMEOUT_SECONDS"]);
  EXPECT_FALSE(o.mpi);
  ASSERT_EQ(4u, o.warnings.size());  // bayes-opt samples, disable-cache, NCCL streams, timestamps
  EXPECT_EQ((std::vector<std::string>{"python", "train.py"}), o.command);
}

TEST(Args, HorovodrunMpiArgsAndCheckBuild) {
  std::vector<const char*> argv = {"hvdrun", "-np", "2", "--mpi-args", "--bind-to none -x 'A=b c'",
                                   "x"};
  LaunchOptions o = ParseArgs(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(o.mpi);
  EXPECT_EQ((std::vector<std::string>{"--bind-to", "none", "-x", "A=b c"}), o.mpi_args);
  const char* cb[] = {"hvdrun", "-cb"};
  EXPECT_TRUE(ParseArgs(2, cb).check_build);
  const char* version[] = {"hvdrun", "--version"};
  EXPECT_TRUE(ParseArgs(2, version).version);
  const char* v[] = {"hvdrun", "-v"};  // horovodrun's -v: the version (--verbose is verbose)
  EXPECT_TRUE(ParseArgs(2, v).version);
  // With a command it meant --verbose, as hvdrun's -v did: refused, not a silent exit 0.
  EXPECT_NE(ErrorOf({"-v", "-np", "2", "python3", "train.py"}).find("use --verbose"),
            std::string::npos);
}

// horovodrun's single-dash long flags, its plural interface flag, the timestamp prefix and
// the opposites its help hides.
TEST(Args, HorovodrunOtherSpellings) {
  const std::string hostfile = ::testing::TempDir() + "/hvdrun_args_hostfile";
  {
    std::ofstream f(hostfile);
    f << "localhost slots=3\n";
  }
  for (const std::vector<std::string>& line :
       {std::vector<std::string>{"-np", "2", "-hostfile", hostfile, "x"},
        std::vector<std::string>{"-np", "2", "-hostfile=" + hostfile, "x"},
        std::vector<std::string>{"-np", "2", "--hostfile", hostfile, "x"}}) {
    auto o = Parse(line);
    ASSERT_EQ(1u, o.hosts.size()) << line[2];
    EXPECT_EQ(3, o.hosts[0].slots);
    EXPECT_EQ(2, o.np);
  }
  EXPECT_TRUE(Parse({"-np", "1", "-prefix-timestamp", "x"}).prefix_timestamp);
  EXPECT_TRUE(Parse({"-np", "1", "--prefix-output-with-timestamp", "x"}).prefix_timestamp);
  EXPECT_FALSE(Parse({"-np", "1", "x"}).prefix_timestamp);
  EXPECT_EQ("eth0,ib0", Parse({"-np", "1", "--network-interfaces", "eth0,ib0", "x"})
                            .network_interface);
  EXPECT_EQ("eth0,ib0", Parse({"-np", "1", "--network-interface", "eth0,ib0", "x"})
                            .network_interface);
  EXPECT_THROW(Parse({"-np", "1", "--network-interfaces", "eth0,", "x"}), LaunchError);
  // Given once per interface, as horovodrun's help shows it: every one, in order.
  EXPECT_EQ("eth0,eth1,ib0", Parse({"-np", "1", "--network-interface", "eth0",
                                    "--network-interface", "eth1", "--network-interfaces", "ib0",
                                    "x"})
                                 .network_interface);
  EXPECT_THROW(Parse({"-np", "1", "--network-interface", "lo", "--network-interface", "", "x"}),
               LaunchError);
  EXPECT_THROW(Parse({"-np", "1", "--network-interfaces", "eth0;ls", "x"}), LaunchError);
  auto off = Parse({"-np", "1", "--no-autotune", "--stall-check", "--no-timeline-mark-cycles",
                    "--log-with-timestamp", "x"});
  EXPECT_EQ("0", off.knobs["HVD_AUTOTUNE"]);
  EXPECT_EQ("0", off.knobs["HVD_TIMELINE_MARK_CYCLES"]);
  EXPECT_EQ(0u, off.knobs.count("HVD_STALL_CHECK_TIME_SECONDS"));
  EXPECT_EQ("0", off.knobs["HVD_STALL_CHECK_DISABLE"]);
  // --no-stall-check wins over a warning time, as horovodrun's HOROVOD_STALL_CHECK_DISABLE.
  auto no_stall = Parse({"-np", "1", "--no-stall-check", "--stall-check-warning-time-seconds", "10",
                         "x"});
  EXPECT_EQ("1", no_stall.knobs["HVD_STALL_CHECK_DISABLE"]);
  EXPECT_EQ(1u, off.warnings.size());  // timestamps
  EXPECT_THROW(Parse({"-np", "1", "--autotune", "--no-autotune", "x"}), LaunchError);
  EXPECT_THROW(Parse({"-np", "1", "--stall-check", "--no-stall-check", "x"}), LaunchError);
  std::remove(hostfile.c_str());
}

TEST(Args, ElasticFlags) {
  std::vector<const char*> argv = {"hvdrun", "-np", "4", "--min-np", "2", "--max-np", "6",
                                   "--host-discovery-script", "./hosts.sh", "--slots-per-host",
                                   "2", "--elastic-timeout", "30", "--reset-limit", "5",
                                   "--blacklist-cooldown-range", "10", "100", "python", "t.py"};
  LaunchOptions o = ParseArgs(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(o.elastic);
  EXPECT_EQ(4, o.np);
  EXPECT_EQ(2, o.min_np);
  EXPECT_EQ(6, o.max_np);
  EXPECT_EQ("./hosts.sh", o.discovery_script);
  EXPECT_EQ(2, o.slots_per_host);
  EXPECT_DOUBLE_EQ(30, o.elastic_timeout_seconds);
  EXPECT_EQ(5, o.reset_limit);
  EXPECT_DOUBLE_EQ(10, o.cooldown_min_seconds);
  EXPECT_DOUBLE_EQ(100, o.cooldown_max_seconds);
  EXPECT_EQ((std::vector<std::string>{"python", "t.py"}), o.command);
  // horovodrun's spellings: --min-num-proc, --max-num-proc (and with '='); a command's own
  // flags of that name stay its own.
  const char* long_names[] = {"hvdrun", "-np", "2", "--min-num-proc", "1", "--max-num-proc=3",
                              "-H", "localhost:4", "python", "t.py", "--min-num-proc", "9"};
  LaunchOptions l = ParseArgs(12, long_names);
  EXPECT_TRUE(l.elastic);
  EXPECT_EQ(1, l.min_np);
  EXPECT_EQ(3, l.max_np);
  EXPECT_EQ((std::vector<std::string>{"python", "t.py", "--min-num-proc", "9"}), l.command);
  // -np defaults to --min-np; --min-np to -np; the comma spelling of the range.
  const char* min_only[] = {"hvdrun", "--min-np", "3", "--host-discovery-script", "h", "x"};
  LaunchOptions m = ParseArgs(6, min_only);
  EXPECT_EQ(3, m.np);
  EXPECT_EQ(3, m.min_np);
  EXPECT_EQ(0, m.max_np);
  const char* comma[] = {"hvdrun", "-np", "2", "--max-np", "3", "--blacklist-cooldown-range=1,2",
                         "x"};
  LaunchOptions c = ParseArgs(7, comma);
  EXPECT_EQ(2, c.min_np);
  EXPECT_DOUBLE_EQ(2, c.cooldown_max_seconds);
  const char* plain[] = {"hvdrun", "-np", "2", "x"};
  EXPECT_FALSE(ParseArgs(4, plain).elastic);
  // --reset-limit 0, as Horovod's: no world after the first; without the flag, no bound.
  const char* no_reset[] = {"hvdrun", "-np", "2", "--min-np", "1", "--reset-limit", "0", "x"};
  EXPECT_EQ(0, ParseArgs(8, no_reset).reset_limit);
  EXPECT_EQ(-1, m.reset_limit);
}

TEST(Args, ElasticTimeoutFromEitherSpelling) {
  const char* argv[] = {"hvdrun", "-np", "2", "--min-np", "1", "x"};
  ::setenv("HOROVOD_ELASTIC_TIMEOUT", "7", 1);
  EXPECT_DOUBLE_EQ(7, ParseArgs(6, argv).elastic_timeout_seconds);
  ::setenv("HVD_ELASTIC_TIMEOUT", "5", 1);  // hvd's spelling wins, as every knob's
  EXPECT_DOUBLE_EQ(5, ParseArgs(6, argv).elastic_timeout_seconds);
  ::unsetenv("HOROVOD_ELASTIC_TIMEOUT");
  EXPECT_DOUBLE_EQ(5, ParseArgs(6, argv).elastic_timeout_seconds);
  ::unsetenv("HVD_ELASTIC_TIMEOUT");
  EXPECT_DOUBLE_EQ(600, ParseArgs(6, argv).elastic_timeout_seconds);
}

TEST(Args, ElasticFlagErrorsSayWhat) {
  EXPECT_NE(std::string::npos, Refusal({"-np", "2", "--min-np", "3", "x"}).find("larger than -np"));
  EXPECT_NE(std::string::npos, Refusal({"-np", "4", "--max-np", "3", "x"}).find("smaller than -np"));
  EXPECT_NE(std::string::npos, Refusal({"-np", "2", "--min-np", "0", "x"}).find("positive"));
  EXPECT_NE(std::string::npos,
            Refusal({"-np", "2", "--min-np", "1", "--reset-limit", "-1", "x"}).find("0 or more"));
  EXPECT_NE(std::string::npos,
            Refusal({"-np", "2", "--reset-limit", "3", "x"}).find("elastic jobs only"));
  EXPECT_NE(std::string::npos,
            Refusal({"-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "5", "x"})
                .find("MIN MAX"));
  EXPECT_NE(std::string::npos,
            Refusal({"-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "5", "1", "x"})
                .find("MAX is smaller"));
  EXPECT_NE(std::string::npos, Refusal({"-np", "2", "--min-np", "1", "--mpi", "x"}).find("--mpi"));
}

TEST(Args, HorovodrunFlagsHvdRefusesSayWhat) {
  EXPECT_NE(std::string::npos, Refusal({"-np", "1", "--jsrun", "x"}).find("jsrun"));
  EXPECT_NE(std::string::npos, Refusal({"-np", "1", "--gloo", "--mpi", "x"}).find("not both"));
  EXPECT_NE(std::string::npos,
            Refusal({"-np", "1", "--hierarchical-allreduce", "--no-hierarchical-allreduce", "x"})
                .find("not both"));
  EXPECT_NE(std::string::npos, Refusal({"-np", "1", "--num-proc", "2", "x"}).find("not both"));
}

// A configuration file written for the test, removed after it.
class ConfigFile {
 public:
  explicit ConfigFile(const std::string& text) {
    char tmpl[] = "/tmp/hvdrun_config.XXXXXX";
    const int fd = ::mkstemp(tmpl);
    path_ = tmpl;
    ::close(fd);
    std::ofstream(path_) << text;
  }
  ~ConfigFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Every setting of horovodrun's configuration file, in the file's block YAML (comments, a
// document marker, quoted and plain scalars, YAML's spellings of true and false).
const char kHorovodConfig[] =
    "# settings of a horovodrun job\n"
    "---\n"
    "controller: gloo\n"
    "\n"
    "params:\n"
    "  fusion_threshold_mb: 32\n"
    "  cycle_time_ms: 2.5   # fractions too\n"
    "  cache_capacity: 2048\n"
    "  hierarchical_allreduce: yes\n"
    "  hierarchical_allgather: False\n"
    "autotune:\n"
    "  enabled: true\n"
    "  log_file: 'tune #1.csv'\n"
    "  warmup_samples: 5\n"
    "  steps_per_sample: 20\n"
    "  bayes_opt_max_samples: 50\n"
    "  gaussian_process_noise: 0.9\n"
    "timeline:\n"
    "    filename: \"/tmp/tl.json\"\n"
    "    mark_cycles: on\n"
    "stall_check:\n"
    "  enabled: true\n"
    "  warning_time_seconds: 120\n"
    "  shutdown_time_seconds: 240\n"
    "library_options:\n"
    "  mpi_threads_disable: true\n"
    "  num_nccl_streams: 2\n"
    "  ccl_bgt_affinity: 1\n"
    "  gloo_timeout_seconds: 60\n"
    "logging:\n"
    "  level: INFO\n"
    "  hide_timestamp: true\n";

TEST(ConfigFile, HorovodsSettingsBecomeKnobs) {
  ConfigFile f(kHorovodConfig);
  LaunchOptions o = Parse({"-np", "2", "--config-file", f.path(), "x"});
  EXPECT_FALSE(o.mpi);
  const std::map<std::string, std::string> want = {
      {"HVD_FUSION_THRESHOLD", std::to_string(32 * 1024 * 1024)},
      {"HVD_CYCLE_TIME", "2.5"},
      {"HVD_CACHE_CAPACITY", "2048"},
      {"HVD_HIERARCHICAL_ALLREDUCE", "1"},
      {"HVD_HIERARCHICAL_ALLGATHER", "0"},
      {"HVD_AUTOTUNE", "1"},
      {"HVD_AUTOTUNE_LOG", "tune #1.csv"},
      {"HVD_AUTOTUNE_WARMUP_SAMPLES", "5"},
      {"HVD_AUTOTUNE_STEPS_PER_SAMPLE", "20"},
      {"HVD_TIMELINE", "/tmp/tl.json"},
      {"HVD_TIMELINE_MARK_CYCLES", "1"},
      {"HVD_STALL_CHECK_DISABLE", "0"},
      {"HVD_STALL_CHECK_TIME_SECONDS", "120"},
      {"HVD_STALL_SHUTDOWN_TIME_SECONDS", "240"},
      {"HVD_TIMEOUT_SECONDS", "60"},
      {"HVD_LOG_LEVEL", "info"},
      {"HVD_START_TIMEOUT", "30"},
  };
  EXPECT_EQ(want, o.knobs);
  // The settings hvd has no use for are named as the file has them, with their line.
  const std::string all = [&] {
    std::string s;
    for (const auto& w : o.warnings) s += w + "\n";
    return s;
  }();
  for (const char* named : {"'autotune.bayes_opt_max_samples' in ", "line 16 has no effect",
                            "'autotune.gaussian_process_noise' in ",
                            "'library_options.mpi_threads_disable' in ",
                            "'library_options.num_nccl_streams' in ",
                            "'library_options.ccl_bgt_affinity' in ", "'logging.hide_timestamp' in "}) {
    EXPECT_NE(std::string::npos, all.find(named)) << named << " in:\n" << all;
  }
  EXPECT_EQ(6u, o.warnings.size()) << all;
}

TEST(ConfigFile, TheCommandLineWins) {
  ConfigFile f(kHorovodConfig);
  LaunchOptions o = Parse({"-np", "2", "--cycle-time-ms", "7", "--no-hierarchical-allreduce",
                           "--no-autotune", "--timeline", "/tmp/cli.json", "--stall-check-seconds",
                           "9", "--timeout", "11", "--log-level", "error", "--mpi",
                           "--config-file=" + f.path(), "x"});
  EXPECT_EQ("7", o.knobs["HVD_CYCLE_TIME"]);
  EXPECT_EQ("0", o.knobs["HVD_HIERARCHICAL_ALLREDUCE"]);
  EXPECT_EQ("0", o.knobs["HVD_AUTOTUNE"]);
  EXPECT_EQ("/tmp/cli.json", o.knobs["HVD_TIMELINE"]);
  EXPECT_EQ("9", o.knobs["HVD_STALL_CHECK_TIME_SECONDS"]);
  EXPECT_EQ("11", o.knobs["HVD_TIMEOUT_SECONDS"]);
  EXPECT_EQ("error", o.knobs["HVD_LOG_LEVEL"]);
  EXPECT_TRUE(o.mpi);  // the file's controller: gloo gives way to --mpi
  EXPECT_EQ("2048", o.knobs["HVD_CACHE_CAPACITY"]);  // what the command line leaves is the file's
  // A file may also set nothing, or only what the command line sets.
  ConfigFile empty("# nothing\nparams:\n");
  EXPECT_EQ(1u, Parse({"-np", "1", "--config-file", empty.path(), "x"}).knobs.size());
}

TEST(ConfigFile, ErrorsNameTheLineAndWhatWasExpected) {
  auto refusal = [](const std::string& text) {
    ConfigFile f(text);
    return ErrorOf({"-np", "1", "--config-file", f.path(), "x"});
  };
  const struct {
    const char* text;
    const char* says;
  } cases[] = {
      {"params:\n  cycle_time_ms: abc\n",
       "for --cycle-time-ms (expected a number) (set by 'params.cycle_time_ms' in "},
      {"stall_check:\n  warning_time_seconds: -1\n", "'stall_check.warning_time_seconds' in "},
      {"params:\n\tcycle_time_ms: 1\n", "line 2: a tab in the indent"},
      {"params: {cycle_time_ms: 1}\n", "line 1: '{cycle_time_ms: 1}' is YAML hvdrun does not read"},
      {"controller: nccl\n", "controller 'nccl' (expected gloo or mpi)"},
      {"autotune:\n  enabled: maybe\n", "'maybe' for autotune.enabled (expected true or false)"},
      {"params:\n  cycle_time_ms: 1\n    more: 2\n", "line 3: indented unlike the lines above"},
      {"  cycle_time_ms: 1\n", "line 1: an indented line outside a section"},
      {"params:\n  cycle_time_ms\n", "line 2: expected 'key: value'"},
      {"timeline:\n  filename: 'open\n", "unterminated quote"},
  };
  for (const auto& c : cases) {
    EXPECT_NE(std::string::npos, refusal(c.text).find(c.says)) << c.text << " -> " << refusal(c.text);
  }
  EXPECT_EQ("cannot read '/nonexistent/c.yaml' given to --config-file: No such file or directory",
            ErrorOf({"-np", "1", "--config-file", "/nonexistent/c.yaml", "x"}));
  ConfigFile f("params:\n");
  EXPECT_NE(std::string::npos, ErrorOf({"-np", "1", "--config-file", f.path(), "--config-file",
                                        f.path(), "x"}).find("once"));
  // --help starts nothing and reads no file.
  EXPECT_TRUE(Parse({"--help", "--config-file", "/nonexistent/c.yaml"}).help);
}

TEST(ConfigFile, SettingsHorovodrunDoesNotReadAreIgnoredWithAWarning) {
  const ConfigFlags c = ConfigFileFlags("gpu:\n  count: 8\nparams:\n  fusion_threshold: 1\n"
                                        "  cycle_time_ms: ~\n",
                                        "c.yaml", {});
  EXPECT_TRUE(c.flags.empty());  // a null value is left unset, as horovodrun leaves it
  ASSERT_EQ(2u, c.warnings.size());
  EXPECT_EQ("'gpu.count' in c.yaml line 2 is not a setting horovodrun reads; ignored", c.warnings[0]);
  EXPECT_EQ("'params.fusion_threshold' in c.yaml line 4 is not a setting horovodrun reads; ignored",
            c.warnings[1]);
  // Sections in any order, each setting once as flags; "..." ends the document.
  const ConfigFlags d = ConfigFileFlags(
      "logging:\n  level: debug\ncontroller: MPI\n...\nparams:\n  cycle_time_ms: 1\n", "d.yaml", {});
  EXPECT_EQ((std::vector<std::string>{"--log-level", "debug", "--mpi"}), d.flags);
}

TEST(Elastic, DiscoveredHostsParse) {
  auto hosts = ParseDiscoveredHosts("# comment\nnode1:4\n\n  node2  \nnode3:1 # tail\nnode1:2\n", 3);
  ASSERT_EQ(3u, hosts.size());
  EXPECT_EQ("node1", hosts[0].host);
  EXPECT_EQ(2, hosts[0].slots);  // the last line for a host wins
  EXPECT_EQ("node2", hosts[1].host);
  EXPECT_EQ(3, hosts[1].slots);  // --slots-per-host
  EXPECT_EQ(1, hosts[2].slots);
  EXPECT_TRUE(ParseDiscoveredHosts("", 1).empty());
  for (const char* bad : {"node:0\n", "node:x\n", ":3\n", "a b:2\n"}) {
    EXPECT_THROW(ParseDiscoveredHosts(bad, 1), LaunchError) << bad;
  }
  // Each refusal says what was wrong with the line.
  auto refusal = [](const std::string& text) {
    try {
      ParseDiscoveredHosts(text, 1);
    } catch (const LaunchError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ("bad slot count '99999999999999' in the host discovery script's line "
            "'localhost:99999999999999' (expected a positive integer below 1000000000)",
            refusal("localhost:99999999999999\n"));
  EXPECT_EQ("bad entry '::1' in the host discovery script's line '::1': expected host or "
            "host:slots (an IPv6 address in brackets: [::1]:2)",
            refusal("::1\n"));
  EXPECT_EQ("slot count must be positive in the host discovery script's line 'node:0'",
            refusal("node:0\n"));
  auto v6 = ParseDiscoveredHosts("[::1]:2\n[::1]\n", 3);
  ASSERT_EQ(1u, v6.size());
  EXPECT_EQ("[::1]", v6[0].host);
  EXPECT_EQ(3, v6[0].slots);  // the last line wins, with --slots-per-host
}

TEST(Elastic, DiscoveryScriptRunsBounded) {
  EXPECT_EQ("a:2\nb\n", RunDiscoveryScript("printf 'a:2\\nb\\n'", 5));
  try {
    RunDiscoveryScript("exit 3", 5);
    ADD_FAILURE() << "no error";
  } catch (const LaunchError& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("exit code 3")) << e.what();
  }
  auto t0 = std::chrono::steady_clock::now();
  try {
    RunDiscoveryScript("sleep 30", 0.3);
    ADD_FAILURE() << "no error";
  } catch (const LaunchError& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("did not finish")) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(Elastic, WorldTextIsOneLinePerRank) {
  EXPECT_EQ("h:0#0 h\nk:1#3 k\n", WorldText({{"h:0#0", "h"}, {"k:1#3", "k"}}));
}


}  // namespace
}  // namespace launcher
}  // namespace hvd
