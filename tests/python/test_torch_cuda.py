"""hvd.torch on CUDA tensors: every op and dtype, the caller's stream, many small tensors (device
fusion), and DistributedOptimizer on a CUDA model.

Skipped as a whole, with the reason, where torch sees no CUDA device or hvd was built without
CUDA (every rank decides alike, so no rank skips a collective the others run). One rank uses
NCCL; ranks that share a GPU are staged through host memory; both must give the same results.
References are float64 NumPy/torch computations on the CPU from every rank's input.
"""

import os

import numpy as np
import pytest
import torch

import hvd.torch as hvd
from conftest import world
from test_torch_ops import DTYPES, OPS, expected_allreduce, kind_of, make
from test_torch_training import STEPS, BATCH, assert_same_params, global_batch, make_model, \
    make_opt, train_reference

if not torch.cuda.is_available():
    pytest.skip("no CUDA device is visible to torch", allow_module_level=True)
if not hvd.cuda_built():
    pytest.skip("this hvd was built without CUDA", allow_module_level=True)


def dev():
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


@pytest.fixture(autouse=True)
def one_device_per_rank():
    torch.cuda.set_device(dev())


def test_built_flags():
    assert hvd.cuda_built()
    code = hvd.nccl_built()  # NCCL_VERSION_CODE, or 0 without NCCL
    assert isinstance(code, int) and (code == 0 or code >= 2000)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 5), (4099,)], ids=str)
@pytest.mark.parametrize("op_name", list(OPS))
def test_allreduce(dtype, shape, op_name):
    r, _ = world()
    x = make(shape, r, dtype, kind_of(op_name)).to(dev())
    if dtype == torch.bool and op_name == "average":
        with pytest.raises(hvd.InvalidArgumentError, match="average"):
            hvd.allreduce(x, op=OPS[op_name])
        return
    y = hvd.allreduce(x, op=OPS[op_name])
    assert y.device == x.device and y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y.cpu(), expected_allreduce(shape, dtype, op_name))
    z = x.clone()
    assert hvd.allreduce_(z, op=OPS[op_name]) is z
    assert torch.equal(z.cpu(), expected_allreduce(shape, dtype, op_name))


def test_allreduce_waits_for_the_callers_stream():
    """The input is written on a side stream behind a long kernel; hvd must read it after."""
    r, n = world()
    side = torch.cuda.Stream()
    a = torch.randn(2048, 2048, device=dev())
    x = torch.zeros(1 << 20, device=dev())
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(20):
            a = a @ a / 2048.0  # keeps the side stream busy for a while
        x.fill_(r + 1.0)
        y = hvd.allreduce(x, op=hvd.Sum)
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), torch.full((1 << 20,), n * (n + 1) / 2.0))


def test_allreduce_scale_factors():
    r, n = world()
    for dtype in (torch.float16, torch.float32, torch.float64, torch.int32):
        x = torch.full((1000,), 2.0 * (r + 1), dtype=dtype, device=dev())
        y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5)
        want = 3.0 * 0.5 * sum(2.0 * (q + 1) for q in range(n))
        assert torch.equal(y.cpu(), torch.full((1000,), want, dtype=torch.float64).to(dtype))


