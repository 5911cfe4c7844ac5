"""Gradients through hvd.torch's differentiable collectives, against formulas.

Each rank's loss is sum(y * w_r) with a rank-dependent weight w_r, so dloss/dy = w_r; the
expected input gradients follow from horovod.torch's backward rules (see hvd/torch/mpi_ops.py).
"""

import pytest
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
    # Each member's gradient is the allgather of the output gradients (Average: as is).
    g0 = torch.cat([torch.full((2,), float(q + 1), dtype=torch.float64) for q in range(n)])
    g1 = torch.cat([weights((1, 3), q) for q in range(n)])
    assert torch.allclose(xs[0].grad, g0)
    assert torch.allclose(xs[1].grad, g1)
    # Sum: times the size, as in Horovod.
    xs = [torch.ones(2 * n, dtype=torch.float64, requires_grad=True)]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    (ys[0] * (r + 1)).sum().backward()
    assert torch.allclose(xs[0].grad, g0 * n)


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
    """Horovod's convention (its test_horovod_reducescatter_grad and _grad_average): the
    allgather of the output gradients, times the size for Sum, as is for Average."""
    r, n = world()
    for op, scale in ((hvd.Sum, float(n)), (hvd.Average, 1.0)):
        x = torch.ones(n, 2, dtype=torch.float64, requires_grad=True)
        y = hvd.reducescatter(x, op=op)
        (y * weights((1, 2), r)).sum().backward()
        want = torch.cat([weights((1, 2), q) for q in range(n)]) * scale
        assert torch.allclose(x.grad, want)


def test_grouped_allgather_gradient():
    """Every rank's loss is the same function of the gathered tensors, so Horovod's backward
    (the gradients averaged over ranks, then each rank's rows) gives each rank the loss's
    gradient at its own rows."""
    r, n = world()
    xs = [torch.full((r + 1, 2), float(r), requires_grad=True),
          torch.full((2, 3), float(r + 1), requires_grad=True)]
    outs = hvd.grouped_allgather(xs, name="grad.grouped_allgather")
    rows0 = n * (n + 1) // 2
    w0 = torch.arange(rows0 * 2, dtype=torch.float32).reshape(rows0, 2)
    w1 = torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) * -1
    ((outs[0] * w0).sum() + (outs[1] * w1).sum()).backward()
    first = r * (r + 1) // 2
    assert torch.equal(xs[0].grad, w0[first:first + r + 1])
    assert torch.equal(xs[1].grad, w1[2 * r:2 * r + 2])


def _batches(q, c):
    """Rank q's batch for the SyncBatchNorm tests: q + 2 samples, values distinct per rank."""
    g = torch.Generator().manual_seed(100 + q)
    return torch.randn(q + 2, c, 3, generator=g, dtype=torch.float64) * (q + 1) + q


def test_sync_batch_norm_matches_one_batch_norm_over_every_rank():
    """Output, input gradient, parameter gradients and running statistics equal those of one
    torch BatchNorm1d over the concatenation of every rank's batch (batches of unequal size)."""
    r, n = world()
    c = 4
    sbn = hvd.SyncBatchNorm(c, momentum=0.3).double()
    ref = torch.nn.BatchNorm1d(c, momentum=0.3).double()
    with torch.no_grad():
        for m in (sbn, ref):
            m.weight.copy_(torch.arange(1.0, c + 1))
            m.bias.copy_(torch.arange(c) * 0.5)
    weights = [torch.linspace(-1, 1, (q + 2) * c * 3, dtype=torch.float64).reshape(q + 2, c, 3)
               * (q + 1) for q in range(n)]
    x = _batches(r, c).requires_grad_(True)
    for _ in range(2):  # twice: the running statistics move twice
        sbn.zero_grad()
        x.grad = None
        out = sbn(x)
        (out * weights[r]).sum().backward()
    xs = [_batches(q, c).requires_grad_(True) for q in range(n)]
    for _ in range(2):
        ref.zero_grad()
        for t in xs:
            t.grad = None
        whole = ref(torch.cat(xs))
        (whole * torch.cat(weights)).sum().backward()
    first = sum(q + 2 for q in range(r))
    assert torch.allclose(out, whole[first:first + r + 2].detach(), atol=1e-12)
    assert torch.allclose(x.grad, xs[r].grad, atol=1e-12)
    assert torch.allclose(sbn.running_mean, ref.running_mean, atol=1e-12)
    assert torch.allclose(sbn.running_var, ref.running_var, atol=1e-12)
    # Parameter gradients are each rank's share; their sum over ranks is the reference's.
    total_w = hvd.allreduce(sbn.weight.grad, op=hvd.Sum, name="sbn.wgrad")
    assert torch.allclose(total_w, ref.weight.grad, atol=1e-10)
    sbn.eval()
    ref.eval()
    assert torch.allclose(sbn(x.detach()), ref(x.detach()), atol=1e-12)


