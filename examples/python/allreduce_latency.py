"""End-to-end latency of a tiny hvd.torch allreduce: Python call to result.

    hvdrun -np 2 /usr/bin/python3 examples/python/allreduce_latency.py

Times each call separately and prints the median and 90th percentile (µs) for: hvd.allreduce
(differentiable path, new output tensor), hvd.allreduce_ (in place), the same with a fixed
name (response-cache hits), and the bare extension call (hvd._core) underneath, which
separates the Python layer's cost from the engine's.
"""

import argparse
import time

import torch

import hvd.torch as hvd
from hvd import _core


def timed(fn, iters):
    samples = []
    for i in range(iters):
        start = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.9)] * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=3000)
    p.add_argument("--elements", type=int, default=1, help="float32 elements (1 = 4 bytes)")
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    x = torch.ones(args.elements)
    ptr = x.data_ptr()
    cases = [
        ("hvd.allreduce (unnamed)", lambda i: hvd.allreduce(x, op=hvd.Sum)),
        ("hvd.allreduce (named)", lambda i: hvd.allreduce(x, name="lat", op=hvd.Sum)),
        ("hvd.allreduce_ (named, in place)", lambda i: hvd.allreduce_(x, name="lat_", op=hvd.Max)),
        ("_core.allreduce + wait (named)",
         lambda i: _core.allreduce("allreduce.core", ptr, ptr, _core.FLOAT32, (args.elements,),
                                   _core.MAX, 1.0, 1.0, None, 0).wait()),  # 0: the global set
    ]
    for label, fn in cases:
        timed(fn, 200)  # warm up: connections, response cache
        hvd.barrier()
        med, p90 = timed(fn, args.iters)
        if hvd.rank() == 0:
            print("%-34s %d B on %d ranks: median %.1f us, p90 %.1f us"
                  % (label, 4 * args.elements, hvd.size(), med, p90), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
