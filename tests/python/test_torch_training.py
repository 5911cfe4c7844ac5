"""DistributedOptimizer, broadcast_parameters / broadcast_optimizer_state, join, objects.

The reference for DistributedOptimizer is a plain torch run, in this process, on the global
batch (every rank's shard), in float64: averaging the ranks' mean-loss gradients over equal
shards is the gradient of the mean loss over the global batch.
"""

import copy

import pytest
import torch

import hvd.torch as hvd
from conftest import world

BATCH = 4          # samples per rank per backward pass
STEPS = 5


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
        torch.nn.Linear(8, 1)).double()


def global_batch(step, micro, n):
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(BATCH * n, 6, generator=g, dtype=torch.float64)
    y = torch.randn(BATCH * n, 1, generator=g, dtype=torch.float64)
    return x, y


def make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def train_reference(kind, passes, predivide=1.0):
    _, n = world()
    model = make_model()
    opt = make_opt(kind, model.parameters())
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            x, y = global_batch(step, micro, n)
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def train_distributed(kind, passes, named=True, compression=hvd.Compression.none,
                      predivide=1.0, positional=False, groups=None, metric=False):
    r, n = world()
    model = make_model(seed=1 + r)  # a different start on every rank
    if r == 0:
        model.load_state_dict(make_model().state_dict())  # the reference's start, on the root
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_opt(kind, model.parameters())
    named_parameters = model.named_parameters() if named else None
    if positional:  # horovod.torch's order: ..., predivide, num_groups, groups, sparse_as_dense
        with pytest.warns(DeprecationWarning, match="num_groups"):
            opt = hvd.DistributedOptimizer(opt, named_parameters, compression, passes,
                                           hvd.Average, predivide, 2, None, False)
    else:
        if groups == "lists":  # [w0, b0, w2] and [b2, w1]; b1 alone
            p = list(model.parameters())
            groups = [[p[0], p[1], p[4]], [p[5], p[2]]]
        opt = hvd.DistributedOptimizer(
            opt, named_parameters=named_parameters, compression=compression,
            backward_passes_per_step=passes, gradient_predivide_factor=predivide, groups=groups)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            x, y = global_batch(step, micro, n)
            shard = slice(r * BATCH, (r + 1) * BATCH)
            loss = torch.nn.functional.mse_loss(model(x[shard]), y[shard])
            loss.backward()
        if metric:  # Horovod's metric_average: unnamed, while the gradients are in flight
            average = hvd.allreduce(loss.detach())
            with torch.no_grad():
                expected = torch.nn.functional.mse_loss(model(x), y)
            assert torch.allclose(average, expected, atol=1e-12, rtol=0), (average, expected)
        opt.step()
    return model


def assert_same_params(a, b, atol=1e-10):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=atol, rtol=0), name


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("passes", [1, 2])
def test_distributed_optimizer_matches_single_process(kind, passes):
    assert_same_params(train_distributed(kind, passes), train_reference(kind, passes))


def test_distributed_optimizer_unnamed_and_predivide():
    assert_same_params(train_distributed("sgd", 1, named=False, predivide=2.0),
                       train_reference("sgd", 1))


def test_unnamed_gradients_apart_from_unnamed_calls():
    """The optimizer's own names for unnamed parameters never meet the caller's unnamed
    allreduces in the same step (they did: 'already in flight', or a metric summed into a
    gradient)."""
    assert_same_params(train_distributed("sgd", 1, named=False, metric=True),
                       train_reference("sgd", 1))


def test_set_backward_passes_per_step_as_horovod():
    """Built for 1 pass, set to 2: gradients accumulate over two backward passes, as a model
    built with 2 would."""
    model = make_model()
    opt = hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                   named_parameters=model.named_parameters())
    opt.set_backward_passes_per_step(2)
    assert opt.backward_passes_per_step == 2
    train_shards(model, opt, 2)
    assert_same_params(model, train_reference("sgd", 2))


def test_backward_passes_per_step_is_a_whole_number_of_at_least_one():
    model = make_model()
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="backward_passes_per_step must be an integer"):
            hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                     named_parameters=model.named_parameters(),
                                     backward_passes_per_step=bad)
    opt = hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                   named_parameters=model.named_parameters())
    with pytest.raises(ValueError, match="got 0"):
        opt.set_backward_passes_per_step(0)
    assert opt.backward_passes_per_step == 1