def _adasum_pair(a, b):
    dot, aa, bb = float((a * b).sum()), float((a * a).sum()), float((b * b).sum())
    ca = 1 - dot / (2 * aa) if aa >= 1e-8 else 1.0
    cb = 1 - dot / (2 * bb) if bb >= 1e-8 else 1.0
    return ca * a + cb * b


def _adasum_tree(vectors):
    """Adasum's formula over ranks in order: pairs (0, 1), (2, 3), ..., then pairs of pairs."""
    while len(vectors) > 1:
        vectors = [_adasum_pair(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0]


def _power_of_two(n):
    return n & (n - 1) == 0


def test_adasum_allreduce_matches_its_formula():
    r, n = world()

    def vec(q):
        return torch.sin(torch.arange(1.0, 12.0, dtype=torch.float64) * (q + 1)) * (q % 3 + 1)

    if not _power_of_two(n):
        # Horovod's exception and words, at the call, before anything is submitted.
        with pytest.raises(NotImplementedError, match="non-power of 2 ranks is not supported"):
            hvd.allreduce(vec(r), op=hvd.Adasum, name="adasum.refused")
        with pytest.raises(NotImplementedError, match="non-power of 2 ranks"):
            hvd.grouped_allreduce([vec(r)], op=hvd.Adasum, name="adasum.refused.group")
        hvd.barrier()  # refused at the call: meet before the next test
        return
    got = hvd.allreduce(vec(r), op=hvd.Adasum, name="adasum.f64")
    assert torch.allclose(got, _adasum_tree([vec(q) for q in range(n)]), atol=1e-12)
    got32 = hvd.allreduce(vec(r).float(), op=hvd.Adasum, name="adasum.f32")
    assert torch.allclose(got32.double(), _adasum_tree([vec(q).float().double()
                                                        for q in range(n)]), atol=1e-5)
    got16 = hvd.allreduce(vec(r).half(), op=hvd.Adasum, name="adasum.f16")
    want16 = _adasum_tree([vec(q).half().double() for q in range(n)])
    assert got16.dtype == torch.float16
    assert torch.allclose(got16.double(), want16, rtol=1e-3, atol=1e-3), (got16, want16)
    with pytest.raises(ValueError, match="float16, float32 and float64"):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum, name="adasum.int")


def test_distributed_optimizer_with_adasum_combines_the_changes():
    """op=hvd.Adasum: each rank's SGD change (-lr * its gradient) is combined by Adasum's
    formula, tensor by tensor, and added to the parameters as they were. As Horovod's Adasum
    optimizer, it starts the gradients at zero and refuses skip_synchronize."""
    r, n = world()
    if not _power_of_two(n):
        hvd.barrier()
        return
    lr = 0.1
    model = torch.nn.Linear(3, 2).double()
    with torch.no_grad():
        model.weight.copy_(torch.arange(6.0).reshape(2, 3) / 10)
        model.bias.copy_(torch.tensor([0.5, -0.5]))
    w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    if n > 1:
        assert torch.equal(model.weight.grad, torch.zeros(2, 3, dtype=torch.float64))
        with pytest.raises(AssertionError, match="not supported when using Adasum"):
            with opt.skip_synchronize():
                pass

    def data(q):
        return (torch.arange(12.0, dtype=torch.float64).reshape(4, 3) * (q + 1) % 5,
                torch.full((4, 2), float(q), dtype=torch.float64))

    x, t = data(r)
    torch.nn.functional.mse_loss(model(x), t).backward()
    opt.step()
    deltas_w, deltas_b = [], []
    for q in range(n):
        ref = torch.nn.Linear(3, 2).double()
        with torch.no_grad():
            ref.weight.copy_(w0)
            ref.bias.copy_(b0)
        xq, tq = data(q)
        torch.nn.functional.mse_loss(ref(xq), tq).backward()
        deltas_w.append(-lr * ref.weight.grad)
        deltas_b.append(-lr * ref.bias.grad)
    assert torch.allclose(model.weight.detach(), w0 + _adasum_tree(deltas_w), atol=1e-12)
    assert torch.allclose(model.bias.detach(), b0 + _adasum_tree(deltas_b), atol=1e-12)
