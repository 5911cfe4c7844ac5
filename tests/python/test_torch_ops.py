"""hvd.torch collectives: every dtype, several shapes, every op, in place and not, async,
fused, grouped; mismatch errors across ranks."""

import numpy as np
import pytest
import torch

import hvd.torch as hvd
from conftest import pattern, world

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
NUMERIC = [d for d in DTYPES if d != torch.bool]
SHAPES = [(), (0,), (1,), (5,), (3, 4), (2, 3, 4), (17, 1, 3, 2)]
OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
       "product": hvd.Product}


def in_threads(fn, count, timeout=None):
    """Runs fn in `count` threads at once and waits for them (each up to `timeout` s)."""
    import threading
    threads = [threading.Thread(target=fn) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def make(shape, r, dtype, kind):
    if dtype == torch.bool:
        kind = "bool"
    return torch.from_numpy(pattern(shape, r, kind)).to(dtype)


def expected_allreduce(shape, dtype, op_name):
    """float64 reference from every rank's input."""
    _, n = world()
    kind = {"product": "prod", "average": "avg"}.get(op_name, "small")
    inputs = [make(shape, q, dtype, kind).to(torch.float64).numpy() for q in range(n)]
    stack = np.stack(inputs)
    if dtype == torch.bool:
        result = {"sum": stack.max(0), "max": stack.max(0), "min": stack.min(0),
                  "product": stack.min(0)}[op_name]
    else:
        result = {"sum": stack.sum(0), "average": stack.sum(0) / n, "min": stack.min(0),
                  "max": stack.max(0), "product": stack.prod(0)}[op_name]
    return torch.from_numpy(np.asarray(result, dtype=np.float64)).to(dtype)


def kind_of(op_name):
    return {"product": "prod", "average": "avg"}.get(op_name, "small")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op_name", list(OPS))
def test_allreduce(dtype, shape, op_name):
    r, _ = world()
    x = make(shape, r, dtype, kind_of(op_name))
    before = x.clone()
    if dtype == torch.bool and op_name == "average":
        with pytest.raises(hvd.InvalidArgumentError, match="average"):
            hvd.allreduce(x, op=OPS[op_name])
        return
    y = hvd.allreduce(x, op=OPS[op_name])
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, expected_allreduce(shape, dtype, op_name))
    assert torch.equal(x, before), "allreduce must not modify its input"


@pytest.mark.parametrize("dtype", NUMERIC, ids=str)
@pytest.mark.parametrize("shape", [(), (7,), (3, 5)], ids=str)
@pytest.mark.parametrize("op_name", ["sum", "max", "average"])
def test_allreduce_in_place(dtype, shape, op_name):
    r, _ = world()
    x = make(shape, r, dtype, kind_of(op_name))
    out = hvd.allreduce_(x, op=OPS[op_name])
    assert out is x
    assert torch.equal(x, expected_allreduce(shape, dtype, op_name))


def test_allreduce_default_op_is_average():
    r, n = world()
    x = torch.full((4,), float(r), dtype=torch.float64)
    assert torch.allclose(hvd.allreduce(x), torch.full((4,), (n - 1) / 2, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64],
                         ids=str)
def test_allreduce_scale_factors(dtype):
    r, n = world()
    x = torch.full((6,), float(r + 1), dtype=dtype)
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
    assert torch.equal(y, torch.full((6,), 2.0 * n * (n + 1) / 2, dtype=dtype))


def test_allreduce_non_contiguous():
    r, n = world()
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
    x = base.t()
    assert not x.is_contiguous()
    want = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * n + n * (n - 1) / 2).t()
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum), want)
    hvd.allreduce_(x, op=hvd.Sum)
    assert torch.equal(x, want)
    assert torch.equal(base, want.t()), "in place on a view writes through to its base"


def test_allreduce_fp16_compression():
    r, n = world()
    x = torch.full((10,), float(r), dtype=torch.float32)
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert y.dtype == torch.float32
    assert torch.equal(y, torch.full((10,), n * (n - 1) / 2))