def train_shards(model, opt, passes):
    """STEPS steps of `passes` backward passes each, on this rank's shards of the global batch
    (the training of train_distributed, for an optimizer made elsewhere)."""
    r, n = world()
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            x, y = global_batch(step, micro, n)
            shard = slice(r * BATCH, (r + 1) * BATCH)
            torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
        opt.step()


def test_load_state_dict_starts_the_step_afresh():
    """A rollback in the middle of accumulating (Horovod's load_state_dict): the next step
    runs as if the interrupted one never began."""
    _, n = world()
    model = make_model()
    opt = hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    saved = copy.deepcopy(opt.state_dict())
    x, y = global_batch(99, 0, n)
    torch.nn.functional.mse_loss(model(x), y).backward()  # one of two passes: nothing sent
    opt.load_state_dict(saved)
    train_shards(model, opt, 2)  # its first zero_grad was refused before: the pass counted
    assert_same_params(model, train_reference("sgd", 2))


def test_named_parameters_must_be_pairs():
    model = make_model()
    with pytest.raises(ValueError, match="sequence of tuples"):
        hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                 named_parameters=model.parameters())


def test_distributed_optimizer_arguments_in_horovods_order():
    assert_same_params(train_distributed("sgd", 2, positional=True), train_reference("sgd", 2))


def record_grouped_allreduces(monkeypatch):
    """The number of tensors in each grouped allreduce DistributedOptimizer submits."""
    import hvd.torch.optimizer as optimizer_module
    sizes = []
    submit = optimizer_module.grouped_allreduce_async_

    def record(tensors, *args, **kwargs):
        sizes.append(len(tensors))
        return submit(tensors, *args, **kwargs)
    monkeypatch.setattr(optimizer_module, "grouped_allreduce_async_", record)
    return sizes


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("groups", [4, "lists"])
def test_groups_go_out_together_and_match_single_process(groups, passes, monkeypatch):
    sizes = record_grouped_allreduces(monkeypatch)
    assert_same_params(train_distributed("sgd", passes, groups=groups),
                       train_reference("sgd", passes))
    # 4 groups of the 6 parameters: runs of 2, 2, 1 and 1 (one alone is a plain allreduce).
    # A world of one communicates nothing.
    per_step = [2, 2] if groups == 4 else [3, 2]
    assert sorted(sizes) == (sorted(per_step * STEPS) if world()[1] > 1 else []), sizes


def test_num_groups_splits_as_groups(monkeypatch):
    sizes = record_grouped_allreduces(monkeypatch)
    assert_same_params(train_distributed("sgd", 2, positional=True), train_reference("sgd", 2))
    assert sizes == ([3, 3] * STEPS if world()[1] > 1 else []), sizes


def test_a_group_member_without_a_gradient_goes_out_as_zeros():
    r, n = world()
    model = make_model()
    unused = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))  # in no loss
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params + [unused], lr=0.1),
                                   groups=[[params[0], unused], [params[3], params[1]]])
    x, y = global_batch(0, 0, n)
    shard = slice(r * BATCH, (r + 1) * BATCH)
    torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
    opt.step()
    ref = make_model()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    assert_same_params(model, ref)
    if n > 1:  # a world of one leaves it without a gradient, as torch does
        assert torch.equal(unused.grad, torch.zeros(3, dtype=torch.float64))
    assert torch.equal(unused.detach(), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("groups, match", [
    (-1, "number of groups"), ("two", "number of groups"), ([[1.0]], "torch.Tensor"),
    ([7], "groups\\[0\\] must be a list"), ("twice", "twice")])
def test_bad_groups_are_refused(groups, match):
    model = make_model()
    p = list(model.parameters())
    if groups == "twice":
        groups = [[p[0], p[1]], [p[2], p[0]]]
    with pytest.raises(ValueError, match=match):
        hvd.DistributedOptimizer(torch.optim.SGD(p, lr=0.1), groups=groups)


def test_distributed_optimizer_fp16_compression_is_close():
    assert_same_params(train_distributed("sgd", 1, compression=hvd.Compression.fp16),
                       train_reference("sgd", 1), atol=1e-2)


def test_distributed_optimizer_synchronize_then_skip():
    r, n = world()
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = global_batch(0, 0, n)
    shard = slice(r * BATCH, (r + 1) * BATCH)
    torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    with opt.skip_synchronize():
        opt.step()
    ref = make_model()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    assert_same_params(model, ref)


def test_duplicate_parameter_names_are_refused():
    model = make_model()
    named = [("same", p) for p in model.parameters()]
    with pytest.raises(ValueError, match="duplicate"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=named)


def rank_state(kind, r):
    """An optimizer whose state differs per rank: one step with gradient (r + 1)."""
    model = make_model()
    opt = make_opt(kind, model.parameters())
    for group in opt.param_groups:
        group["lr"] = 0.1 * (r + 1)
    for p in model.parameters():
        p.grad = torch.full_like(p, float(r + 1))
    opt.step()
    return model, opt


def test_broadcast_optimizer_state_sgd_momentum():
    r, n = world()
    root = n - 1
    model, opt = rank_state("sgd", r)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * (root + 1))
    for p in model.parameters():
        # SGD's first step stores the gradient itself as the momentum buffer.
        assert torch.equal(opt.state[p]["momentum_buffer"], torch.full_like(p, float(root + 1)))


