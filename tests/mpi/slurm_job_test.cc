// A job under a simulated srun: the test starts the worker (mpi_worker) as N local processes
// with the SLURM_* variables srun would set and no hvdrun, and checks that they form one job
// (rank 0 hosting the rendezvous store) and that each reports the identity Slurm gave it.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <asio.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/slurm.h"

extern char** environ;

namespace {

constexpr int kJobSeconds = 60;

// The parent's environment without any launcher's variables.
std::map<std::string, std::string> CleanEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string k = kv.substr(0, eq);
    bool launcher = false;
    for (const char* p : {"HVD_", "HOROVOD_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "SLURMD_"}) {
      launcher |= k.rfind(p, 0) == 0;
    }
    if (!launcher) env[k] = kv.substr(eq + 1);
  }
  env["HVD_START_TIMEOUT"] = "30";
  env["HVD_TIMEOUT_SECONDS"] = "30";
  return env;
}

int FreePort() {
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

bool PortIsFree(int port) {
  asio::io_context io;
  asio::error_code ec;
  asio::ip::tcp::acceptor a(io);
  a.open(asio::ip::tcp::v4(), ec);
  if (!ec) a.bind(asio::ip::tcp::endpoint(asio::ip::address_v4::any(), static_cast<uint16_t>(port)), ec);
  return !ec;
}

struct Task {
  pid_t pid = -1;
  std::string log;
};

Task Start(const std::map<std::string, std::string>& vars, const std::string& log) {
  std::vector<std::string> kv;
  for (const auto& [k, v] : vars) kv.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : kv) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string worker = HVD_MPI_WORKER;
  std::string arg = "--expect-bootstrap=slurm";
  char* argv[] = {worker.data(), arg.data(), nullptr};
  Task t;
  t.log = log;
  t.pid = fork();
  if (t.pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execve(worker.c_str(), argv, envp.data());
    _exit(127);
  }
  return t;
}

// Waits for every task; kills them all when the job overruns. Returns the exit statuses.
std::vector<int> WaitAll(std::vector<Task>& tasks) {
  std::vector<int> codes(tasks.size(), -1);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kJobSeconds);
  size_t left = tasks.size();
  while (left > 0) {
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].pid < 0) continue;
      int st = 0;
      if (waitpid(tasks[i].pid, &st, WNOHANG) == tasks[i].pid) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        tasks[i].pid = -1;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (auto& t : tasks) {
        if (t.pid > 0) kill(t.pid, SIGKILL);
      }
      ADD_FAILURE() << "the job did not finish within " << kJobSeconds << " s";
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return codes;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A task's environment as srun leaves it (step `step` of job `job_id`).
std::map<std::string, std::string> TaskEnvironment(const std::string& job_id, const std::string& step,
                                                   int rank, int size, int local, int node,
                                                   int nodes, const std::string& nodelist,
                                                   const std::string& per_node_var, int port) {
  auto env = CleanEnvironment();
  env["SLURM_JOB_ID"] = job_id;
  env["SLURM_STEP_ID"] = step;
  env["SLURM_PROCID"] = std::to_string(rank);
  env["SLURM_STEP_NUM_TASKS"] = std::to_string(size);
  env["SLURM_NTASKS"] = std::to_string(size);
  env["SLURM_LOCALID"] = std::to_string(local);
  env["SLURM_NODEID"] = std::to_string(node);
  env["SLURM_STEP_NUM_NODES"] = std::to_string(nodes);
  env["SLURM_STEP_NODELIST"] = nodelist;
  env["SLURM_STEP_TASKS_PER_NODE"] = per_node_var;
  if (port) env["HVD_RENDEZVOUS_PORT"] = std::to_string(port);
  return env;
}

