// The check groups of mp_collectives_worker. Each runs the same sequence of operations on every
// rank (whatever the outcome of a check, so that a failure never desynchronises the ranks) and
// returns its number of failed checks.
#pragma once

#include "hvd/engine.h"
#include "mp_common.h"

namespace mp {

int RunAllreduceChecks(hvd::Engine& e, Checker& ck);     // mp_allreduce.cc
int RunMovementChecks(hvd::Engine& e, Checker& ck);      // mp_movement.cc
int RunReducescatterChecks(hvd::Engine& e, Checker& ck); // mp_movement.cc
int RunBarrierAndJoinChecks(hvd::Engine& e, Checker& ck);  // mp_control.cc
int RunThreadChecks(hvd::Engine& e, Checker& ck);        // mp_control.cc
// The engine's work run by a waiting caller, under a long spin window.
int RunCallerProgressChecks(hvd::Engine& e, Checker& ck);  // mp_control.cc
// Two training steps on the fast path, alternating (one of `tensors` small tensors, one of a
// large one): values, each step one collective with its responses kept; a tensor held while
// some rank has not announced another (mp_control.cc).
int RunStepChecks(hvd::Engine& e, Checker& ck, int tensors);
// A step enqueued in batches by the last rank: its parts per collective (mp_control.cc).
int RunBatchedStepChecks(hvd::Engine& e, Checker& ck);
// The CPU a rank uses idle and through the waits of HVD_CYCLE_TIME (mp_control.cc).
int RunWaitingCpuChecks(hvd::Engine& e, Checker& ck);
int RunMismatchChecks(hvd::Engine& e, Checker& ck);      // mp_errors.cc
// Under HVD_DYNAMIC_PROCESS_SETS=1: sets added, used at once, and removed (mp_process_sets.cc).
int RunProcessSetChecks(hvd::Engine& e, Checker& ck);
// With Options::process_sets = {{0, size - 1}} and no dynamic sets.
int RunStaticProcessSetChecks(hvd::Engine& e, Checker& ck);
// STEPS steps of random operations of every kind, on the world and (with
// HVD_DYNAMIC_PROCESS_SETS=1, from 3 ranks) three process sets, each rank submitting them in an
// order and with pauses of its own; every value checked (mp_random.cc).
int RunRandomSteps(hvd::Engine& e, Checker& ck, int64_t steps, uint64_t seed);
// Shuts the engine down and checks that later operations fail.
int RunShutdownChecks(hvd::Engine& e, Checker& ck);      // mp_errors.cc

}  // namespace mp