def test_broadcast_optimizer_state_adam():
    r, n = world()
    root = n - 1
    model, opt = rank_state("adam", r)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    b1, b2 = opt.param_groups[0]["betas"]
    g = float(root + 1)
    for p in model.parameters():
        st = opt.state[p]
        assert float(st["step"]) == 1.0
        assert torch.allclose(st["exp_avg"], torch.full_like(p, (1 - b1) * g))
        assert torch.allclose(st["exp_avg_sq"], torch.full_like(p, (1 - b2) * g * g))


def test_broadcast_optimizer_state_that_cannot_fit_fails_on_every_rank():
    """Optimizers that differ from the root's on the last rank (param groups, a parameter's
    shape, the class): every rank raises, naming that rank and what differs, instead of the
    root waiting in broadcasts the others never make, or the state of one shape landing on
    parameters of another; nothing has changed, and the next operation works."""
    r, n = world()
    if n < 2:
        return
    bad = r == n - 1
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2 + (bad and 1)))
    cases = [
        (torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[1].parameters()}]
                         if bad else model.parameters(), lr=0.1, momentum=0.9),
         "rank %d: 2 param groups, not the root's 1" % (n - 1)),
        (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
         "rank %d: shape [3, 2] for parameter 2 of param group 0, not the root's [2, 2]" % (n - 1)),
        (torch.optim.Adam(model.parameters()) if bad else torch.optim.SGD(model.parameters(), lr=1),
         "rank %d: Adam, not the root's SGD" % (n - 1)),
    ]
    for opt, text in cases:
        with pytest.raises(ValueError, match="differs from root rank 0's") as got:
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert text in str(got.value), got.value
        assert len(opt.state) == 0  # the root has not taken its first step either
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after.mismatch").item() == n


def test_broadcast_optimizer_state_created_lazily_on_root_only():
    r, n = world()
    root = 0
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if r == root:  # local work only: no collective depends on the rank
        for p in model.parameters():
            p.grad = torch.full_like(p, 3.0)
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    for p in model.parameters():
        assert float(opt.state[p]["step"]) == 1.0
        assert torch.allclose(opt.state[p]["exp_avg"], torch.full_like(p, 0.1 * 3.0))
    # From identical state, identical steps keep the ranks identical.
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0))
    assert all(torch.equal(gathered[q], flat) for q in range(n))


