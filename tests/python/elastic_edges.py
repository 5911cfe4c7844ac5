"""Elastic jobs at the edges of a world change (elastic_test.sh runs them), each a count of
committed steps in an hvd.elastic.TorchState:

  --mode state-lost  the hosts' file gains a host at step 10 (rank 0 of the first host appends
                     it), then that first host's rank 0 fails while hvdrun's grown world has
                     not formed: the only workers holding the commit are gone, and the new
                     ones must not train from the initial state
  --mode late-host   training ends at step 5; then rank 0 appends a host and the ranks take a
                     while to exit: the workers hvdrun starts for the grown world never join
                     one, and the finished job must still end with 0

Every committed step prints "EDGE-STEP host H rank R size N step S".
"""

import argparse
import os
import time

import torch

import hvd.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--mode", required=True, choices=["state-lost", "late-host"])
p.add_argument("--add-host", required=True)
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


@hvd.elastic.run
def train(state):
    last = 20 if args.mode == "state-lost" else 5
    while state.step < last:
        hvd.allreduce(torch.ones(1), name="edge")
        state.step += 1
        state.commit()
        print("EDGE-STEP host %s rank %d size %d step %d" % (host, hvd.rank(), hvd.size(),
                                                              state.step), flush=True)
        if args.mode == "state-lost" and state.step == 10 and hvd.rank() == 0:
            add_host()  # hvdrun publishes the grown world and starts its new workers
            raise RuntimeError("the first host fails before the grown world formed")
        time.sleep(0.05)


train(state)
if args.mode == "late-host":
    if hvd.rank() == 0:
        add_host()  # e.g. while writing a checkpoint: hvdrun sees the host meanwhile
print("EDGE-DONE rank %d step %d" % (hvd.rank(), state.step), flush=True)
