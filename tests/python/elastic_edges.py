"""Elastic jobs at the edges of a world change (elastic_test.sh runs them), each a count of
committed steps in an hvd.elastic.TorchState:

  --mode state-lost  the hosts' file gains a host at step 10 (rank 0 of the first host appends
                     it), then that first host's rank 0 fails while hvdrun's grown world has
                     not formed: the only workers holding the commit are gone, and the new
                     ones must not train from the initial state
  --mode sync-lost   one worker adds a host at step 5 and goes on; the grown world forms, and
                     the first worker dies in its reset callback, before its broadcast of the
                     state reached the new one: the new worker, which joined a world that
                     formed but never took the state, must not train from the initial state
  --mode late-host   training ends at step 5; then rank 0 appends a host and the ranks take a
                     while to exit: the workers hvdrun starts for the grown world never join
                     one, and the finished job must still end with 0
  --mode internal-error  every rank raises HorovodInternalError at step 5 of its first attempt
                     (as Horovod's elastic tests simulate a failure): no peer is lost and no
                     process dies, yet hvd.elastic.run must go on in a new world of the same
                     workers, from the commit, to step 10
  --mode early-finish  rank 1 ends its loop at step 5, rank 0 goes on to 20: rank 1 exits 0,
                     rank 0's next allreduce fails and it leaves its world, and no world comes
                     after a worker finished, which rank 0 must hear at once (it waited for
                     --elastic-timeout before, and then blamed too few workers)

Every committed step prints "EDGE-STEP host H rank R size N step S".
"""

import argparse
import os
import time

import torch

import hvd.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--mode", required=True, choices=["state-lost", "sync-lost", "late-host",
                                                     "internal-error", "early-finish"])
p.add_argument("--add-host")
args = p.parse_args()

hvd.init()
state = hvd.elastic.TorchState(step=0)
host = os.environ["HOROVOD_HOSTNAME"]


def add_host():
    """Appends the host to the discovery script's file and waits until the script has printed
    it (SEEN_FILE), then 2 s more: hvdrun publishes its grown world and starts its new
    workers right after it reads the script's output."""
    with open(os.environ["HOSTS_FILE"], "a") as f:
        f.write(args.add_host + "\n")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(os.environ["SEEN_FILE"]) as f:
                if args.add_host in f.read().split():
                    break
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    time.sleep(2)


attempts = []


def die_before_the_broadcast():
    # The first worker, reset into the grown world (a new worker's first attempt has no reset).
    if args.mode == "sync-lost" and attempts and hvd.size() > 1:
        print("EDGE-HOLDER-DIES step %d" % state.step, flush=True)
        os._exit(1)


state.register_reset_callbacks([die_before_the_broadcast])


@hvd.elastic.run
def train(state):
    attempts.append(hvd.size())
    last = {"state-lost": 20, "sync-lost": 200, "late-host": 5, "internal-error": 10,
            "early-finish": 5 if hvd.rank() == 1 else 20}[args.mode]
    while state.step < last:
        if args.mode == "internal-error" and state.step == 5 and len(attempts) == 1:
            raise hvd.HorovodInternalError("a failure the script simulates")
        hvd.allreduce(torch.ones(1), name="edge")
        state.step += 1
        state.commit()
        print("EDGE-STEP host %s rank %d size %d step %d" % (host, hvd.rank(), hvd.size(),
                                                              state.step), flush=True)
        if args.mode == "state-lost" and state.step == 10 and hvd.rank() == 0:
            add_host()  # hvdrun publishes the grown world and starts its new workers
            raise RuntimeError("the first host fails before the grown world formed")
        if args.mode == "sync-lost" and state.step == 5 and hvd.size() == 1:
            add_host()  # the next commit raises HostsUpdatedInterrupt
        time.sleep(0.05)


train(state)
if args.mode == "late-host":
    if hvd.rank() == 0:
        add_host()  # e.g. while writing a checkpoint: hvdrun sees the host meanwhile
print("EDGE-DONE rank %d step %d attempts %d" % (hvd.rank(), state.step, len(attempts)),
      flush=True)