def test_broadcast_optimizer_state_fresh_takes_horovods_first_step():
    """As Horovod (Horovod's test_broadcast_state_no_grad): a fresh optimizer's parameters that
    require grad get zero gradients (equal on every rank), one that does not keeps None, and
    the optimizer steps once on them to create its state, without communicating: so weight
    decay shrinks the parameters once, and the momentum buffers hold wd * p."""
    r, n = world()

    class NoGrad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32),
                                        requires_grad=False)
            self.b = torch.nn.Parameter(torch.arange(4, dtype=torch.float64) + r)

    model = NoGrad()
    lr, wd, mom = 0.001, 1e-2, 0.9
    opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd, momentum=mom,
                          nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert model.a.grad is None
    assert torch.equal(model.b.grad, torch.zeros(4, dtype=torch.float64))
    b0 = torch.arange(4, dtype=torch.float64)  # rank 0's
    # SGD on a zero gradient: d = wd * b0, buffer = d, nesterov step d + mom * buffer.
    assert torch.allclose(opt.state[model.b]["momentum_buffer"], wd * b0, rtol=1e-12, atol=0)
    assert torch.allclose(model.b.detach(), b0 - lr * (1 + mom) * wd * b0, rtol=1e-12, atol=0)
    assert torch.equal(hvd.broadcast(model.b.grad, root_rank=n - 1),
                       torch.zeros(4, dtype=torch.float64))
    # Once the state exists, gradients and parameters are left as they are.
    model.b.grad.fill_(2.0)
    b1 = model.b.detach().clone()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert torch.equal(model.b.grad, torch.full((4,), 2.0, dtype=torch.float64))
    assert torch.equal(model.b.detach(), b1)


def test_broadcast_optimizer_state_fresh_ranks_keep_the_roots_parameters():
    """The root resumed (its SGD has momentum buffers), the others are fresh: they take no
    priming step (which, with weight decay, would move their parameters away from the root's),
    and end with the root's state and parameters."""
    r, n = world()
    root = n - 1
    model = make_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.5)
    if r == root:  # local work only
        for p in model.parameters():
            p.grad = torch.full_like(p, 2.0)
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    bufs = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(torch.stack([flat, bufs]).unsqueeze(0))
    assert all(torch.equal(gathered[q], gathered[root]) for q in range(n))


def test_broadcast_optimizer_state_fresh_adam_counts_one_step():
    """A fresh Adam after broadcast_optimizer_state: step 1 and zero moments on every rank, as
    under Horovod, so the first real step's bias correction is that of step 2."""
    r, n = world()
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for p, p0 in zip(model.parameters(), before):
        assert float(opt.state[p]["step"]) == 1.0
        assert torch.equal(opt.state[p]["exp_avg"], torch.zeros_like(p))
        assert torch.equal(opt.state[p]["exp_avg_sq"], torch.zeros_like(p))
        assert torch.equal(p.detach(), p0)  # no weight decay: the zero step moves nothing


def test_broadcast_parameters_forms():
    r, n = world()
    model = make_model(seed=r)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)
    ref = make_model(seed=0)
    assert_same_params(model, ref, atol=0)
    tensors = [torch.full((3,), float(r)), torch.full((2, 2), float(r))]
    hvd.broadcast_parameters(tensors, root_rank=n - 1)
    assert all(torch.equal(t, torch.full_like(t, float(n - 1))) for t in tensors)


def test_join_with_uneven_batches():
    r, n = world()
    batches = r + 1  # rank r has r + 1 batches; the last rank has the most
    for i in range(batches):
        y = hvd.allreduce(torch.full((3,), float(r + 1)), name="uneven.%d" % i, op=hvd.Sum)
        # Ranks that have joined take part with zeros.
        assert torch.equal(y, torch.full((3,), float(sum(q + 1 for q in range(n) if q + 1 > i))))
    last = hvd.join()
    assert last == n - 1
    # After everyone joined, collectives work normally again.
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))


def test_broadcast_object():
    r, n = world()
    for root in range(n):
        obj = {"root": root, "rank": r, "payload": list(range(r * 10))}
        got = hvd.broadcast_object(obj if r == root else None, root_rank=root)
        assert got == {"root": root, "rank": root, "payload": list(range(root * 10))}


def test_allgather_object():
    r, n = world()
    got = hvd.allgather_object({"rank": r, "data": "x" * (r * 7)})
    assert got == [{"rank": q, "data": "x" * (q * 7)} for q in range(n)]


def test_objects_with_lambdas_travel_as_in_horovod():
    """cloudpickle, as Horovod: a lambda or a closure (a schedule in an elastic state) goes by
    value."""
    pytest.importorskip("cloudpickle")  # Debian's python3-cloudpickle (scripts/install_deps.sh)
    r, n = world()
    offset = 3
    got = hvd.broadcast_object((lambda x: x * 2 + offset) if r == 0 else None, root_rank=0)
    assert got(5) == 13
    fns = hvd.allgather_object(lambda x, r=r: x + r)
    assert [f(100) for f in fns] == [100 + q for q in range(n)]