def test_reducescatter_fp16_compression():
    """compression= as horovod.torch's reducescatter takes it (third, after name): 1 + 2**-12
    is 1 in float16, so a sum that travelled compressed is exactly the number of ranks; the part
    comes back as float32."""
    r, n = world()
    x = torch.full((2 * n, 3), 1 + 2.0 ** -12, dtype=torch.float32)
    y = hvd.reducescatter(x, "rs.fp16", hvd.Compression.fp16, hvd.Sum)
    assert y.dtype == torch.float32
    assert torch.equal(y, torch.full((2, 3), float(n)))
    ys = hvd.grouped_reducescatter([x, x[:n]], compression=hvd.Compression.fp16, op=hvd.Sum)
    assert [t.dtype for t in ys] == [torch.float32, torch.float32]
    assert torch.equal(ys[0], torch.full((2, 3), float(n)))
    assert torch.equal(ys[1], torch.full((1, 3), float(n)))
    plain = hvd.reducescatter(x, op=hvd.Sum)
    assert torch.equal(plain, torch.full((2, 3), n * (1 + 2.0 ** -12)))
    with pytest.raises(TypeError, match="the third argument is the compression"):
        hvd.reducescatter(x, "rs.op3", hvd.Sum)


def test_deprecated_average_flag():
    r, n = world()
    x = torch.ones(3)
    with pytest.warns(DeprecationWarning):
        y = hvd.allreduce(x, average=False)
    assert torch.equal(y, torch.full((3,), float(n)))


def test_many_async_in_flight_fuse():
    r, n = world()
    tensors = [torch.full((i % 7 + 1, 3), float(i + r)) for i in range(64)]
    handles = [hvd.allreduce_async(t, op=hvd.Sum) for t in tensors]
    named = [hvd.allreduce_async_(torch.full((5,), float(r)), name="inflight.%d" % i,
                                  op=hvd.Max) for i in range(16)]
    while not all(hvd.poll(h) for h in handles + named):
        pass
    for i, h in enumerate(handles):
        assert torch.equal(hvd.synchronize(h), torch.full((i % 7 + 1, 3), float(n * i + n * (n - 1) / 2)))
    for h in named:
        assert torch.equal(hvd.synchronize(h), torch.full((5,), float(n - 1)))
    assert torch.equal(hvd.synchronize(handles[0]), torch.full((1, 3), n * (n - 1) / 2))


def test_same_name_reused_sequentially():
    _, n = world()
    for i in range(5):
        y = hvd.allreduce(torch.full((2,), float(i)), name="reused", op=hvd.Sum)
        assert torch.equal(y, torch.full((2,), float(i * n)))


def test_grouped_allreduce():
    r, n = world()
    xs = [torch.full((i + 1,), float(r + i)) for i in range(5)] + [torch.ones(2, dtype=torch.int64)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    assert len(ys) == 6
    for i in range(5):
        assert torch.equal(ys[i], torch.full((i + 1,), float(n * i + n * (n - 1) / 2)))
    assert torch.equal(ys[5], torch.full((2,), n, dtype=torch.int64))
    hvd.grouped_allreduce_(xs, op=hvd.Sum)
    for x, y in zip(xs, ys):
        assert torch.equal(x, y)
    h = hvd.grouped_allreduce_async([torch.ones(3)], op=hvd.Average)
    assert torch.equal(hvd.synchronize(h)[0], torch.ones(3))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rest", [(), (3,), (2, 2)], ids=str)
def test_allgather(dtype, rest):
    r, n = world()
    x = make((r + 1,) + rest, r, dtype, "small")
    y = hvd.allgather(x)
    want = torch.cat([make((q + 1,) + rest, q, dtype, "small") for q in range(n)])
    assert y.dtype == dtype and torch.equal(y, want)


def test_allgather_empty_and_async():
    r, n = world()
    x = torch.ones(r % 2, 3)
    y = hvd.synchronize(hvd.allgather_async(x))
    rows = sum(q % 2 for q in range(n))
    assert y.shape == (rows, 3)


def test_grouped_allgather():
    r, n = world()
    ys = hvd.grouped_allgather([torch.full((1,), r), torch.full((r + 1, 2), float(r))])
    assert torch.equal(ys[0], torch.arange(n))
    assert torch.equal(ys[1], torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)]))


