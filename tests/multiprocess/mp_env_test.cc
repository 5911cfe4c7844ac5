// Bad environments: each case runs Engine::CreateFromEnvironment in a forked child whose
// environment holds only the case's variables (the contract is read once per process), and the
// parent checks the reported status.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "hvd/engine.h"
#include "mp_fork.h"

extern char** environ;

namespace mp {
namespace {

using hvd::DataType;
using hvd::Engine;
using hvd::ReduceOp;
using hvd::TensorView;

using Env = std::vector<std::pair<std::string, std::string>>;

// Removes every variable that could tell hvd who it is, then sets `env`.
void ReplaceEnvironment(const Env& env) {
  std::vector<std::string> drop;
  for (char** p = environ; *p; ++p) {
    std::string kv = *p;
    std::string name = kv.substr(0, kv.find('='));
    for (const char* prefix : {"HVD_", "HOROVOD_", "OMPI_", "PMI_", "SLURM_"}) {
      if (name.rfind(prefix, 0) == 0) drop.push_back(name);
    }
  }
  for (const auto& name : drop) unsetenv(name.c_str());
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
}

struct Outcome {
  bool finished = false;
  std::string create;  // "OK" or the status
  std::string detail;  // after OK: rank/size and an allreduce's result
  double seconds = 0;
  std::string describe;
};

Outcome CreateWith(const Env& env) {
  ForkedWorld w(1, 30.0);  // only the fork and pipe machinery; the store goes unused
  Outcome o;
  if (!w.Start([env](int, const hvd::Options&, const Reporter& out) {
        ReplaceEnvironment(env);
        auto e = Engine::CreateFromEnvironment();
        if (!e.ok()) {
          out.Say("create", e.status().ToString());
          return 0;
        }
        out.Say("create", "OK");
        float x[3] = {1, 2, 3};
        TensorView v(x, DataType::kFloat32, {3});
        hvd::Status s = (*e)->Allreduce("env.check", v, v, ReduceOp::kSum)->WaitFor(std::chrono::seconds(30));
        out.Say("detail", "rank=" + std::to_string((*e)->rank()) + " size=" + std::to_string((*e)->size()) +
                              " allreduce=" + s.ToString() + " values=" + std::to_string(x[0]) + "," +
                              std::to_string(x[2]));
        return 0;
      })) {
    return o;
  }
  o.finished = w.WaitAll(60);
  const ChildResult& c = w.result(0);
  o.create = c.values.count("create") ? c.values.at("create") : "";
  o.detail = c.values.count("detail") ? c.values.at("detail") : "";
  o.seconds = c.seconds;
  o.describe = Describe(c);
  return o;
}

void ExpectRefused(const Env& env, const std::string& names) {
  Outcome o = CreateWith(env);
  SCOPED_TRACE(o.describe);
  ASSERT_TRUE(o.finished);
  EXPECT_EQ(o.create.rfind("InvalidArgument", 0), 0u) << o.create;
  EXPECT_NE(o.create.find(names), std::string::npos) << "the message does not name " << names;
}

TEST(BadEnvironment, SizeWithoutRendezvous) {
  ExpectRefused({{"HVD_RANK", "0"}, {"HVD_SIZE", "2"}}, "HVD_RENDEZVOUS_ADDR");
}

TEST(BadEnvironment, SizeWithAddressButNoPort) {
  ExpectRefused({{"HVD_RANK", "1"}, {"HVD_SIZE", "2"}, {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"}},
                "HVD_RENDEZVOUS_PORT");
}

TEST(BadEnvironment, TimeoutNotANumber) { ExpectRefused({{"HVD_TIMEOUT_SECONDS", "abc"}}, "HVD_TIMEOUT_SECONDS"); }

// Numbers are decimal and taken as written: no hexadecimal (strtod reads "0x10" as 16), no
// leading blanks.
TEST(BadEnvironment, NumbersAsWritten) {
  ExpectRefused({{"HVD_TIMEOUT_SECONDS", "0x10"}},
                "HVD_TIMEOUT_SECONDS='0x10': expected a number from 1 to 1e+06");
  ExpectRefused({{"HVD_TIMEOUT_SECONDS", " 5"}}, "HVD_TIMEOUT_SECONDS=' 5'");
  ExpectRefused({{"HVD_CACHE_CAPACITY", " 64"}}, "HVD_CACHE_CAPACITY=' 64'");
}

// A duration no deadline could hold (nanoseconds in 64 bits) is refused, not wrapped around
// into an instant timeout.
TEST(BadEnvironment, DurationsHaveACeiling) {
  ExpectRefused({{"HVD_TIMEOUT_SECONDS", "1e10"}},
                "HVD_TIMEOUT_SECONDS='1e10': expected a number from 1 to 1e+06");
  // And a floor: under a second, a pause in the scheduler reads as a lost peer.
  ExpectRefused({{"HVD_TIMEOUT_SECONDS", "0.001"}},
                "HVD_TIMEOUT_SECONDS='0.001': expected a number from 1 to 1e+06");
  ExpectRefused({{"HOROVOD_TIMEOUT_SECONDS", "inf"}}, "HOROVOD_TIMEOUT_SECONDS");
  ExpectRefused({{"HVD_START_TIMEOUT", "1e12"}}, "HVD_START_TIMEOUT");
  ExpectRefused({{"HVD_STALL_SHUTDOWN_TIME_SECONDS", "1e99"}}, "HVD_STALL_SHUTDOWN_TIME_SECONDS");
  ExpectRefused({{"HVD_CYCLE_TIME", "1e13"}}, "HVD_CYCLE_TIME='1e13': expected a number from 0 to 1e+09");
}

TEST(BadEnvironment, OtherKnobsNotParsable) {
  ExpectRefused({{"HVD_FUSION_THRESHOLD", "-1"}}, "HVD_FUSION_THRESHOLD");
  ExpectRefused({{"HVD_CACHE_CAPACITY", "lots"}}, "HVD_CACHE_CAPACITY");
  ExpectRefused({{"HVD_CACHE_CAPACITY", "16777216"}},
                "HVD_CACHE_CAPACITY='16777216': expected an integer in [0, 4194304]");
  ExpectRefused({{"HVD_CYCLE_TIME", "1ms"}}, "HVD_CYCLE_TIME");
  ExpectRefused({{"HVD_STAGING_PIECE_BYTES", "-4096"}},
                "HVD_STAGING_PIECE_BYTES='-4096': expected");
  ExpectRefused({{"HOROVOD_STAGING_PIECE_BYTES", "4M"}}, "HOROVOD_STAGING_PIECE_BYTES");
  ExpectRefused({{"HVD_STALL_CHECK_TIME_SECONDS", "x"}}, "HVD_STALL_CHECK_TIME_SECONDS");
  ExpectRefused({{"HVD_LOG_LEVEL", "loud"}}, "HVD_LOG_LEVEL");
  ExpectRefused({{"HVD_HIERARCHICAL_ALLREDUCE", "maybe"}},
                "HVD_HIERARCHICAL_ALLREDUCE='maybe': expected auto, 1 (on, true) or 0 (off, false)");
  ExpectRefused({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "2"}}, "HOROVOD_HIERARCHICAL_ALLREDUCE");
  ExpectRefused({{"HVD_HIERARCHICAL_ALLGATHER", "sometimes"}},
                "HVD_HIERARCHICAL_ALLGATHER='sometimes': expected auto, 1 (on, true) or 0 (off, false)");
  ExpectRefused({{"HOROVOD_HIERARCHICAL_ALLGATHER", "-1"}}, "HOROVOD_HIERARCHICAL_ALLGATHER");
  ExpectRefused({{"HVD_SHM", "yes please"}},
                "HVD_SHM='yes please': expected auto, 1 (on, true) or 0 (off, false)");
  ExpectRefused({{"HVD_SYMMETRIC_NEGOTIATION", "both"}},
                "HVD_SYMMETRIC_NEGOTIATION='both': expected auto, 1 (on, true) or 0 (off, false)");
  // Every knob's HOROVOD_ spelling is read, hvd's own included (they were ignored).
  ExpectRefused({{"HOROVOD_SHM", "bogus"}}, "HOROVOD_SHM='bogus': expected auto");
  ExpectRefused({{"HOROVOD_SYMMETRIC_NEGOTIATION", "bogus"}},
                "HOROVOD_SYMMETRIC_NEGOTIATION='bogus': expected auto");
  ExpectRefused({{"HVD_START_TIMEOUT", "soon"}}, "HVD_START_TIMEOUT");
  ExpectRefused({{"HVD_RANK", "0"}, {"HVD_SIZE", "2"}, {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"},
                 {"HVD_RENDEZVOUS_PORT", "99999"}},
                "HVD_RENDEZVOUS_PORT");
}

TEST(BadEnvironment, RankOutsideSize) {
  ExpectRefused({{"HVD_RANK", "2"}, {"HVD_SIZE", "2"}, {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"},
                 {"HVD_RENDEZVOUS_PORT", "1234"}},
                "rank 2");
}

TEST(BadEnvironment, RankWithoutSize) { ExpectRefused({{"HVD_RANK", "0"}}, "HVD_SIZE"); }

// Nothing listens at the rendezvous address: creation fails within HVD_START_TIMEOUT (plus slack)
// with a message that names the store, instead of waiting forever.
TEST(BadEnvironment, UnreachableRendezvous) {
  // Port 1 (tcpmux) is privileged and unused: connecting is refused.
  Outcome o = CreateWith({{"HVD_RANK", "1"}, {"HVD_SIZE", "2"}, {"HVD_RENDEZVOUS_ADDR", "127.0.0.1"},
                          {"HVD_RENDEZVOUS_PORT", "1"}, {"HVD_START_TIMEOUT", "2"}});
  SCOPED_TRACE(o.describe);
  ASSERT_TRUE(o.finished);
  EXPECT_NE(o.create, "OK");
  EXPECT_NE(o.create.find("rendezvous"), std::string::npos) << o.create;
  EXPECT_LT(o.seconds, 2.0 + 10.0);
}

TEST(GoodEnvironment, NoVariablesIsAWorldOfOne) {
  Outcome o = CreateWith({});
  SCOPED_TRACE(o.describe);
  ASSERT_TRUE(o.finished);
  EXPECT_EQ(o.create, "OK");
  EXPECT_EQ(o.detail, "rank=0 size=1 allreduce=OK values=1.000000,3.000000");
}

TEST(BadEnvironment, GlooTimeoutIsNamed) {
  ExpectRefused({{"HOROVOD_GLOO_TIMEOUT_SECONDS", "soon"}}, "HOROVOD_GLOO_TIMEOUT_SECONDS='soon'");
}

TEST(BadEnvironment, HorovodAliasIsNamed) {
  Outcome o = CreateWith({{"HOROVOD_TIMEOUT_SECONDS", "abc"}});
  SCOPED_TRACE(o.describe);
  ASSERT_TRUE(o.finished);
  EXPECT_NE(o.create.find("HOROVOD_TIMEOUT_SECONDS"), std::string::npos) << o.create;
}

// Both spellings set, differently: HVD_'s is taken (with a warning naming both), whatever the
// other holds.
TEST(GoodEnvironment, HvdSpellingWinsOverHorovods) {
  Outcome o = CreateWith({{"HVD_CACHE_CAPACITY", "16"}, {"HOROVOD_CACHE_CAPACITY", "lots"}});
  SCOPED_TRACE(o.describe);
  ASSERT_TRUE(o.finished);
  EXPECT_EQ(o.create, "OK");
  Outcome bad = CreateWith({{"HVD_TIMEOUT_SECONDS", "abc"}, {"HOROVOD_TIMEOUT_SECONDS", "5"}});
  ASSERT_TRUE(bad.finished);
  EXPECT_NE(bad.create.find("HVD_TIMEOUT_SECONDS='abc'"), std::string::npos) << bad.create;
}

// What Options::FromEnvironment makes of `env`: the status, or the stall and switch settings.
std::string OptionsWith(const Env& env) {
  ForkedWorld w(1, 30.0);
  if (!w.Start([env](int, const hvd::Options&, const Reporter& out) {
        ReplaceEnvironment(env);
        auto o = hvd::Options::FromEnvironment();
        if (!o.ok()) {
          out.Say("options", o.status().ToString());
          return 0;
        }
        out.Say("options", "timeout=" + std::to_string(static_cast<int>(o->timeout_seconds)) +
                               " stall=" + std::to_string(static_cast<int>(o->stall_check_seconds)) +
                               " shutdown=" +
                               std::to_string(static_cast<int>(o->stall_shutdown_seconds)) +
                               " autotune=" + std::to_string(o->autotune) +
                               " marks=" + std::to_string(o->timeline_mark_cycles) +
                               (o->cpu_operations == hvd::Options::CpuOperations::kMpi
                                    ? " cpu=mpi"
                                    : ""));
        return 0;
      })) {
    return "(not started)";
  }
  if (!w.WaitAll(60)) return "(did not finish)";
  const ChildResult& c = w.result(0);
  return c.values.count("options") ? c.values.at("options") : "(no report) " + Describe(c);
}

// As Horovod's HOROVOD_STALL_CHECK_DISABLE (hvdrun --no-stall-check): a number above 0 turns
// the stall check off, warnings and shutdown both, whatever their times say.
TEST(GoodEnvironment, StallCheckDisable) {
  EXPECT_EQ(OptionsWith({}), "timeout=30 stall=60 shutdown=0 autotune=0 marks=0");
  EXPECT_EQ(OptionsWith({{"HOROVOD_STALL_CHECK_DISABLE", "1"},
                         {"HOROVOD_STALL_CHECK_TIME_SECONDS", "5"},
                         {"HVD_STALL_SHUTDOWN_TIME_SECONDS", "30"}}),
            "timeout=30 stall=0 shutdown=0 autotune=0 marks=0");
  EXPECT_EQ(OptionsWith({{"HVD_STALL_CHECK_DISABLE", "2"}}), "timeout=30 stall=0 shutdown=0 autotune=0 marks=0");
  EXPECT_EQ(OptionsWith({{"HVD_STALL_CHECK_DISABLE", "0"}, {"HVD_STALL_CHECK_TIME_SECONDS", "5"}}),
            "timeout=30 stall=5 shutdown=0 autotune=0 marks=0");
  EXPECT_EQ(OptionsWith({{"HVD_STALL_CHECK_DISABLE", "True"}}), "timeout=30 stall=0 shutdown=0 autotune=0 marks=0");
  EXPECT_NE(OptionsWith({{"HVD_STALL_CHECK_DISABLE", "sometimes"}}).find("HVD_STALL_CHECK_DISABLE='sometimes'"),
            std::string::npos);
}

// Horovod's Gloo timeout is hvd's one timeout where HVD_/HOROVOD_TIMEOUT_SECONDS is not set.
TEST(GoodEnvironment, GlooTimeoutSeconds) {
  EXPECT_EQ(OptionsWith({{"HOROVOD_GLOO_TIMEOUT_SECONDS", "45"}}),
            "timeout=45 stall=60 shutdown=0 autotune=0 marks=0");
  EXPECT_EQ(OptionsWith({{"HOROVOD_GLOO_TIMEOUT_SECONDS", "45"}, {"HVD_TIMEOUT_SECONDS", "12"}}),
            "timeout=12 stall=60 shutdown=0 autotune=0 marks=0");
}

// Switches take their words in any case, as users write them.
TEST(GoodEnvironment, SwitchesInAnyCase) {
  EXPECT_EQ(OptionsWith({{"HOROVOD_AUTOTUNE", "True"}, {"HVD_TIMELINE_MARK_CYCLES", "ON"}}),
            "timeout=30 stall=60 shutdown=0 autotune=1 marks=1");
  EXPECT_EQ(OptionsWith({{"HOROVOD_AUTOTUNE", "FALSE"}}), "timeout=30 stall=60 shutdown=0 autotune=0 marks=0");
  EXPECT_EQ(OptionsWith({{"HVD_SHM", "Auto"}, {"HOROVOD_HIERARCHICAL_ALLREDUCE", "Off"}}),
            "timeout=30 stall=60 shutdown=0 autotune=0 marks=0");
  // Horovod's docs write HOROVOD_CPU_OPERATIONS in capitals.
  EXPECT_EQ(OptionsWith({{"HOROVOD_CPU_OPERATIONS", "GLOO"}}),
            "timeout=30 stall=60 shutdown=0 autotune=0 marks=0");
  EXPECT_EQ(OptionsWith({{"HOROVOD_CPU_OPERATIONS", "MPI"}}),
            "timeout=30 stall=60 shutdown=0 autotune=0 marks=0 cpu=mpi");
  EXPECT_EQ(OptionsWith({{"HVD_CPU_OPERATIONS", "mpi"}}),
            "timeout=30 stall=60 shutdown=0 autotune=0 marks=0 cpu=mpi");
}

// Validate refuses `o` with InvalidArgument, its message holding `needle`.
void ExpectOptionsRefused(const hvd::Options& o, const std::string& needle) {
  hvd::Status s = o.Validate();
  EXPECT_EQ(s.code(), hvd::StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
}

// The job's world named as MPI ranks or a communicator (hvd.init(comm=...)): a list with a
// repeated or negative rank, both forms at once, or an elastic job are refused before MPI is
// touched, saying what was wrong.
TEST(BadOptions, MpiWorldNamedWrongly) {
  hvd::Options o;
  o.mpi_world_ranks = {2, 0, 2};
  ExpectOptionsRefused(o, "must be distinct and not negative; entry 2 is 2");
  o.mpi_world_ranks = {0, -1};
  ExpectOptionsRefused(o, "entry 1 is -1");
  o.mpi_world_ranks = {0, 1};
  EXPECT_TRUE(o.Validate().ok());
  o.mpi_comm = 0;
  ExpectOptionsRefused(o, "named twice");
  o.mpi_world_ranks.clear();
  EXPECT_TRUE(o.Validate().ok());
  o.elastic = true;
  o.rendezvous_addr = "127.0.0.1";
  o.rendezvous_port = 1;
  o.elastic_id = "w0";
  ExpectOptionsRefused(o, "elastic job");
}

// An Options a caller fills itself is held to the environment's ranges: a cache capacity,
// spin window or autotune count out of range is refused by Validate (and Engine::Create),
// naming the field and the range, as HVD_CACHE_CAPACITY=-5 is refused at start.
TEST(BadOptions, IntegerKnobsOutOfRange) {
  hvd::Options o;
  o.cache_capacity = -5;
  ExpectOptionsRefused(
      o, "cache_capacity (HVD_CACHE_CAPACITY) is -5: expected an integer in [0, 4194304]");
  o.cache_capacity = 2000000000;
  ExpectOptionsRefused(o, "cache_capacity (HVD_CACHE_CAPACITY) is 2000000000");
  o.cache_capacity = 0;
  EXPECT_TRUE(o.Validate().ok());
  o.spin_microseconds = -7;
  ExpectOptionsRefused(o, "spin_microseconds (HVD_SPIN_MICROSECONDS; -1: the default) is -7");
  o.spin_microseconds = -1;
  EXPECT_TRUE(o.Validate().ok());
  o.autotune_warmup_samples = -1;
  ExpectOptionsRefused(o, "autotune_warmup_samples (HVD_AUTOTUNE_WARMUP_SAMPLES) is -1");
  o.autotune_warmup_samples = 3;
  o.autotune_steps_per_sample = 0;
  ExpectOptionsRefused(o, "autotune_steps_per_sample (HVD_AUTOTUNE_STEPS_PER_SAMPLE) is 0: "
                          "expected an integer in [1, 100000]");
  o.autotune_steps_per_sample = 10;
  o.fusion_threshold_bytes = size_t{1} << 41;
  ExpectOptionsRefused(
      o, "fusion_threshold_bytes (HVD_FUSION_THRESHOLD) is 2199023255552: expected at most");
  o.fusion_threshold_bytes = 0;
  EXPECT_TRUE(o.Validate().ok());
  o.rendezvous_port = 70000;
  ExpectOptionsRefused(o, "rendezvous_port");
}

}  // namespace
}  // namespace mp