def test_barrier_after_training():
    hvd.barrier()


JOIN_DTYPES = [torch.int32, torch.int64, torch.float32, torch.float64]


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("first_join", [0, 1])
def test_join_allreduce_as_horovod(first_join, caching):
    """Horovod's join semantics: one rank joins first while the others allreduce two tensors
    (fused) under names that may be cached already; the joined rank counts as zeros, Average
    divides by the whole world, and every rank gets the same last-joined rank, which is not
    the first to join."""
    r, n = world()
    if n < 2:
        return
    first_join = first_join % n
    for dtype, dim in [(d, k) for d in JOIN_DTYPES for k in (1, 2, 3)]:
        gen = torch.Generator().manual_seed(1234 + dim)
        a = torch.randint(-100, 100, (5,) * dim, generator=gen).to(dtype)
        b = torch.randint(-100, 100, (5,) * dim, generator=gen).to(dtype)
        if caching:  # every rank, so that the names are in the response cache
            hvd.synchronize(hvd.allreduce_async(a, name="join.a", op=hvd.Sum))
            hvd.synchronize(hvd.allreduce_async(b, name="join.b", op=hvd.Sum))
        if r == first_join:
            ret = hvd.join()
        else:
            ha = hvd.allreduce_async(a, name="join.a", average=True)
            hb = hvd.allreduce_async(b, name="join.b", average=True)
            avg_a, avg_b = hvd.synchronize(ha), hvd.synchronize(hb)
            ret = hvd.join()
            # Every rank has the same a and b (same seed); the joined one adds zeros.
            for got, x in ((avg_a, a), (avg_b, b)):
                want = x.to(torch.float64) * (n - 1) / n
                if dtype.is_floating_point:
                    assert torch.allclose(got.to(torch.float64), want, atol=1e-5)
                else:  # the integer average rounds as the engine documents: compare closely
                    assert (got.to(torch.float64) - want).abs().max() <= 1
        assert ret != first_join
        assert hvd.allgather_object(ret) == [ret] * n


@pytest.mark.parametrize("named", [True, False])
@pytest.mark.parametrize("kind", ["allgather", "broadcast", "alltoall", "reducescatter",
                                  "grouped_allgather", "grouped_reducescatter"])
def test_join_refuses_other_collectives_as_horovod(kind, named):
    """While rank 0 has joined, allgather, broadcast, alltoall and reducescatter fail on the
    others with Horovod's message, nothing hangs and nobody shuts the job down; join then
    returns the same last rank everywhere. Unnamed (as Horovod's test_horovod_join_allgather
    calls it), the refused call is one more unnamed call on some ranks than on rank 0: the
    unnamed allgather_object after it must still get the same name everywhere."""
    r, n = world()
    if n < 2:
        return
    x = torch.ones(17, 3)

    def name(s):
        return s if named else None

    if r == 0:
        ret = hvd.join()
    else:
        run = {"allgather": lambda: hvd.allgather(x, name=name("jr.ag")),
               "broadcast": lambda: hvd.broadcast(x, 1, name=name("jr.bc")),
               "alltoall": lambda: hvd.alltoall(torch.ones(n, 2), name=name("jr.a2a")),
               "reducescatter": lambda: hvd.reducescatter(torch.ones(n, 2),
                                                          name=name("jr.rs")),
               "grouped_allgather": lambda: hvd.grouped_allgather([x, x[:5]],
                                                                  name=name("jr.gag")),
               "grouped_reducescatter": lambda: hvd.grouped_reducescatter(
                   [torch.ones(n, 2), torch.ones(n)], name=name("jr.grs"))}[kind]
        with pytest.raises((RuntimeError, ValueError)) as err:
            run()
        assert "is not supported with Join at this time" in str(err.value)
        ret = hvd.join()
    assert ret != 0
    assert hvd.allgather_object(ret) == [ret] * n