def test_handle_waited_by_two_threads_at_once():
    # "Waiting again returns the same result", also from two threads at once: the result of a
    # gather is built from the core's parts once, which the first thread to finish used to
    # clear under the other (an IndexError, or a grouped result of []).
    r, n = world()
    want = torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)])
    for it in range(40):
        single = hvd.allgather_async(torch.full((r + 1, 2), float(r)), name="twice.%d" % it)
        group = hvd.grouped_allgather_async([torch.full((1,), r), torch.full((r + 1, 2), float(r))],
                                            name="twice.g.%d" % it)
        got = []

        def wait():
            try:
                got.append((hvd.synchronize(single), hvd.synchronize(group)))
            except Exception as e:  # noqa: BLE001 (reported below)
                got.append(e)

        in_threads(wait, 2)
        for g in got:
            assert not isinstance(g, Exception), "iteration %d: %r" % (it, g)
            one, pair = g
            assert torch.equal(one, want)
            assert len(pair) == 2 and torch.equal(pair[0], torch.arange(n))
            assert torch.equal(pair[1], want)


def test_device_result_orders_every_waiters_stream():
    # A device result waited for again (by another thread, or later): each waiter's current
    # stream waits for the device work, not only the first waiter's. Fake core parts and
    # streams: the Python handle's logic alone.
    from hvd import _ops

    class Part:
        def __init__(self):
            self.streams = []

        def wait(self):
            pass

        def poll(self):
            return True

        def stream_wait(self, stream):
            self.streams.append(stream)

    part = Part()
    current = ["stream-a"]
    h = _ops.Handle([part], lambda parts: "result", stream=lambda: current[0])
    assert h.wait() == "result"
    current[0] = "stream-b"
    assert h.wait() == "result"
    assert part.streams == ["stream-a", "stream-b"]


def test_poll_loop_finishes():
    # Horovod's `while not hvd.poll(h)`: a pending poll yields the core, so the loop leaves the
    # engine its time (it used to hold it: milliseconds per tiny allreduce). Values only here;
    # the time is in README.
    r, n = world()
    for it in range(200):
        h = hvd.allreduce_async(torch.full((3,), float(r)), op=hvd.Sum, name="pollloop.%d" % it)
        while not hvd.poll(h):
            pass
        assert torch.equal(hvd.synchronize(h), torch.full((3,), float(n * (n - 1) // 2)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (4,), (2, 3)], ids=str)
def test_broadcast(dtype, shape):
    r, n = world()
    for root in range(n):
        x = make(shape, r, dtype, "small")
        before = x.clone()
        y = hvd.broadcast(x, root_rank=root)
        assert torch.equal(y, make(shape, root, dtype, "small"))
        assert torch.equal(x, before)
        hvd.broadcast_(x, root_rank=root)
        assert torch.equal(x, make(shape, root, dtype, "small"))
    h = hvd.broadcast_async(torch.full((2,), r), root_rank=n - 1)
    assert torch.equal(hvd.synchronize(h), torch.full((2,), n - 1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_alltoall_equal_splits(dtype):
    r, n = world()
    # Row k of rank r's input goes to rank k // 2 and holds r*100 + k (mod 2 for bool).
    x = torch.arange(2 * n, dtype=torch.float64).reshape(2 * n, 1).repeat(1, 3) + 100 * r
    conv = (lambda t: (t % 2).to(dtype)) if dtype == torch.bool else (lambda t: (t % 120).to(dtype))
    y = hvd.alltoall(conv(x))
    want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float64).reshape(2, 1).repeat(1, 3)
                      + 100 * q for q in range(n)])
    assert torch.equal(y, conv(want))


def test_alltoall_splits_short_of_the_first_dimension():
    """As in Horovod, splits may sum to less than the first dimension: the rows after them
    stay behind. Rank r's row k holds 10 r + k; it sends row j to rank j and keeps 2 rows."""
    r, n = world()
    x = torch.arange(n + 2, dtype=torch.float32) + 10 * r
    y, received = hvd.alltoall(x, splits=[1] * n, name="a2a.short")
    assert torch.equal(y, torch.tensor([10.0 * q + r for q in range(n)]))
    assert received.tolist() == [1] * n
    # The gradient of the rows not sent is zero.
    xg = x.clone().requires_grad_()
    yg, _ = hvd.alltoall(xg, splits=[1] * n, name="a2a.short.grad")
    (yg * torch.arange(1.0, n + 1)).sum().backward()
    # Row j went to rank j, where its weight was r + 1 (r = this rank).
    assert torch.equal(xg.grad, torch.tensor([float(r + 1)] * n + [0.0, 0.0]))
    with pytest.raises(ValueError, match="at most the first dimension"):
        hvd.alltoall(x, splits=[n + 3] + [0] * (n - 1), name="a2a.long")
    hvd.barrier()  # refused at the call: meet before the next test


def test_alltoall_uneven_splits():
    r, n = world()
    splits = [(r + j) % 3 for j in range(n)]
    rows = []
    for j in range(n):
        rows += [[r, j, k] for k in range(splits[j])]
    x = torch.tensor(rows, dtype=torch.int32).reshape(-1, 3)
    y, received = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))
    want_rows = []
    for q in range(n):
        want_rows += [[q, r, k] for k in range((q + r) % 3)]
    assert torch.equal(y, torch.tensor(want_rows, dtype=torch.int32).reshape(-1, 3))
    assert torch.equal(received, torch.tensor([(q + r) % 3 for q in range(n)], dtype=torch.int32))
    out, recv = hvd.synchronize(hvd.alltoall_async(x, splits=splits))
    assert torch.equal(out, y) and recv.tolist() == received.tolist()
    # NumPy's integers, as Horovod takes them (torch.tensor(splits, dtype=int32)).
    for given in (np.array(splits, dtype=np.int64), [np.int32(s) for s in splits],
                  tuple(splits)):
        out, recv = hvd.alltoall(x, splits=given)
        assert torch.equal(out, y) and recv.tolist() == received.tolist()


