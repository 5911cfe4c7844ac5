"""An elastic training job for the elastic tests (tests/python/CMakeLists.txt), written as a
Horovod Elastic script: hvd.elastic.run, TorchState, ElasticSampler, commit every few batches.

The test hooks (all off by default):
  --die-worker N --die-at-step S   the worker started as number N kills itself (SIGKILL) at
                                   global step S of its first world
  --die-on-host H --die-after K    every worker on host H kills itself after K steps in a world
  --stop-worker N --stop-at-step S the worker started as number N stops itself (SIGSTOP) at
                                   global step S of its first world
  --add-host LINE --add-at-step S  rank 0 appends LINE to the file in $HOSTS_FILE at step S
  --set-hosts LINES --set-at-step S  rank 0 writes LINES (',' between lines) over that file at
                                   step S
  --save-at-reset FILE             rank 0 saves the state every rank synced to after the first
                                   reset (the commit the survivors go on from)
  --resume FILE                    start from such a file instead of from scratch
  --out FILE                       rank 0 writes the final parameters and the run's record
  --min-resets R --max-epochs E    train past --epochs (up to E) until the job has reset R
                                   times, so that a test of repeated failures does not depend on
                                   how fast the machine is

Every global batch's sample indices are counted in the committed state, so the record shows
each sample's number of updates: a lost sample has fewer than --epochs, a repeated one more.
"""

import argparse
import json
import os
import signal
import time

import numpy as np
import torch

import hvd.torch as hvd


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--min-resets", type=int, default=0)
    p.add_argument("--max-epochs", type=int, default=0)
    p.add_argument("--samples", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batches-per-commit", type=int, default=2)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--die-worker", type=int, default=-1)
    p.add_argument("--die-at-step", type=int, default=-1)
    p.add_argument("--stop-worker", type=int, default=-1)
    p.add_argument("--stop-at-step", type=int, default=-1)
    p.add_argument("--die-on-host", default="")
    p.add_argument("--die-after", type=int, default=-1)
    p.add_argument("--add-host", default="")
    p.add_argument("--add-at-step", type=int, default=-1)
    p.add_argument("--set-hosts", default="")
    p.add_argument("--set-at-step", type=int, default=-1)
    p.add_argument("--save-at-reset", default="")
    p.add_argument("--resume", default="")
    p.add_argument("--out", default="")
    return p.parse_args()


def dataset(n):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g, dtype=torch.float64)
    w = torch.randn(16, 1, generator=g, dtype=torch.float64)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return torch.utils.data.TensorDataset(x, y)


def main():
    args = parse()
    hvd.init()
    torch.manual_seed(0)
    data = dataset(args.samples)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    worker = os.environ.get("HVD_ELASTIC_ID", "")
    number = int(worker.rsplit("#", 1)[1]) if "#" in worker else -1
    host = os.environ.get("HVD_HOSTNAME", "")
    state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=0, step=0,
                                   counts=[0] * args.samples, sizes=[])
    if args.resume:
        saved = torch.load(args.resume)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        sampler.load_state_dict(saved["sampler"])
        state.epoch, state.step = saved["epoch"], saved["step"]
        state.counts, state.sizes = saved["counts"], saved["sizes"]
        state.save()
    # ran: the steps this process ran, those a rollback undid included.
    world = {"resets": 0, "steps_here": 0, "saved": False, "reset_at": None, "ran": 0}

    def on_reset():
        world["resets"] += 1
        world["steps_here"] = 0
        world["reset_at"] = time.time()

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        if world["resets"] == 1 and args.save_at_reset and not world["saved"]:
            world["saved"] = True
            if hvd.rank() == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "sampler": sampler.state_dict(), "epoch": state.epoch,
                            "step": state.step, "counts": list(state.counts),
                            "sizes": list(state.sizes)}, args.save_at_reset)
        def more():
            if state.epoch < args.epochs:
                return True
            if state.epoch >= args.max_epochs:
                return False
            # Rank 0's count of resets (a survivor's), so that every rank decides alike.
            return hvd.broadcast_object(world["resets"], root_rank=0) < args.min_resets

        while more():
            for idx, (x, y) in enumerate(loader):
                if number == args.die_worker and world["resets"] == 0 and \
                        state.step == args.die_at_step:
                    print("ELASTIC-DIE worker %d at step %d t=%.6f" % (number, state.step,
                                                                       time.time()), flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                if number == args.stop_worker and world["resets"] == 0 and \
                        state.step == args.stop_at_step:
                    print("ELASTIC-STOP worker %d at step %d" % (number, state.step), flush=True)
                    os.kill(os.getpid(), signal.SIGSTOP)
                if host == args.die_on_host and world["steps_here"] == args.die_after:
                    print("ELASTIC-DIE worker %d on %s" % (number, host), flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                if hvd.rank() == 0 and state.step == args.add_at_step and args.add_host:
                    with open(os.environ["HOSTS_FILE"], "a") as f:
                        f.write(args.add_host + "\n")
                if hvd.rank() == 0 and state.step == args.set_at_step and args.set_hosts:
                    with open(os.environ["HOSTS_FILE"] + ".new", "w") as f:
                        f.write(args.set_hosts.replace(",", "\n") + "\n")
                    os.replace(os.environ["HOSTS_FILE"] + ".new", os.environ["HOSTS_FILE"])
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                for i in sampler._padded[idx * args.batch_size * sampler.num_replicas:
                                         (idx + 1) * args.batch_size * sampler.num_replicas]:
                    state.counts[i] += 1
                sampler.record_batch(idx, args.batch_size)
                state.step += 1
                world["steps_here"] += 1
                world["ran"] += 1
                if world["steps_here"] == 1 and world["reset_at"] is not None and hvd.rank() == 0:
                    print("ELASTIC-FIRST-STEP size %d t=%.6f" % (hvd.size(), time.time()),
                          flush=True)
                if not state.sizes or state.sizes[-1] != hvd.size():
                    state.sizes.append(hvd.size())
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if state.step % args.batches_per_commit == 0:
                    state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    counts = np.array(state.counts)
    params = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    if hvd.rank() == 0:
        epochs = state.epoch  # --epochs, or more with --min-resets
        lost = int(np.sum(np.maximum(epochs - counts, 0)))
        repeated = int(np.sum(np.maximum(counts - epochs, 0)))
        print("ELASTIC-DONE size %d steps %d sizes %s lost %d repeated %d resets %d ran %d" % (
            hvd.size(), state.step, state.sizes, lost, repeated, world["resets"], world["ran"]),
            flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"params": params.tolist(), "lost": lost, "repeated": repeated,
                           "sizes": state.sizes, "steps": state.step}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
