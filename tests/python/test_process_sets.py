"""Process sets in hvd.torch and hvd.numpy, with horovod.torch's names: add_process_set,
remove_process_set, ProcessSet, process_set= on every op, DistributedOptimizer, broadcast_
parameters, broadcast_optimizer_state and the object helpers; the errors a user meets.

The session runs with HOROVOD_DYNAMIC_PROCESS_SETS=1 (tests/python/CMakeLists.txt). Each test
adds its sets and removes them, so every test runs the same collectives on every rank. Expected
values come from float64 NumPy references over the set's members' inputs.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import hvd.numpy as hnp
import hvd.torch as hvd
from conftest import pattern, world

NUMERIC = [torch.int16, torch.int32, torch.int64, torch.float32, torch.float64]


@pytest.fixture
def halves():
    """Two sets that split the world: even and odd ranks; yields (this rank's set, its ranks)."""
    r, n = world()
    if n < 2:
        pytest.skip("process sets need a world of 2 or more")
    evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    odds = hvd.add_process_set(hvd.ProcessSet([q for q in range(n) if q % 2 == 1]))
    mine = evens if r % 2 == 0 else odds
    yield mine, list(mine.ranks)
    assert hvd.remove_process_set(odds)
    assert hvd.remove_process_set(evens)


def test_process_set_objects(halves):
    mine, ranks = halves
    r, n = world()
    assert mine.ranks == ranks and mine.size() == len(ranks)
    assert mine.included() and mine.rank() == ranks.index(r)
    assert mine.process_set_id > 0
    ids = [ps.process_set_id for ps in hvd.process_sets()]
    assert ids[0] == 0 and mine.process_set_id in ids and len(ids) == 3
    assert hvd.global_process_set.ranks == list(range(n))
    assert hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r
    assert "process_set_id=%d" % mine.process_set_id in str(mine)
    other = [ps for ps in hvd.process_sets()[1:] if ps is not mine][0]
    assert not other.included()
    with pytest.raises(ValueError, match="not a member"):
        other.rank()


@pytest.mark.parametrize("dtype", NUMERIC, ids=str)
@pytest.mark.parametrize("op_name", ["sum", "average", "max"])
def test_allreduce_in_a_set(halves, dtype, op_name):
    mine, ranks = halves
    r, _ = world()
    op = {"sum": hvd.Sum, "average": hvd.Average, "max": hvd.Max}[op_name]
    shape = (3, 5)
    x = torch.from_numpy(pattern(shape, r)).to(dtype)
    stack = np.stack([pattern(shape, q) for q in ranks])
    want = {"sum": stack.sum(0), "average": stack.sum(0) / len(ranks),
            "max": stack.max(0)}[op_name]
    if dtype.is_floating_point or op_name != "average":
        expected = torch.from_numpy(want).to(dtype)
    else:  # integer average: the engine's rounding is checked by the core's tests
        expected = None
    y = hvd.allreduce(x, op=op, process_set=mine)
    if expected is not None:
        assert torch.equal(y, expected)
    # In place and async, unnamed (each set counts its unnamed operations apart).
    z = x.clone()
    hvd.synchronize(hvd.allreduce_async_(z, op=op, process_set=mine))
    assert torch.equal(z, y)


def test_movement_in_a_set(halves):
    mine, ranks = halves
    r, _ = world()
    k = ranks.index(r)
    m = len(ranks)
    # Allgather: member i gives i + 1 rows of its world rank.
    g = hvd.allgather(torch.full((k + 1, 2), float(r)), process_set=mine)
    want = [torch.full((i + 1, 2), float(q)) for i, q in enumerate(ranks)]
    assert torch.equal(g, torch.cat(want))
    # Broadcast from every member; root_rank is a world rank.
    for root in ranks:
        b = hvd.broadcast(torch.full((4,), float(r)), root_rank=root, process_set=mine)
        assert torch.equal(b, torch.full((4,), float(root)))
    # Alltoall: member i sends j + 1 rows to member j.
    splits = [j + 1 for j in range(m)]
    x = torch.cat([torch.full((j + 1, 3), float(100 * r + j)) for j in range(m)])
    out, received = hvd.alltoall(x, splits=splits, process_set=mine)
    assert received.tolist() == [k + 1] * m
    assert torch.equal(out, torch.cat([torch.full((k + 1, 3), float(100 * q + k)) for q in ranks]))
    # Reducescatter of 2m + 1 rows: the first (2m + 1) % m members get one row more.
    rows = 2 * m + 1
    x = torch.from_numpy(pattern((rows, 2), r))
    total = np.stack([pattern((rows, 2), q) for q in ranks]).sum(0)
    first = k * (rows // m) + min(k, rows % m)
    count = rows // m + (1 if k < rows % m else 0)
    y = hvd.reducescatter(x, op=hvd.Sum, process_set=mine)
    assert torch.equal(y, torch.from_numpy(total[first:first + count]))
    # Grouped allreduce, and a barrier of the set.
    ys = hvd.grouped_allreduce([torch.full((2,), float(r)), torch.ones(3)], op=hvd.Sum,
                               process_set=mine)
    assert torch.equal(ys[0], torch.full((2,), float(sum(ranks))))
    assert torch.equal(ys[1], torch.full((3,), float(m)))
    hvd.barrier(process_set=mine)


def test_same_name_in_the_global_set_and_a_set_at_once(halves):
    mine, ranks = halves
    r, n = world()
    a = hvd.allreduce_async(torch.full((2,), float(r)), name="shared", op=hvd.Sum)
    b = hvd.allreduce_async(torch.full((2,), float(r)), name="shared", op=hvd.Sum,
                            process_set=mine)
    assert torch.equal(hvd.synchronize(b), torch.full((2,), float(sum(ranks))))
    assert torch.equal(hvd.synchronize(a), torch.full((2,), float(n * (n - 1) / 2)))


def test_autograd_in_a_set(halves):
    mine, ranks = halves
    r, _ = world()
    x = torch.full((3,), float(r + 1), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, process_set=mine)
    (y * torch.arange(3.0)).sum().backward()
    # The gradient of a sum-allreduce is the sum-allreduce of the gradient over the set.
    assert torch.equal(x.grad, torch.arange(3.0) * len(ranks))
    x = torch.full((2, 2), float(r), requires_grad=True)
    g = hvd.allgather(x, process_set=mine)
    (g * g).sum().backward()
    # d/dx of sum over the gathered squares, averaged over the set as Horovod's backward does.
    assert torch.allclose(x.grad, 2 * x.detach())


def test_distributed_optimizer_in_a_set(halves):
    """Each set averages its members' gradients only: after one SGD step from equal weights,
    w = w0 - lr * mean over the set of each member's gradient, computed here for every member."""
    mine, ranks = halves
    r, _ = world()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    w0 = torch.ones(1, 4)
    with torch.no_grad():
        model.weight.copy_(w0)

    def data(q):
        return torch.arange(8.0).reshape(2, 4) + q, torch.tensor([[1.0], [float(q)]])

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=mine)
    x, t = data(r)
    torch.nn.functional.mse_loss(model(x), t).backward()
    opt.step()
    grads = []
    for q in ranks:
        xq, tq = data(q)
        w = w0.clone().requires_grad_(True)
        torch.nn.functional.mse_loss(xq @ w.t(), tq).backward()
        grads.append(w.grad)
    expected = w0 - 0.1 * torch.stack(grads).mean(0)
    assert torch.allclose(model.weight.detach(), expected, atol=1e-6)


def test_broadcast_state_and_objects_in_a_set(halves):
    mine, ranks = halves
    r, _ = world()
    root = ranks[-1]
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(r))
    model.weight.requires_grad_(False)  # a parameter without a gradient is broadcast too
    hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=mine)
    assert all(torch.equal(p, torch.full_like(p, float(root))) for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * (r + 1), momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=root, process_set=mine)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 * (root + 1))
    assert hvd.broadcast_object({"r": r} if r == root else None, root_rank=root,
                                process_set=mine) == {"r": root}
    assert hvd.allgather_object(("rank", r), process_set=mine) == [("rank", q) for q in ranks]