// Runs a step of `tasks_per_node` tasks on each of the named (local) nodes. `pmi`: srun's PMI
// variables too (srun --mpi=pmi2).
void RunStep(const std::vector<int>& tasks_per_node, const std::string& nodelist,
             const std::string& per_node_var, const std::string& job_id, int port,
             bool pmi = false) {
  int size = 0;
  for (int c : tasks_per_node) size += c;
  std::vector<Task> tasks;
  int rank = 0;
  for (size_t node = 0; node < tasks_per_node.size(); ++node) {
    for (int local = 0; local < tasks_per_node[node]; ++local, ++rank) {
      auto env = TaskEnvironment(job_id, "0", rank, size, local, static_cast<int>(node),
                                 static_cast<int>(tasks_per_node.size()), nodelist, per_node_var,
                                 port);
      if (pmi) {
        env["PMI_RANK"] = std::to_string(rank);
        env["PMI_SIZE"] = std::to_string(size);
        env["PMI_FD"] = "99";  // (pmi2's; never read)
      }
      std::string log = ::testing::TempDir() + "slurm_job_" + job_id + "_" + std::to_string(rank) + ".log";
      tasks.push_back(Start(env, log));
    }
  }
  std::vector<int> codes = WaitAll(tasks);
  rank = 0;
  for (size_t node = 0; node < tasks_per_node.size(); ++node) {
    for (int local = 0; local < tasks_per_node[node]; ++local, ++rank) {
      std::string out = Slurp(tasks[rank].log);
      EXPECT_EQ(codes[rank], 0) << "rank " << rank << " output:\n" << out;
      std::ostringstream want;
      want << "rank " << rank << " of " << size << " local " << local << "/" << tasks_per_node[node]
           << " cross " << node << "/" << tasks_per_node.size() << " bootstrap=slurm ops=tcp: all checks passed";
      EXPECT_NE(out.find(want.str()), std::string::npos) << "expected '" << want.str() << "' in:\n" << out;
    }
  }
}

TEST(SlurmJob, TwoTasksOneNode) {
  RunStep({2}, "localhost", "2", "7001", FreePort());
}

TEST(SlurmJob, FourTasksTwoNodes) {
  // Two "nodes" that are both this host: node 0 (rank 0's) must be reachable by name.
  RunStep({2, 2}, "localhost,127.0.0.1", "2(x2)", "7002", FreePort());
}

TEST(SlurmJob, UnevenNodesAndDerivedPort) {
  // No HVD_RENDEZVOUS_PORT: every task derives the same port from the job and step ids.
  std::string job;
  for (int j = 7100; j < 7200 && job.empty(); ++j) {
    if (PortIsFree(hvd::SlurmStorePort(std::to_string(j), "0"))) job = std::to_string(j);
  }
  ASSERT_FALSE(job.empty()) << "no free derived port";
  RunStep({2, 1}, "localhost,127.0.0.1", "2,1", job, 0);
}

TEST(SlurmJob, SrunsPmiVariablesStillMeanSlurm) {
  // srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE beside SLURM_*: the task is still Slurm's (it
  // was taken for mpirun's, and MPI_Init failed under a direct srun).
  RunStep({2, 1}, "localhost,127.0.0.1", "2,1", "7003", FreePort(), /*pmi=*/true);
}

TEST(SlurmJob, AnotherStepOnTheSamePortIsRefused) {
  // Two steps of one batch script (one HVD_SECRET) meet on one port: step 1's rank 0 cannot
  // listen, and its rank 1 reaches step 0's store. It must be refused at once, not join step 0
  // (whose rank 1 comes later and completes step 0's job).
  const int port = FreePort();
  auto task = [&](const std::string& step, int rank) {
    auto env = TaskEnvironment("7004", step, rank, 2, rank, 0, 1, "localhost", "2", port);
    env["HVD_SECRET"] = "one secret for the batch script";
    return Start(env, ::testing::TempDir() + "slurm_steps_" + step + "_" + std::to_string(rank) +
                          ".log");
  };
  std::vector<Task> first = {task("0", 0)};
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto start = std::chrono::steady_clock::now();
  std::vector<Task> intruder = {task("1", 1)};
  std::vector<int> codes = WaitAll(intruder);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string said = Slurp(intruder[0].log);
  EXPECT_NE(codes[0], 0) << said;
  EXPECT_LT(took, 15.0) << said;
  EXPECT_NE(said.find("another step's on that port"), std::string::npos) << said;
  first.push_back(task("0", 1));
  codes = WaitAll(first);
  for (size_t r = 0; r < first.size(); ++r) {
    const std::string out = Slurp(first[r].log);
    EXPECT_EQ(codes[r], 0) << out;
    EXPECT_NE(out.find("rank " + std::to_string(r) + " of 2 "), std::string::npos) << out;
  }
}

TEST(SlurmJob, RankZeroOffTheFirstNodeSaysSoAtOnce) {
  // -m arbitrary can put rank 0 on another node than the step's first, where the others look
  // for its store.
  auto env = TaskEnvironment("7005", "0", 0, 2, 0, 1, 2, "localhost,127.0.0.1", "1(x2)", FreePort());
  env["SLURMD_NODENAME"] = "127.0.0.1";
  std::vector<Task> tasks = {Start(env, ::testing::TempDir() + "slurm_arbitrary_0.log")};
  std::vector<int> codes = WaitAll(tasks);
  const std::string said = Slurp(tasks[0].log);
  EXPECT_NE(codes[0], 0) << said;
  EXPECT_NE(said.find("HVD_RENDEZVOUS_ADDR=127.0.0.1"), std::string::npos) << said;
}

}  // namespace