def test_step_after_synchronize_warns_with_horovods_words():
    r, n = world()
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning) as record:
        opt.step()
    assert any(str(w.message) ==
               "optimizer.step() called without optimizer.skip_synchronize() context after "
               "optimizer.synchronize(). This can cause training slowdown. You may want to "
               "consider using optimizer.skip_synchronize() context if you use "
               "optimizer.synchronize() in your code." for w in record)
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()  # no warning here


def _embedding_indices(q):
    """Rank q's lookups: overlapping across ranks, with repeats."""
    return torch.tensor([q % 5, (q + 2) % 5, 3, q % 5, 7 - q % 3])


def _embedding_reference(n, lr, w0):
    """SGD with the gradient averaged over ranks, from every rank's dense gradient."""
    grads = []
    for q in range(n):
        w = w0.clone().requires_grad_(True)
        out = torch.nn.functional.embedding(_embedding_indices(q), w)
        (out * (q + 1)).sum().backward()
        grads.append(w.grad)
    return w0 - lr * torch.stack(grads).mean(0)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_trains_as_horovod(sparse_as_dense):
    """nn.Embedding(sparse=True) under DistributedOptimizer: sparse gradients are allgathered
    (or made dense) and averaged, so one SGD step equals the dense reference."""
    r, n = world()
    w0 = torch.arange(24, dtype=torch.float64).reshape(8, 3) / 10
    emb = torch.nn.Embedding(8, 3, sparse=True).double()
    with torch.no_grad():
        emb.weight.copy_(w0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    (emb(_embedding_indices(r)) * (r + 1)).sum().backward()
    opt.step()
    assert torch.allclose(emb.weight.detach(), _embedding_reference(n, 0.5, w0), atol=1e-12)
    assert emb.weight.grad.is_sparse  # made sparse again after sparse_as_dense, as in Horovod


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_adam_takes_the_reduced_gradient(sparse_as_dense):
    """SparseAdam (which refuses dense gradients) under DistributedOptimizer, as Horovod's
    test_sparse_embeddings runs it: one step equals SparseAdam on the averaged gradient."""
    r, n = world()
    w0 = torch.arange(24, dtype=torch.float64).reshape(8, 3) / 10
    emb = torch.nn.Embedding(8, 3, sparse=True).double()
    with torch.no_grad():
        emb.weight.copy_(w0)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    (emb(_embedding_indices(r)) * (r + 1)).sum().backward()
    opt.step()
    grads = []
    for q in range(n):
        w = w0.clone().requires_grad_(True)
        (torch.nn.functional.embedding(_embedding_indices(q), w) * (q + 1)).sum().backward()
        grads.append(w.grad)
    ref = torch.nn.Parameter(w0.clone())
    ref.grad = torch.stack(grads).mean(0).to_sparse()
    torch.optim.SparseAdam([ref], lr=0.1).step()
    assert torch.allclose(emb.weight.detach(), ref.detach(), atol=1e-12)


@pytest.mark.parametrize("op_name", ["sum", "average"])
def test_sparse_allreduce_async(op_name):
    r, n = world()
    dense = torch.zeros(6, 2)
    dense[r % 6] = r + 1.0
    dense[5] = 1.0
    op = hvd.Sum if op_name == "sum" else hvd.Average
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse.%s" % op_name, op=op)
    got = hvd.synchronize(handle)
    assert got.is_sparse
    want = torch.zeros(6, 2)
    for q in range(n):
        want[q % 6] += q + 1.0
        want[5] += 1.0
    if op_name == "average":
        want /= n
    assert torch.allclose(got.to_dense(), want)


def test_broadcasts_take_parameters_without_gradients():
    """broadcast_parameters and broadcast_optimizer_state with a frozen parameter
    (requires_grad=False) in the model and in the optimizer, before and after a step."""
    r, n = world()
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(float(r + i))
    model[0].weight.requires_grad_(False)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=n - 1)
    for i, p in enumerate(model.parameters()):
        assert torch.equal(p.detach(), torch.full_like(p, float(n - 1 + i)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=n - 1)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 * n)
    model(torch.ones(2, 3)).sum().backward()  # the frozen weight gets no gradient
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert model[0].weight not in opt.state or not opt.state[model[0].weight]
    step = opt.state[model[1].weight]["step"]
    assert float(step) == 2.0  # the fresh optimizer's first broadcast stepped once (Horovod)