@pytest.mark.parametrize("dtype", NUMERIC, ids=str)
@pytest.mark.parametrize("op_name", ["sum", "max", "average"])
def test_reducescatter(dtype, op_name):
    r, n = world()
    rows = 2 * n + 1
    x = make((rows, 2), r, dtype, kind_of(op_name))
    y = hvd.reducescatter(x, op=OPS[op_name])
    full = expected_allreduce((rows, 2), dtype, op_name)
    start = sum(rows // n + (q < rows % n) for q in range(r))
    mine = rows // n + (r < rows % n)
    assert torch.equal(y, full[start:start + mine])


def test_grouped_reducescatter_and_async():
    r, n = world()
    ys = hvd.grouped_reducescatter([torch.ones(n, 2), torch.full((2 * n,), float(r))], op=hvd.Sum)
    assert torch.equal(ys[0], torch.full((1, 2), float(n)))
    assert torch.equal(ys[1], torch.full((2,), n * (n - 1) / 2))
    y = hvd.synchronize(hvd.reducescatter_async(torch.ones(n, 3)))
    assert torch.equal(y, torch.ones(1, 3))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_unsupported_dtype_is_a_clear_error(dtype):
    # Horovod raises ValueError; hvd's TypeError is kept for its own scripts.
    for kind in (TypeError, ValueError):
        with pytest.raises(kind, match="does not support"):
            hvd.allreduce(torch.zeros(3, dtype=dtype))


def test_sparse_and_other_device_tensors_are_clear_errors():
    with pytest.raises(TypeError, match="dense tensors only"):
        hvd.allreduce(torch.zeros(4).to_sparse(), name="sparse")
    with pytest.raises(TypeError, match="CPU and CUDA tensors; got a tensor on meta"):
        hvd.allreduce(torch.empty(4, device="meta"), name="meta")
    # The engine goes on: nothing of either reached it.
    assert torch.equal(hvd.allreduce(torch.ones(2), name="after", op=hvd.Sum),
                       torch.full((2,), float(hvd.size())))


def test_exception_classes():
    assert issubclass(hvd.HvdError, RuntimeError)
    assert issubclass(hvd.InvalidArgumentError, ValueError)  # as Horovod's bad arguments
    assert issubclass(hvd.FailedPreconditionError, ValueError)  # and its calls before init
    assert hvd.HorovodInternalError is hvd.HvdError
    for cls in (hvd.InvalidArgumentError, hvd.PeerLostError, hvd.AbortedError,
                hvd.HvdTimeoutError, hvd.FailedPreconditionError, hvd.InternalError):
        assert issubclass(cls, hvd.HvdError)


def test_mismatched_shape_fails_everywhere_then_next_op_works():
    r, n = world()
    x = torch.zeros(3 + (r if n > 1 else 1))
    if n > 1:
        with pytest.raises(hvd.HvdError, match="mismatch.shape"):
            hvd.allreduce(x, name="mismatch.shape")
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))


def test_mismatched_dtype_fails_then_next_op_works():
    r, n = world()
    x = torch.zeros(3, dtype=torch.float32 if r % 2 == 0 else torch.float64)
    if n > 1:
        with pytest.raises(hvd.HvdError, match="mismatch.dtype"):
            hvd.allreduce(x, name="mismatch.dtype")
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))


