// hvdrun --mpi: runs the job through Open MPI's mpirun instead of starting the ranks itself.
//
// The ranks then take their identity from OMPI_COMM_WORLD_* and bootstrap their TCP mesh
// through MPI (no rendezvous store; rank 0 draws the job's secret and broadcasts it over MPI, so
// no secret appears on any command line). The flags map as:
//   -np N                    -np N
//   -H / --hostfile          -H host:slots,... (placement order kept; default localhost:N)
//   knob flags (HVD_*)       -x HVD_NAME=value for each
//   HVD_* / HOROVOD_* set    -x NAME (forwarded from hvdrun's own environment)
//   -p / -i / --ssh-config   --mca plm_rsh_args "-p PORT -i FILE -F FILE"
//   --network-interface IF   --mca btl_tcp_if_include IF --mca oob_tcp_if_include IF, and
//                            -x HVD_BIND_ADDR is left to the ranks (they pick a routable one)
//   rank-prefixed output     --tag-output (unless --no-prefix)
//   running as root          --allow-run-as-root
// mpirun comes from $HVD_MPIRUN, else "mpirun" on the PATH; mpirun supervises the ranks (it
// stops them all when one fails) and its exit status becomes hvdrun's.
//
// Thread-safety: pure functions, except ExecMpirun, which replaces the process.
#pragma once

#include <string>
#include <vector>

#include "args.h"

namespace hvd {
namespace launcher {

// The mpirun command line for `opts`; `environ_names` are the variables set in hvdrun's
// environment (only HVD_* and HOROVOD_* ones are forwarded), `as_root` adds
// --allow-run-as-root.
std::vector<std::string> MpirunCommand(const LaunchOptions& opts,
                                       const std::vector<std::string>& environ_names,
                                       bool as_root);

// Execs mpirun with MpirunCommand; returns only on failure (127 after printing why).
int ExecMpirun(const LaunchOptions& opts);

}  // namespace launcher
}  // namespace hvd
