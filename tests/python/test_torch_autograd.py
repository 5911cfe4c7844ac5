"""Gradients through hvd.torch's differentiable collectives, against formulas.

Each rank's loss is sum(y * w_r) with a rank-dependent weight w_r, so dloss/dy = w_r; the
expected input gradients follow from horovod.torch's backward rules (see hvd/torch/mpi_ops.py).
"""

import torch

import hvd.torch as hvd
from conftest import world


def weights(shape, q):
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape) + 10 * q


def test_allreduce_gradient_sum_and_average():
    r, n = world()
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        x = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
        y = hvd.allreduce(x, op=op)
        (y * weights((2, 3), r)).sum().backward()
        want = sum(weights((2, 3), q) for q in range(n)) * scale
        assert torch.allclose(x.grad, want)


def test_allreduce_gradient_with_scale_factors():
    r, n = world()
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    (y * weights((4,), r)).sum().backward()
    assert torch.allclose(x.grad, sum(weights((4,), q) for q in range(n)) * 0.5)


def test_grouped_allreduce_gradient():
    r, n = world()
    xs = [torch.ones(3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    ((ys[0] * weights((3,), r)).sum() + (ys[1] * 2).sum()).backward()
    assert torch.allclose(xs[0].grad, sum(weights((3,), q) for q in range(n)))
    assert torch.allclose(xs[1].grad, torch.full((3,), 2.0 * n, dtype=torch.float64))


def test_grouped_reducescatter_gradient():
    r, n = world()
    xs = [torch.ones(2 * n, dtype=torch.float64, requires_grad=True),
          torch.ones(n, 3, dtype=torch.float64, requires_grad=True)]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Average)
    assert ys[0].shape == (2,) and ys[1].shape == (1, 3)
    ((ys[0] * (r + 1)).sum() + (ys[1] * weights((1, 3), r)).sum()).backward()
    # Each member's gradient is the allgather of the output gradients, divided by size.
    g0 = torch.cat([torch.full((2,), float(q + 1), dtype=torch.float64) for q in range(n)]) / n
    g1 = torch.cat([weights((1, 3), q) for q in range(n)]) / n
    assert torch.allclose(xs[0].grad, g0)
    assert torch.allclose(xs[1].grad, g1)


def test_allgather_gradient():
    r, n = world()
    x = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)
    y = hvd.allgather(x)
    rows = n * (n + 1) // 2
    (y * weights((rows, 2), r)).sum().backward()
    avg = sum(weights((rows, 2), q) for q in range(n)) / n
    start = r * (r + 1) // 2
    assert torch.allclose(x.grad, avg[start:start + r + 1])


def test_broadcast_gradient():
    r, n = world()
    for root in range(n):
        x = torch.ones(5, dtype=torch.float64, requires_grad=True)
        y = hvd.broadcast(x, root_rank=root)
        (y * weights((5,), r)).sum().backward()
        avg = sum(weights((5,), q) for q in range(n)) / n
        assert torch.allclose(x.grad, avg if r == root else torch.zeros(5, dtype=torch.float64))


def test_alltoall_gradient():
    r, n = world()
    x = torch.ones(2 * n, 3, dtype=torch.float64, requires_grad=True)
    y = hvd.alltoall(x)
    w = weights((2 * n, 3), r)
    (y * w).sum().backward()
    # Rows 2j, 2j+1 of rank r's input land on rank j at rows 2r, 2r+1.
    want = torch.cat([weights((2 * n, 3), j)[2 * r:2 * r + 2] for j in range(n)])
    assert torch.allclose(x.grad, want)


def test_reducescatter_gradient():
    r, n = world()
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        x = torch.ones(n, 2, dtype=torch.float64, requires_grad=True)
        y = hvd.reducescatter(x, op=op)
        (y * weights((1, 2), r)).sum().backward()
        want = torch.cat([weights((1, 2), q) for q in range(n)]) * scale
        assert torch.allclose(x.grad, want)