def test_mismatched_root_fails_then_next_op_works():
    r, n = world()
    if n > 1:
        with pytest.raises(hvd.HvdError, match="mismatch.root"):
            hvd.broadcast(torch.zeros(3), root_rank=r, name="mismatch.root")
    assert torch.equal(hvd.broadcast(torch.full((2,), float(r)), root_rank=0), torch.zeros(2))


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reducescatter"])
def test_grouped_op_with_one_mismatching_member_fails_whole(kind):
    """One member differs on one rank: every member fails on every rank, naming that member,
    and nothing waits; the next operation works."""
    r, n = world()
    if n == 1:
        return
    odd = r == n - 1
    xs = [torch.ones(2 * n, 2), torch.ones(2 * n, 3 if odd else 2), torch.ones(2 * n, 2)]
    name = "grouped.mismatch." + kind
    run = {"allreduce": lambda: hvd.grouped_allreduce(xs, name=name, op=hvd.Sum),
           "allgather": lambda: hvd.grouped_allgather(xs, name=name),
           "reducescatter": lambda: hvd.grouped_reducescatter(xs, name=name, op=hvd.Sum)}[kind]
    with pytest.raises(hvd.InvalidArgumentError) as err:
        run()
    message = str(err.value)
    assert name + ".1" in message and "shape" in message and "failed as a whole" in message
    handles = hvd.grouped_allreduce_async([torch.ones(3), torch.ones(1)], op=hvd.Sum)
    ys = hvd.synchronize(handles)
    assert torch.equal(ys[0], torch.full((3,), float(n)))