def test_numpy_in_a_set(halves):
    mine, ranks = halves
    r, _ = world()
    y = hnp.allreduce(np.full(3, float(r)), op=hnp.Sum, process_set=mine)
    assert np.array_equal(y, np.full(3, float(sum(ranks))))
    g = hnp.allgather(np.full((1, 2), r, dtype=np.int32), process_set=mine)
    assert g[:, 0].tolist() == ranks
    b = hnp.broadcast(np.arange(4.0) + r, root_rank=ranks[0], process_set=mine)
    assert np.array_equal(b, np.arange(4.0) + ranks[0])
    hnp.barrier(process_set=mine)


def test_errors_users_meet(halves):
    mine, ranks = halves
    r, n = world()
    other = [ps for ps in hvd.process_sets()[1:] if ps is not mine][0]
    with pytest.raises(ValueError, match="not a member of process set"):
        hvd.allreduce(torch.ones(2), process_set=other)
    outside = [q for q in range(n) if q not in ranks][0]
    with pytest.raises(ValueError, match="is not a member of process set"):
        hvd.broadcast(torch.ones(2), root_rank=outside, process_set=mine)
    with pytest.raises(ValueError, match="has not been added"):
        hvd.allreduce(torch.ones(2), process_set=hvd.ProcessSet([0]))
    with pytest.raises(ValueError, match="list of"):
        hvd.ProcessSet(["a"])
    # A set that exists already, on every rank.
    with pytest.raises(ValueError, match="exists already"):
        hvd.add_process_set(ranks if r % 2 == 0 else [q for q in range(n) if q % 2 == 0])
    # Ranks that differ across ranks: every rank fails, naming both lists.
    with pytest.raises(ValueError, match="process set ranks"):
        hvd.add_process_set([0] if r != n - 1 else [0, n - 1])
    # Removing a set with an operation in flight: rank 0 submits, rank 1 does not.
    pair = hvd.add_process_set([0, 1]) if n > 2 else None
    if pair is not None:
        handle = hvd.allreduce_async(torch.ones(2), name="orphan", process_set=pair) \
            if r == 0 else None
        assert hvd.remove_process_set(pair)
        assert pair.process_set_id is None
        if handle is not None:
            with pytest.raises(hvd.FailedPreconditionError, match="was removed while"):
                hvd.synchronize(handle)
    assert not hvd.remove_process_set(hvd.global_process_set)
    # The engine goes on.
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))


