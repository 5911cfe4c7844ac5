// Slurm's environment contract (bootstrap/slurm.h): node lists, tasks per node, a task's
// identity from SLURM_* variables.
#include "bootstrap/slurm.h"

#include <gtest/gtest.h>

#include <map>

namespace hvd {
namespace {

using Strings = std::vector<std::string>;

Strings Expand(const std::string& list) {
  auto r = ExpandSlurmNodeList(list);
  EXPECT_TRUE(r.ok()) << list << ": " << r.status().ToString();
  return r.ok() ? *r : Strings{};
}

TEST(SlurmNodeList, PlainNames) {
  EXPECT_EQ(Expand("login3"), Strings({"login3"}));
  EXPECT_EQ(Expand("a,b.example.org,c-1"), Strings({"a", "b.example.org", "c-1"}));
}

TEST(SlurmNodeList, RangesKeepPadding) {
  EXPECT_EQ(Expand("node[01-03,07]"), Strings({"node01", "node02", "node03", "node07"}));
  EXPECT_EQ(Expand("n[8-11]"), Strings({"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(Expand("n[098-101]"), Strings({"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(Expand("n[5]"), Strings({"n5"}));
}

TEST(SlurmNodeList, SeveralGroups) {
  EXPECT_EQ(Expand("node[01-03,07],gpu-a[1-2]"),
            Strings({"node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"}));
  EXPECT_EQ(Expand("login,n[1-2],x"), Strings({"login", "n1", "n2", "x"}));
  EXPECT_EQ(Expand("r[1-2]n[1-2]"), Strings({"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(Expand("rack[1-2]-s"), Strings({"rack1-s", "rack2-s"}));
}

TEST(SlurmNodeList, Malformed) {
  for (const char* bad : {"", "node[1-3", "node1-3]", "n[3-1]", "n[a-b]", "n[1-]", "n[]",
                          "a,,b", ",a", "n[1-2,]", "n[0-99999999]"}) {
    auto r = ExpandSlurmNodeList(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "' was accepted";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find("Slurm node list"), std::string::npos);
    }
  }
}

TEST(SlurmTasksPerNode, Expands) {
  auto r = ExpandSlurmTasksPerNode("2(x3),1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, std::vector<int>({2, 2, 2, 1}));
  r = ExpandSlurmTasksPerNode("4");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::vector<int>({4}));
  r = ExpandSlurmTasksPerNode("1,3(x2),2");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::vector<int>({1, 3, 3, 2}));
  for (const char* bad : {"", "2(x0)", "2(3)", "x", "2(x3", "2,,1", "-1"}) {
    EXPECT_FALSE(ExpandSlurmTasksPerNode(bad).ok()) << bad;
  }
}

class FakeEnv {
 public:
  explicit FakeEnv(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  EnvGetter getter() const {
    return [this](const char* n) -> const char* {
      auto it = vars_.find(n);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

// Task 4 of 7 on the third of 4 nodes: tasks per node 2,2,2,1.
std::map<std::string, std::string> SrunTask() {
  return {{"SLURM_PROCID", "4"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_ID", "81234"},
          {"SLURM_STEP_NUM_TASKS", "7"},
          {"SLURM_NTASKS", "16"},  // the job's; the step's count wins
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "2"},
          {"SLURM_STEP_NODELIST", "node[01-03],gpu7"},
          {"SLURM_JOB_NODELIST", "node[01-09]"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}};
}

TEST(SlurmTask, Identity) {
  FakeEnv env(SrunTask());
  auto t = ReadSlurmTask(env.getter());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(t->has_value());
  const SlurmTask& s = **t;
  EXPECT_EQ(s.rank, 4);
  EXPECT_EQ(s.size, 7);
  EXPECT_EQ(s.local_rank, 0);
  EXPECT_EQ(s.local_size, 2);
  EXPECT_EQ(s.node_id, 2);
  EXPECT_EQ(s.num_nodes, 4);
  EXPECT_EQ(s.nodes, Strings({"node01", "node02", "node03", "gpu7"}));
  EXPECT_EQ(s.job_id, "81234");
  EXPECT_EQ(s.step_id, "0");
}

TEST(SlurmTask, LastNodeHasOneTask) {
  auto vars = SrunTask();
  vars["SLURM_PROCID"] = "6";
  vars["SLURM_NODEID"] = "3";
  FakeEnv env(vars);
  auto t = ReadSlurmTask(env.getter());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->local_size, 1);
}

TEST(SlurmTask, JobLevelFallbacks) {
  FakeEnv env({{"SLURM_PROCID", "1"}, {"SLURM_STEPID", "3"}, {"SLURM_NTASKS", "4"},
               {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "0"}, {"SLURM_JOB_NODELIST", "a[1-2]"},
               {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  auto t = ReadSlurmTask(env.getter());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->size, 4);
  EXPECT_EQ((*t)->local_size, 2);
  EXPECT_EQ((*t)->num_nodes, 2);
  EXPECT_EQ((*t)->nodes[0], "a1");
}

TEST(SlurmTask, BatchScriptIsNotATask) {
  // sbatch's own shell: a rank and a task count, but no step.
  FakeEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "5"}});
  auto t = ReadSlurmTask(env.getter());
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->has_value());
  FakeEnv none({});
  EXPECT_FALSE(ReadSlurmTask(none.getter())->has_value());
}

TEST(SlurmTask, InconsistentVariablesNameTheVariable) {
  struct Case {
    const char* var;
    const char* value;
    const char* mentions;
  };
  for (const Case& c : {Case{"SLURM_PROCID", "7", "SLURM_PROCID"},
                        Case{"SLURM_PROCID", "x", "SLURM_PROCID"},
                        Case{"SLURM_NODEID", "4", "SLURM_NODEID"},
                        Case{"SLURM_LOCALID", "2", "SLURM_LOCALID"},
                        Case{"SLURM_STEP_TASKS_PER_NODE", "2(x3)", "SLURM_STEP_TASKS_PER_NODE"},
                        Case{"SLURM_STEP_NODELIST", "node[1-", "SLURM_STEP_NODELIST"}}) {
    auto vars = SrunTask();
    vars[c.var] = c.value;
    FakeEnv env(vars);
    auto t = ReadSlurmTask(env.getter());
    ASSERT_FALSE(t.ok()) << c.var << "=" << c.value << " was accepted";
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.mentions), std::string::npos) << t.status().ToString();
  }
  auto vars = SrunTask();
  vars.erase("SLURM_STEP_NUM_TASKS");
  vars.erase("SLURM_NTASKS");
  FakeEnv env(vars);
  EXPECT_FALSE(ReadSlurmTask(env.getter()).ok());
}

TEST(SlurmStorePort, StableAndInRange) {
  EXPECT_EQ(SlurmStorePort("81234", "0"), SlurmStorePort("81234", "0"));
  EXPECT_NE(SlurmStorePort("81234", "0"), SlurmStorePort("81234", "1"));
  for (int j = 0; j < 1000; ++j) {
    int p = SlurmStorePort(std::to_string(j), "0");
    EXPECT_GE(p, 20000);
    EXPECT_LT(p, 30000);
  }
}

}  // namespace
}  // namespace hvd