def test_grouped_ops_of_different_sizes_fail_whole():
    """Rank 0 groups two tensors where the others pass one: every rank fails at once, saying
    the group membership differs, and the next operation works (it waited forever before)."""
    r, n = world()
    if n == 1:
        return
    xs = [torch.ones(2), torch.ones(3)] if r == 0 else [torch.ones(2)]
    with pytest.raises(hvd.InvalidArgumentError, match="group membership"):
        hvd.grouped_allreduce(xs, name="grouped.sizes", op=hvd.Sum)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="grouped.sizes.after").item() == n
    # The same group name, every rank with both tensors now: the second tensor, left out of the
    # failed step by the others, is this step's on every rank.
    ys = hvd.grouped_allreduce([torch.ones(2), torch.full((3,), float(r))], name="grouped.sizes",
                               op=hvd.Sum)
    assert torch.equal(ys[0], torch.full((2,), float(n)))
    assert torch.equal(ys[1], torch.full((3,), float(n * (n - 1) // 2)))


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "broadcast", "reducescatter"])
def test_a_name_in_flight_raises_value_error_at_enqueue(kind):
    """As Horovod: submitting a name that is still in flight on this rank raises ValueError at
    the call, and the first operation goes on."""
    r, n = world()
    if n == 1:
        return
    name = "dup." + kind
    x = torch.ones(n, 2)
    submit = {"allreduce": lambda: hvd.allreduce_async(x, name=name, op=hvd.Sum),
              "allgather": lambda: hvd.allgather_async(x, name=name),
              "broadcast": lambda: hvd.broadcast_async(x, root_rank=0, name=name),
              "reducescatter": lambda: hvd.reducescatter_async(x, name=name, op=hvd.Sum)}[kind]
    handle = None
    if r == 0:
        handle = submit()  # the others have not submitted it: it stays in flight
        with pytest.raises(ValueError, match="in flight"):
            submit()
    hvd.barrier()
    if r != 0:
        handle = submit()
    out = hvd.synchronize(handle)
    expected = {"allreduce": (n, 2), "allgather": (n * n, 2), "broadcast": (n, 2),
                "reducescatter": (1, 2)}[kind]
    assert tuple(out.shape) == expected


def test_mismatched_allgather_trailing_dims_fail():
    r, n = world()
    if n > 1:
        with pytest.raises(hvd.HvdError):
            hvd.allgather(torch.zeros(2, 2 + r), name="mismatch.allgather")
    assert hvd.allgather(torch.zeros(1, 2)).shape == (n, 2)


def test_bad_root_rank_is_invalid_argument():
    _, n = world()
    with pytest.raises(hvd.InvalidArgumentError, match="root"):
        hvd.broadcast(torch.zeros(1), root_rank=n)


def test_what_one_rank_alone_cannot_pass_fails_on_every_rank():
    """Arguments the binding refuses on the last rank alone (splits that are not int32, a tensor
    of a dtype hvd lacks, an object that cannot be pickled, a scale factor given as text, a root
    that is not an integer): that rank raises, and every other rank's operation fails with its
    reason, naming it, instead of waiting for it; the same name then works again (a group's
    too)."""
    import threading
    import time
    r, n = world()
    bad = r == n - 1
    who = "on rank %d" % (n - 1)
    started = time.monotonic()

    def expect(call, local_error, text, again=None):
        with pytest.raises(local_error if bad else hvd.InvalidArgumentError) as got:
            call()
        if not bad:
            assert who in str(got.value) and text in str(got.value), got.value
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="one.next").item() == n
        if again is not None:
            again()

    expect(lambda: hvd.alltoall(torch.ones(n, 2), splits=torch.ones(n, dtype=torch.int64 if bad
                                                                     else torch.int32),
                                name="one.splits"),
           ValueError, "int32")
    expect(lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64 if bad else torch.float32),
                                 name="one.dtype"),
           TypeError, "complex64",
           again=lambda: torch.testing.assert_close(
               hvd.allreduce(torch.ones(2), op=hvd.Sum, name="one.dtype"), torch.full((2,), n * 1.0)))
    expect(lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(2, dtype=torch.complex64 if bad
                                                                     else torch.float32)],
                                         name="one.group"),
           TypeError, "complex64",
           again=lambda: [torch.testing.assert_close(t, torch.full((2,), n * 1.0)) for t in
                          hvd.grouped_allreduce([torch.ones(2), torch.ones(2)], op=hvd.Sum,
                                                name="one.group")])
    expect(lambda: hvd.broadcast_object(threading.Lock() if bad else None, root_rank=n - 1),
           TypeError, "pickle")
    expect(lambda: hvd.allreduce(torch.ones(2), prescale_factor="2" if bad else 2.0,
                                 name="one.factor"),
           TypeError, "prescale_factor must be a number")
    expect(lambda: hvd.broadcast(torch.ones(2), root_rank=0.5 if bad else 0, name="one.root"),
           TypeError, "root_rank must be an integer")
    # An op that is none, and op with the deprecated average: plain, async, grouped and
    # reducescatter.
    expect(lambda: hvd.allreduce(torch.ones(2), op=42 if bad else hvd.Sum, name="one.op"),
           ValueError, "unknown reduce op 42; use hvd.Sum, hvd.Average, hvd.Adasum")
    expect(lambda: hvd.synchronize(hvd.allreduce_async(torch.ones(2), op="sum" if bad else hvd.Sum,
                                                       name="one.op.async")),
           ValueError, "unknown reduce op 'sum'")
    expect(lambda: hvd.grouped_allreduce([torch.ones(2)] * 2, op=-1 if bad else hvd.Sum,
                                         name="one.op.group"),
           ValueError, "unknown reduce op -1")
    expect(lambda: hvd.reducescatter(torch.ones(n), op=7 if bad else hvd.Sum, name="one.op.rs"),
           ValueError, "unknown reduce op 7")
    expect(lambda: hvd.reducescatter(torch.ones(n), prescale_factor="2" if bad else 2.0,
                                     name="one.rs.factor"),
           TypeError, "prescale_factor must be a number")
    expect(lambda: hvd.grouped_reducescatter([torch.ones(n)] * 2,
                                             postscale_factor="2" if bad else 2.0,
                                             name="one.grs.factor"),
           TypeError, "postscale_factor must be a number")
    expect(lambda: hvd.allreduce(torch.ones(2), average=True if bad else None, op=hvd.Sum,
                                 name="one.average"),
           ValueError, "pass either op or the deprecated average, not both")
    assert time.monotonic() - started < 30


def test_a_refusal_while_a_rank_has_joined_fails_at_once_and_frees_its_name():
    """Rank 0 has joined; the last rank refuses a broadcast's root (a float), the others'
    broadcasts are refused while a rank has joined. The refusal is typed as a broadcast, so it
    too fails at once instead of waiting for ranks whose broadcast already failed: the refusing
    rank raises its own error, and the name is free for the next try."""
    r, n = world()
    if n < 2:
        return
    if r == 0:
        hvd.join()
        return
    bad = r == n - 1
    with pytest.raises(TypeError if bad else hvd.HvdError):
        hvd.broadcast(torch.ones(2), root_rank=0.5 if bad else 1, name="joined.root")
    with pytest.raises(hvd.HvdError) as again:
        hvd.broadcast(torch.ones(2), root_rank=1, name="joined.root")
    assert "in flight" not in str(again.value) and "Join" in str(again.value), again.value
    hvd.join()