def test_a_removed_set_is_added_again_and_init_binds_by_ranks():
    """As in Horovod: removing a set leaves its object's ranks (so it can be added again, and
    included() still answers), and a later hvd.init(process_sets=[...]) gives new objects the
    ids of the sets with their ranks; one that names no set is a ValueError."""
    r, n = world()
    if n < 2:
        pytest.skip("a set of one rank is the global set in a world of 1")
    lone = hvd.add_process_set([n - 1])
    assert hvd.remove_process_set(lone)
    assert lone.process_set_id is None and lone.ranks == [n - 1]
    assert lone.included() == (r == n - 1)
    assert hvd.add_process_set(lone) is lone and lone.process_set_id is not None
    same = hvd.ProcessSet([n - 1])
    hvd.init(process_sets=[same])
    assert same.process_set_id == lone.process_set_id, (same, lone)
    if r == n - 1:
        got = hvd.allreduce(torch.full((3,), 2.0), op=hvd.Sum, process_set=same)
        assert torch.equal(got, torch.full((3,), 2.0))
    with pytest.raises(ValueError, match="names no process set"):
        hvd.init(process_sets=[hvd.ProcessSet(list(range(n - 1)) + [n])])
    with pytest.raises(ValueError, match="entry number 1 is a duplicate"):
        hvd.init(process_sets=[same, hvd.ProcessSet([n - 1])])
    assert hvd.remove_process_set(lone)
    assert same.process_set_id is None  # every object of the id
    hvd.barrier()


def test_a_slow_set_does_not_block_another():
    """Set a = {0, 1} waits for rank 1, which submits once set b = {0, 2} has run its ten
    allreduces; b's finish while a's is still pending."""
    r, n = world()
    if n < 3:
        pytest.skip("needs 3 ranks")
    a = hvd.add_process_set([0, 1])
    b = hvd.add_process_set([0, 2])
    slow = None
    if r == 0:
        slow = hvd.allreduce_async(torch.ones(1), name="slow", op=hvd.Sum, process_set=a)
    if r in (0, 2):
        for k in range(10):
            hvd.allreduce(torch.ones(1), name="fast.%d" % k, process_set=b)
        if r == 0:
            assert not hvd.poll(slow)
    # Rank 1 goes on once every rank is here (set b done).
    done = hvd.allgather_object(r)
    assert done == list(range(n))
    if r == 1:
        slow = hvd.allreduce_async(torch.ones(1), name="slow", op=hvd.Sum, process_set=a)
    if slow is not None:
        assert torch.equal(hvd.synchronize(slow), torch.full((1,), 2.0))
    hvd.remove_process_set(b)
    hvd.remove_process_set(a)


def _fresh_python(code, extra_env=None):
    """Runs code in a new interpreter, a world of one (no launcher variables)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HVD_", "HOROVOD_", "OMPI_", "PMI_", "SLURM_"))}
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)


def test_adding_without_dynamic_process_sets_is_a_value_error():
    r, _ = world()
    if r != 0:
        return  # no collective: one interpreter is enough
    run = _fresh_python(
        "import hvd\nhvd.init()\ntry:\n    hvd.add_process_set([0])\n"
        "except ValueError as e:\n    print('VALUE-ERROR', e)\n")
    assert "VALUE-ERROR" in run.stdout and "HOROVOD_DYNAMIC_PROCESS_SETS=1" in run.stdout, \
        run.stdout + run.stderr
    run = _fresh_python(
        "import hvd\nhvd.init(process_sets='dynamic')\ntry:\n    hvd.add_process_set([0])\n"
        "except ValueError as e:\n    print('VALUE-ERROR', e)\n")
    assert "VALUE-ERROR" in run.stdout and "exists already (id 0)" in run.stdout, \
        run.stdout + run.stderr