def test_float16_scales_by_the_factor_rounded_to_float16():
    """Horovod's rule on the GPU (test_horovod_allreduce_prescale/postscale, and reducescatter's):
    a float16 tensor is scaled by the factor rounded to float16, in float16 (torch's own CUDA
    multiply), on NCCL and when staged. The CPU's rule (float32 math) differs in the last place
    for some of these values."""
    r, n = world()
    torch.manual_seed(1234)
    x = torch.empty(4099).uniform_(-100, 100).to(torch.float16).to(dev())
    factor = 0.3141592653589793
    f16 = torch.tensor(factor, dtype=torch.float64).to(torch.float16).to(dev())
    pre = hvd.allreduce(x, op=hvd.Sum, prescale_factor=factor, name="f16.pre")
    post = hvd.allreduce(x, op=hvd.Sum, postscale_factor=factor, name="f16.post")
    want_pre = f16 * x * n if n <= 2 else None  # doubling is exact; sums of three are not
    want_post = f16 * (x * n) if n <= 2 else None
    if want_pre is not None:
        assert torch.equal(pre, want_pre)
        assert torch.equal(post, want_post)
    else:
        assert torch.allclose(pre.float(), (f16 * x).float() * n, rtol=2e-3)
    # The same for reducescatter (test_horovod_reducescatter_prescale/postscale): rank r gets
    # its rows of the whole result, the first ranks a row more.
    rs_pre = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=factor, name="f16.rs.pre")
    rs_post = hvd.reducescatter(x, op=hvd.Sum, postscale_factor=factor, name="f16.rs.post")
    rows = x.shape[0]
    first = sum(rows // n + (q < rows % n) for q in range(r))
    mine = slice(first, first + rows // n + (r < rows % n))
    if want_pre is not None:
        assert torch.equal(rs_pre, want_pre[mine])
        assert torch.equal(rs_post, want_post[mine])
    else:
        assert torch.allclose(rs_pre.float(), ((f16 * x).float() * n)[mine], rtol=2e-3)
    cpu_rule = ((x.float() * factor).to(torch.float16)).float()
    assert not torch.equal((f16 * x).float(), cpu_rule), "the values do not tell the rules apart"


def test_many_small_tensors_fuse():
    r, n = world()
    xs = [torch.full((k % 97 + (k % 3),), float(r + k % 5), device=dev()) for k in range(300)]
    handles = [hvd.allreduce_async_(x, op=hvd.Sum, name="cuda.small.%d" % k)
               for k, x in enumerate(xs)]
    for k, (x, h) in enumerate(zip(xs, handles)):
        hvd.synchronize(h)
        want = sum(q + k % 5 for q in range(n))
        assert torch.equal(x.cpu(), torch.full(x.shape, float(want))), k


def test_grouped_allreduce():
    r, n = world()
    xs = [torch.full((k + 1, 3), float(r * k), dtype=torch.float64, device=dev())
          for k in range(10)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    for k, y in enumerate(ys):
        assert y.device == xs[k].device
        assert torch.equal(y.cpu(), torch.full((k + 1, 3), float(k * n * (n - 1) / 2),
                                               dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.bool, torch.bfloat16], ids=str)
def test_allgather_ragged(dtype):
    r, n = world()
    x = make((r + 1, 2), r, dtype, "small").to(dev())
    y = hvd.allgather(x)
    assert y.device == x.device and y.shape == (n * (n + 1) // 2, 2)
    want = torch.cat([make((q + 1, 2), q, dtype, "small") for q in range(n)])
    assert torch.equal(y.cpu(), want)


def test_grouped_allgather():
    r, n = world()
    xs = [torch.full((r + 1, k + 1), float(r), device=dev()) for k in range(3)]
    ys = hvd.grouped_allgather(xs)
    for k, y in enumerate(ys):
        want = torch.cat([torch.full((q + 1, k + 1), float(q)) for q in range(n)])
        assert torch.equal(y.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.uint8], ids=str)
def test_broadcast(dtype):
    r, n = world()
    for root in range(n):
        x = make((7, 3), r, dtype, "small").to(dev())
        y = hvd.broadcast(x, root_rank=root)
        assert torch.equal(y.cpu(), make((7, 3), root, dtype, "small"))
        z = make((7, 3), r, dtype, "small").to(dev())
        hvd.broadcast_(z, root_rank=root)
        assert torch.equal(z.cpu(), make((7, 3), root, dtype, "small"))


def test_alltoall_uneven_splits():
    r, n = world()
    splits = [(r + j) % 3 for j in range(n)]
    rows = sum(splits)
    x = torch.arange(rows * 2, dtype=torch.float32, device=dev()).reshape(rows, 2) + 100 * r
    y, received = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))
    want = []
    for q in range(n):
        q_splits = [(q + j) % 3 for j in range(n)]
        start = sum(q_splits[:r])
        base = torch.arange(sum(q_splits) * 2, dtype=torch.float32).reshape(-1, 2) + 100 * q
        want.append(base[start:start + q_splits[r]])
    assert torch.equal(y.cpu(), torch.cat(want))
    assert received.tolist() == [(q + r) % 3 for q in range(n)]


@pytest.mark.parametrize("op_name", ["sum", "average", "max"])
def test_reducescatter(op_name):
    r, n = world()
    rows = 2 * n + 1
    x = make((rows, 3), r, torch.float32, kind_of(op_name)).to(dev())
    y = hvd.reducescatter(x, op=OPS[op_name])
    full = expected_allreduce((rows, 3), torch.float32, op_name)
    sizes = [rows // n + (1 if q < rows % n else 0) for q in range(n)]
    start = sum(sizes[:r])
    assert torch.equal(y.cpu(), full[start:start + sizes[r]])


def test_distributed_optimizer_on_cuda():
    """A CUDA model trained by DistributedOptimizer ends where a CPU run on the global batch
    ends (float64 throughout)."""
    r, n = world()
    reference = train_reference("sgd", 1)
    model = make_model(seed=1 + r)
    if r == 0:
        model.load_state_dict(make_model().state_dict())
    model = model.to(dev())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                   named_parameters=model.named_parameters())
    for step in range(STEPS):
        opt.zero_grad()
        x, y = global_batch(step, 0, n)
        shard = slice(r * BATCH, (r + 1) * BATCH)
        torch.nn.functional.mse_loss(model(x[shard].to(dev())), y[shard].to(dev())).backward()
        opt.step()
    assert_same_params(model.cpu(), reference)


def test_sync_batch_norm_on_cuda():
    """SyncBatchNorm in training on CUDA inputs: the statistics of every rank's batch, as
    torch's BatchNorm computes them on the whole global batch (float64 on the CPU)."""
    r, n = world()
    torch.manual_seed(7)
    full = torch.randn(4 * n, 3, 5, dtype=torch.float64)
    bn = hvd.SyncBatchNorm(3).to(dev()).double()
    y = bn(full[4 * r:4 * (r + 1)].to(dev()))
    ref = torch.nn.BatchNorm1d(3).double()
    want = ref(full)[4 * r:4 * (r + 1)]
    assert torch.allclose(y.cpu(), want.detach(), atol=1e-10)
    assert torch.allclose(bn.running_mean.cpu(), ref.running_mean, atol=1e-12)
    assert torch.allclose(bn.running_var.cpu(), ref.running_var, atol=1e-12)


def test_broadcast_optimizer_state_creates_missing_state_where_the_root_has_it():
    """Only rank 0 has Adam state (moments on its GPU, the step on the CPU): the others create
    theirs on their own GPU and the CPU likewise, and end with rank 0's values."""
    r, n = world()
    model = torch.nn.Linear(4, 3).to(dev())
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    if r == 0:
        model(torch.ones(2, 4, device=dev())).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for i, p in enumerate(model.parameters()):
        state = opt.state[p]
        assert state["exp_avg"].device == p.device
        want = hvd.broadcast(state["exp_avg"], root_rank=0, name="adam_check.%d" % i)
        assert torch.equal(state["exp_avg"], want)
        if torch.is_tensor(state["step"]):
            assert state["step"].device.type in ("cpu", "cuda")
            assert float(state["step"]) == 1.0



def test_alltoall_received_splits_on_the_device_of_the_splits():
    """As Horovod's (splits.new()): splits given on the GPU come back on it, so that they mix
    with the caller's other device tensors."""
    r, n = world()
    x = torch.arange(2 * n, dtype=torch.float32, device=dev()).view(2 * n, 1) + 100 * r
    splits = torch.full((n,), 2, dtype=torch.int32, device=dev())
    y, received = hvd.alltoall(x, splits)
    assert received.device == splits.device
    assert received.tolist() == [2] * n
    src = torch.repeat_interleave(torch.arange(n, device=dev()), received)
    assert torch.equal(y.view(-1).cpu(), (torch.arange(n).repeat_interleave(2) * 100
                                          + torch.tensor([2 * r, 2 * r + 1] * n)).float())
    assert src.device == y.device


def test_a_group_of_host_and_device_tensors_is_refused():
    """As Horovod's test_horovod_grouped_allreduce_cpu_gpu_error: a group whose tensors lie on
    the CPU and a GPU raises a RuntimeError (InvalidArgumentError) before anything is submitted,
    so no other rank waits for it and the unnamed numbering stays the same on every rank."""
    r, n = world()
    host = torch.full((5,), r + 1.0)
    device = torch.full((7,), 2.0 * (r + 1), device=dev())
    for call in (lambda: hvd.grouped_allreduce([host, device], op=hvd.Sum),
                 lambda: hvd.grouped_allreduce_([host, device], op=hvd.Sum),
                 lambda: hvd.grouped_allgather([device, host]),
                 lambda: hvd.grouped_reducescatter([host.view(5, 1), device.view(7, 1)])):
        with pytest.raises(RuntimeError, match="one device.*cpu.*cuda|one device.*cuda.*cpu"):
            call()
    # The next unnamed group meets on every rank.
    out = hvd.grouped_allreduce([device, device * 2], op=hvd.Sum)
    assert torch.equal(out[1].cpu(), torch.full((7,), 2.0 * n * (n + 1)))


def test_join_naming_the_device_before_any_device_tensor():
    """Horovod's join(device): the last rank joins before it has used its GPU; the others'
    device allreduces get zeros from it."""
    r, n = world()
    if r == n - 1:
        assert 0 <= hvd.join(hvd.local_rank() % torch.cuda.device_count()) < n
        return
    for step in range(3):
        x = torch.full((1001,), r + 1.0, device=dev())
        y = hvd.allreduce(x, op=hvd.Sum, name="join_first.%d" % step)
        assert torch.equal(y.cpu(), torch.full((1001,), (n - 1) * n / 2.0))
    assert 0 <= hvd.join() < n


def _adasum_tree(vectors):
    """Adasum's formula in float64 over the vectors in order: pairs, then pairs of pairs."""
    while len(vectors) > 1:
        nxt = []
        for a, b in zip(vectors[0::2], vectors[1::2]):
            dot, aa, bb = float((a * b).sum()), float((a * a).sum()), float((b * b).sum())
            ca = 1 - dot / (2 * aa) if aa > 0 else 1.0
            cb = 1 - dot / (2 * bb) if bb > 0 else 1.0
            nxt.append(ca * a + cb * b)
        vectors = nxt
    return vectors[0]


def test_adasum_on_cuda_is_horovods():
    """On NCCL (every rank a GPU of its own) Adasum of CUDA tensors is Horovod's NCCL build's:
    a sum inside each host, Adasum across hosts, divided by the ranks per host (on one host the
    ranks' average); staged (ranks sharing a GPU, or HVD_GPU_OPERATIONS=cpu), the flat Adasum
    over the ranks. Hosts are blocks of consecutive ranks, as hvdrun places them."""
    r, n = world()
    x = torch.sin(torch.arange(1.0, 40.0, dtype=torch.float64) * (r + 1)) * (r % 3 + 1)
    ranks = [torch.sin(torch.arange(1.0, 40.0, dtype=torch.float64) * (q + 1)) * (q % 3 + 1)
             for q in range(n)]
    per_host, hosts = hvd.local_size(), hvd.cross_size()
    ops = os.environ.get("HVD_GPU_OPERATIONS", os.environ.get("HOROVOD_GPU_OPERATIONS", "nccl"))
    nccl = (torch.cuda.device_count() >= per_host and hvd.nccl_built() and
            ops.lower() == "nccl")
    # Hosts of equal size on every rank, as the engine's gathered layout needs.
    uniform = set(hvd.allgather_object((per_host, hosts), name="cuda.adasum.layout")) == \
        {(per_host, hosts)} and per_host * hosts == n
    by_hosts = nccl and per_host > 1 and uniform
    if (hosts if by_hosts else n) & ((hosts if by_hosts else n) - 1):
        with pytest.raises(hvd.InvalidArgumentError, match="power of two"):
            hvd.allreduce(x.to(dev()), op=hvd.Adasum, name="cuda.adasum.refused")
        return
    if by_hosts:
        sums = [sum(ranks[h * per_host:(h + 1) * per_host]) for h in range(hosts)]
        want = _adasum_tree(sums) / per_host
    else:
        want = _adasum_tree(ranks)
    got = hvd.allreduce(x.to(dev()), op=hvd.Adasum, name="cuda.adasum")
    assert got.device == dev()
    assert torch.allclose(got.cpu(), want, atol=1e-9), (got, want)