def test_synchronize_and_poll_say_what_they_take():
    for call in (hvd.synchronize, hvd.poll):
        with pytest.raises(TypeError, match="takes the handle an \\*_async call returned"):
            call(12345)


def test_a_scale_factor_that_is_not_finite_is_refused():
    for factor in (float("nan"), float("inf")):
        with pytest.raises(hvd.InvalidArgumentError, match="must be finite numbers"):
            hvd.allreduce(torch.ones(3), prescale_factor=factor, name="nonfinite")
        with pytest.raises(hvd.InvalidArgumentError, match="must be finite numbers"):
            hvd.reducescatter(torch.ones(4), postscale_factor=factor, name="nonfinite.rs")


def test_barrier():
    for _ in range(3):
        hvd.barrier()


def _horovod_scaled(values, dtype, pre, post):
    """Horovod's scaling, element for element: each rank's input times prescale, the sum over
    ranks, times postscale. Integers in float64, truncated toward zero as the cast back does;
    float32 in float32 with the factor rounded to float32; float16 in float32, rounded to half
    after each step; float64 in float64."""
    np_dtype = {torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
                torch.uint8: np.uint8, torch.float16: np.float16, torch.float32: np.float32,
                torch.float64: np.float64}[dtype]
    if not dtype.is_floating_point:
        scaled = [np.trunc(v.astype(np.float64) * pre).astype(np_dtype) for v in values]
        total = np.sum(np.stack(scaled).astype(np.int64), axis=0)
        return np.trunc(total.astype(np.float64) * post).astype(np_dtype)
    if dtype == torch.float64:
        return np.sum(np.stack([v * pre for v in values]), axis=0) * post
    f = np.float32
    scaled = [(v.astype(f) * f(pre)).astype(np_dtype) for v in values]
    total = np.sum(np.stack(scaled).astype(f), axis=0).astype(np_dtype)  # exact for these values
    return (total.astype(f) * f(post)).astype(np_dtype)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.int64,
                                   torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("op_name", ["sum", "average"])
@pytest.mark.parametrize("kind", ["allreduce", "reducescatter", "grouped_reducescatter"])
def test_scaling_matches_horovod_element_for_element(dtype, op_name, kind):
    r, n = world()
    pre, post = 0.5, 0.3
    rows = 2 * n

    def input_of(q):
        base = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) % 7 + 3 + q
        return base.astype({torch.uint8: np.uint8, torch.int16: np.int16,
                            torch.int32: np.int32, torch.int64: np.int64,
                            torch.float16: np.float16, torch.float32: np.float32,
                            torch.float64: np.float64}[dtype])

    post_eff = post / n if op_name == "average" else post
    want = torch.from_numpy(np.ascontiguousarray(
        _horovod_scaled([input_of(q) for q in range(n)], dtype, pre, post_eff)))
    x = torch.from_numpy(input_of(r))
    op = hvd.Average if op_name == "average" else hvd.Sum
    if kind == "allreduce":
        got = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
    elif kind == "reducescatter":
        got = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
        want = want[2 * r:2 * r + 2]
    else:
        got = hvd.grouped_reducescatter([x, x + 0], op=op, prescale_factor=pre,
                                        postscale_factor=post)[1]
        want = want[2 * r:2 * r + 2]
    assert got.dtype == dtype
    assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("splits", [torch.tensor([1.0]), torch.tensor([1], dtype=torch.int64),
                                    [1.5]], ids=["float32", "int64", "float list"])
def test_alltoall_splits_must_be_int32(splits):
    """As Horovod: splits that are not int32 raise at the call, catchable as ValueError."""
    _, n = world()
    with pytest.raises((torch.FatalError, ValueError)):
        hvd.alltoall(torch.ones(n, 2), splits=splits * n if isinstance(splits, list)
                     else splits.repeat(n))


