"""Synthetic data-parallel throughput: hvd.torch.DistributedOptimizer vs PyTorch DDP (gloo).

The model has many parameter tensors (an MLP of --layers Linear layers, two tensors each), the
data is random, and every backend runs the same model, batch and iteration counts.

    hvdrun -np 2 /usr/bin/python3 examples/python/synthetic_benchmark.py --backend hvd
    hvdrun -np 2 /usr/bin/python3 examples/python/synthetic_benchmark.py --backend ddp
    hvdrun -np 2 /usr/bin/python3 examples/python/synthetic_benchmark.py --backend both
    /usr/bin/python3 examples/python/synthetic_benchmark.py --backend ddp --np 2   # no hvdrun

Under hvdrun, DDP takes its rank and size from HVD_RANK / HVD_SIZE and rendezvous through a
file named after the job's rendezvous port; without hvdrun, --np N starts N processes with
torch.multiprocessing. `both` runs hvd then DDP in the same processes and prints the ratio of
their step times. It also times the same step with no communication at all (`local`: each rank
trains its own copy), in the same alternating rounds, and prints what each backend adds to that
compute floor and the ratio of those overheads: on a machine where the step is mostly compute,
the step-time ratio cannot go below local/ddp however fast the communication is. Rank 0 prints
samples/s per rank and in total.
"""

import argparse
import os
import socket
import tempfile
import time

import torch
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["hvd", "ddp", "both"], default="hvd")
    p.add_argument("--layers", type=int, default=50)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=10, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--np", type=int, default=0, help="without hvdrun: DDP processes to start")
    return p.parse_args()


def make_model(args):
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers - 1):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(args.width, 10))
    return torch.nn.Sequential(*layers)


class Runner:
    """One backend's model, optimizer and fixed batch; step() is one training step."""

    def __init__(self, label, model, optimizer, rank, size, args):
        self.label, self.model, self.optimizer = label, model, optimizer
        self.rank, self.size, self.args = rank, size, args
        gen = torch.Generator().manual_seed(1 + rank)
        self.x = torch.randn(args.batch_size, args.width, generator=gen)
        self.y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        self.times = []

    def step(self):
        self.optimizer.zero_grad()
        F.cross_entropy(self.model(self.x), self.y).backward()
        self.optimizer.step()

    def warm_up(self):
        for _ in range(self.args.warmup):
            self.step()

    def timed_round(self):
        start = time.perf_counter()
        for _ in range(self.args.iters):
            self.step()
        self.times.append((time.perf_counter() - start) / self.args.iters)

    def report(self):
        """Prints (rank 0) and returns the median step time over the rounds, in seconds."""
        t = sorted(self.times)[len(self.times) // 2]
        if self.rank == 0:
            a = self.args
            params = sum(p.numel() for p in self.model.parameters())
            tensors = len(list(self.model.parameters()))
            print("%-4s ranks=%d model: %d tensors, %.1f M params; batch %d/rank; step %.2f ms "
                  "(median of %d rounds x %d); %.1f samples/s per rank, %.1f total"
                  % (self.label, self.size, tensors, params / 1e6, a.batch_size, t * 1e3,
                     len(self.times), a.iters, a.batch_size / t, a.batch_size * self.size / t),
                  flush=True)
        return t


def make_hvd_runner(args):
    import hvd.torch as hvd

    hvd.init()
    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    return Runner("hvd", model, optimizer, hvd.rank(), hvd.size(), args)


def make_ddp_runner(args, rank, size, init_method):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=size)
    model = DistributedDataParallel(make_model(args))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return Runner("ddp", model, optimizer, rank, size, args)


def make_local_runner(args, rank, size):
    """The same model and step with no communication: the compute floor of a step."""
    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return Runner("local", model, optimizer, rank, size, args)


def run(runners):
    """Warms every runner up, then alternates their timed rounds (the order flips each
    round) so that both backends see the same machine; returns the median step times."""
    for r in runners:
        r.warm_up()
    for i in range(runners[0].args.rounds):
        for r in (runners if i % 2 == 0 else runners[::-1]):
            r.timed_round()
    return [r.report() for r in runners]


def hvdrun_ddp_init():
    """file:// rendezvous unique to this hvdrun job."""
    job = "%s_%s" % (os.environ.get("HVD_RENDEZVOUS_ADDR", "local"),
                     os.environ.get("HVD_RENDEZVOUS_PORT", "0"))
    path = os.path.join(tempfile.gettempdir(), "hvd_bench_ddp_%s" % job.replace(".", "_"))
    return "file://" + path, path


def spawned_ddp(rank, args, size, port):
    torch.set_num_threads(args.threads)
    run([make_ddp_runner(args, rank, size, "tcp://127.0.0.1:%d" % port)])
    import torch.distributed as dist

    dist.destroy_process_group()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    under_hvdrun = "HVD_RANK" in os.environ or "HOROVOD_RANK" in os.environ
    if args.backend == "ddp" and not under_hvdrun:
        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(spawned_ddp, args=(args, max(1, args.np), port), nprocs=max(1, args.np))
        return

    runners = []
    if args.backend in ("hvd", "both"):
        import hvd.torch as hvd

        runners.append(make_hvd_runner(args))
    path = None
    if args.backend in ("ddp", "both"):
        rank = int(os.environ.get("HVD_RANK", os.environ.get("HOROVOD_RANK", "0")))
        size = int(os.environ.get("HVD_SIZE", os.environ.get("HOROVOD_SIZE", "1")))
        init_method, path = hvdrun_ddp_init()
        if runners:
            if rank == 0 and os.path.exists(path):
                os.remove(path)  # a stale file from an earlier job on the same port
            hvd.barrier()        # ... is gone before anyone opens it
        runners.append(make_ddp_runner(args, rank, size, init_method))
    if args.backend == "both":
        runners.append(make_local_runner(args, rank, size))
    times = run(runners)
    if len(times) == 3 and runners[0].rank == 0:
        hvd_t, ddp_t, local_t = times
        print("step time hvd/ddp = %.3f (local/ddp = %.3f: the least it can be)"
              % (hvd_t / ddp_t, local_t / ddp_t), flush=True)
        if ddp_t > local_t:
            print("over the compute alone: hvd +%.2f ms, ddp +%.2f ms; overhead hvd/ddp = %.3f"
                  % ((hvd_t - local_t) * 1e3, (ddp_t - local_t) * 1e3,
                     (hvd_t - local_t) / (ddp_t - local_t)), flush=True)
    if args.backend in ("ddp", "both"):
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if args.backend in ("hvd", "both"):
        hvd.shutdown()


if __name__ == "__main__":
    main()
