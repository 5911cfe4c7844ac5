// Slurm's environment contract, as srun leaves it for each task: who the task is in the step,
// how many tasks run on each node, and which nodes the step has.
//
// A process is a Slurm task when srun started it: SLURM_PROCID and SLURM_STEP_ID (or the older
// SLURM_STEPID) are set. A batch script itself also has SLURM_PROCID=0 and SLURM_NTASKS, but
// no step id; it is not a task of a multi-rank job (it is a world of one until srun runs it).
//
// Variables read (the step's value first, the job's as the fallback):
//   rank        SLURM_PROCID
//   size        SLURM_STEP_NUM_TASKS, SLURM_NTASKS, SLURM_NPROCS
//   local rank  SLURM_LOCALID
//   node        SLURM_NODEID (index into the node list)
//   per node    SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE
//               ("2(x3),1" = 2,2,2,1; a plain "4" means 4 on every node)
//   nodes       SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST
//               ("node[01-03,07],gpu-a[1-2]")
//   job, step   SLURM_JOB_ID (SLURM_JOBID), SLURM_STEP_ID (SLURM_STEPID)
//
// Thread-safety: pure functions.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hvd/status.h"

namespace hvd {

// Expands a Slurm host list into host names, in order:
//   "node[01-03,07],gpu-a[1-2]" -> node01 node02 node03 node07 gpu-a1 gpu-a2.
// Ranges keep the zero padding of their lower bound; several bracket groups in one name
// ("r[1-2]n[1-2]") expand to their product, the last group varying fastest.
// Fails with InvalidArgument naming the list and what is wrong.
StatusOr<std::vector<std::string>> ExpandSlurmNodeList(const std::string& list);

// Expands a tasks-per-node list: "2(x3),1" -> 2 2 2 1.
StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(const std::string& list);

struct SlurmTask {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_id = 0;
  int num_nodes = 1;
  std::vector<std::string> nodes;  // the step's nodes; may be empty if no list was set
  std::string job_id;              // may be empty
  std::string step_id;
};

// Reads the task's identity through `get` (std::getenv in production; a map in tests).
// Returns nullopt when the process is not a Slurm task (see above), InvalidArgument when a
// variable is malformed or the variables disagree (the message names the variable).
using EnvGetter = std::function<const char*(const char*)>;
StatusOr<std::optional<SlurmTask>> ReadSlurmTask(const EnvGetter& get);

// The port rank 0 hosts the rendezvous store on when HVD_RENDEZVOUS_PORT is not set: derived
// from the job and step ids, in [20000, 30000), so that every task of a step computes the same
// one and concurrent steps on one node rarely collide.
int SlurmStorePort(const std::string& job_id, const std::string& step_id);

}  // namespace hvd