def test_a_group_on_two_devices_is_refused_before_it_is_submitted():
    """Horovod's rule (test_horovod_grouped_allreduce_cpu_gpu_error): a group whose tensors lie
    on different devices raises a RuntimeError. The check itself needs no GPU: an adapter that
    says where each tensor lies stands in for torch's."""
    from hvd import _ops

    class TwoPlaces:
        @staticmethod
        def device(t):
            return t[0]

    _ops._one_device(TwoPlaces, "grouped_allreduce", [("cpu",), ("cpu",)])
    _ops._one_device(TwoPlaces, "grouped_allreduce", [("cuda:0",)])
    for cs, where in (([("cpu",), ("cuda:0",)], "tensor 0 is on cpu and tensor 1 on cuda:0"),
                      ([("cuda:0",), ("cuda:0",), ("cuda:1",)],
                       "tensor 0 is on cuda:0 and tensor 2 on cuda:1")):
        with pytest.raises(hvd.InvalidArgumentError, match=where) as e:
            _ops._one_device(TwoPlaces, "grouped_allgather", cs)
        assert isinstance(e.value, RuntimeError) and "grouped_allgather" in str(e.value)
    # Torch's adapter names CPU tensors "cpu"; a group of them passes and runs.
    r, n = world()
    out = hvd.grouped_allreduce([torch.full((3,), float(r)), torch.full((2,), 1.0)], op=hvd.Sum)
    assert out[0].tolist() == [n * (n - 1) / 2.0] * 3 and out[1].tolist() == [float(n)] * 2


def test_mpi_ops_holds_horovods_names():
    """Scripts import the ops and basics from horovod.torch.mpi_ops as well."""
    from hvd.torch import mpi_ops
    for name in ("Sum", "Average", "Adasum", "Min", "Max", "Product", "init", "shutdown",
                 "size", "rank", "local_rank", "local_size", "cross_rank", "cross_size",
                 "is_initialized", "nccl_built", "mpi_enabled", "ProcessSet",
                 "global_process_set", "add_process_set", "remove_process_set",
                 "allreduce", "allreduce_async_", "synchronize", "poll", "join"):
        assert getattr(mpi_ops, name) is getattr(hvd, name), name
    assert mpi_ops.size() == world()[1]


def test_calls_before_init_raise_valueerror_as_horovod():
    """A process that has not called init (a fresh interpreter: this one has)."""
    import subprocess
    import sys
    code = ("import hvd.torch as hvd\n"
            "for f in (hvd.rank, hvd.size, hvd.local_rank):\n"
            "    try:\n"
            "        f()\n"
            "    except ValueError as e:\n"
            "        assert 'init' in str(e), e\n"
            "    else:\n"
            "        raise SystemExit('no error from %s' % f.__name__)\n"
            "print('ok')\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith(("HVD_", "HOROVOD_", "OMPI_", "PMI_"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_horovods_module_paths():
    """horovod.torch.elastic.sampler, .state and horovod.common.* under hvd's names: a script
    that imports from them ports by renaming the package."""
    from hvd.common.elastic import ObjectState, State, run_fn  # noqa: F401
    from hvd.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
    from hvd.common.process_sets import ProcessSet, global_process_set
    from hvd.torch.elastic.sampler import ElasticSampler
    from hvd.torch.elastic.state import TorchState
    assert ElasticSampler is hvd.elastic.ElasticSampler
    assert TorchState is hvd.elastic.TorchState
    assert HorovodInternalError is hvd.HorovodInternalError
    assert HostsUpdatedInterrupt is hvd.HostsUpdatedInterrupt
    assert ProcessSet is hvd.ProcessSet and global_process_set is hvd.global_process_set


def test_init_from_several_threads_at_once_starts_one_engine():
    """hvd.init() is idempotent also when threads of one rank call it at the same time, as
    Horovod's: one engine starts, and each call returns once it has (a second engine for the same
    rank made the job see two processes claim it, and every rank failed)."""
    hvd.shutdown()
    errors = []

    def start():
        try:
            hvd.init()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    in_threads(start, 3, timeout=120)
    assert not errors, errors
    r, n = world()
    got = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Sum, name="after_concurrent_init")
    assert got.tolist() == [n * (n - 1) / 2] * 3


def test_an_idle_engine_sleeps():
    """Between operations the engine's thread sleeps: an idle second costs the process almost
    no CPU, in a world of one too (with nothing for its event loop to wait on, it spun a core)."""
    import os
    import time
    hvd.allreduce(torch.ones(2), name="before_idle")
    time.sleep(0.3)  # past the engine's polling after work
    t0 = os.times()
    time.sleep(1.0)
    t1 = os.times()
    used = (t1.user - t0.user) + (t1.system - t0.system)
    assert used < 0.3, "%.2f s of CPU in an idle second" % used
