"""hvd.numpy: the collectives on NumPy arrays, sync and async."""

import os
import re
import time

import numpy as np
import pytest

import hvd.numpy as hvd
from hvd import mpi_enabled, nccl_built
from conftest import pattern, world

DTYPES = [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64, np.float16, np.float32,
          np.float64, np.bool_]


def make(shape, r, dtype, kind="small"):
    return pattern(shape, r, "bool" if dtype == np.bool_ else kind).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (6,), (2, 3, 2)], ids=str)
def test_allreduce_sum_and_max(dtype, shape):
    r, n = world()
    stack = np.stack([make(shape, q, dtype).astype(np.float64) for q in range(n)])
    for op, ref in ((hvd.Sum, stack.max(0) if dtype == np.bool_ else stack.sum(0)),
                    (hvd.Max, stack.max(0)), (hvd.Min, stack.min(0))):
        got = hvd.allreduce(make(shape, r, dtype), op=op)
        assert got.dtype == np.dtype(dtype) and got.shape == shape
        np.testing.assert_array_equal(got, ref.astype(dtype))


def test_allreduce_average_in_place_and_async():
    r, n = world()
    x = make((4, 5), r, np.float64, "avg")
    hvd.allreduce_(x)
    np.testing.assert_array_equal(x, pattern((4, 5), 0, "small") + 3)
    handles = [hvd.allreduce_async(np.full(3, float(i + r)), op=hvd.Sum) for i in range(20)]
    for i, h in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(h), np.full(3, n * i + n * (n - 1) / 2))


def test_non_contiguous_in_place():
    r, n = world()
    base = np.arange(12.0).reshape(3, 4) + r
    view = base.T
    hvd.allreduce_(view, op=hvd.Sum)
    np.testing.assert_array_equal(base, np.arange(12.0).reshape(3, 4) * n + n * (n - 1) / 2)


def test_grouped_allreduce():
    r, n = world()
    ys = hvd.grouped_allreduce([np.full(2, float(r)), np.ones((2, 2), dtype=np.int32)], op=hvd.Sum)
    np.testing.assert_array_equal(ys[0], np.full(2, n * (n - 1) / 2))
    np.testing.assert_array_equal(ys[1], np.full((2, 2), n, dtype=np.int32))


def test_allgather_broadcast_alltoall_reducescatter():
    r, n = world()
    got = hvd.allgather(np.full((r + 1, 2), r, dtype=np.int64))
    np.testing.assert_array_equal(got, np.concatenate([np.full((q + 1, 2), q) for q in range(n)]))
    got = hvd.synchronize(hvd.allgather_async(np.array([r], dtype=np.float32)))
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32))
    for root in range(n):
        np.testing.assert_array_equal(hvd.broadcast(np.full(3, r), root), np.full(3, root))
        x = np.full(2, float(r))
        hvd.broadcast_(x, root)
        np.testing.assert_array_equal(x, np.full(2, float(root)))
    out, received = hvd.alltoall(np.arange(n, dtype=np.int32) + 10 * r)
    np.testing.assert_array_equal(out, np.array([r + 10 * q for q in range(n)], dtype=np.int32))
    np.testing.assert_array_equal(received, np.ones(n, dtype=np.int32))
    got = hvd.reducescatter(np.ones((n, 3)), op=hvd.Sum)
    np.testing.assert_array_equal(got, np.full((1, 3), float(n)))


def test_errors():
    r, n = world()
    with pytest.raises(TypeError, match="does not support"):
        hvd.allreduce(np.zeros(2, dtype=np.complex64))
    with pytest.raises(ValueError, match="writable"):
        hvd.allreduce_([1.0, 2.0])
    with pytest.raises(ValueError, match="not valid Unicode text"):
        hvd.allreduce(np.ones(2), name="bad\udcff")
    if n > 1:
        with pytest.raises(hvd.HvdError, match="np.mismatch"):
            hvd.allreduce(np.zeros(2 + r), name="np.mismatch")
        # The message holds the whole name, past a NUL in it.
        with pytest.raises(hvd.HvdError, match="np\x00mismatch': mismatch across ranks"):
            hvd.allreduce(np.zeros(2 + r), name="np\x00mismatch")
    np.testing.assert_array_equal(hvd.allreduce(np.ones(1), op=hvd.Sum), np.full(1, float(n)))
    hvd.barrier()


def test_an_argument_one_rank_gets_wrong_fails_on_every_rank_at_once():
    # The last rank alone passes a root outside the world, then splits of the wrong number:
    # every rank raises with that rank's reason, well before the stall time, and goes on.
    r, n = world()
    bad = r == n - 1
    started = time.monotonic()
    with pytest.raises(hvd.InvalidArgumentError,
                       match=r"root rank %d is outside .*fails on every rank" % n):
        hvd.broadcast(np.arange(4.0), root_rank=n if bad else 0, name="np.one.root")
    with pytest.raises(hvd.InvalidArgumentError, match=r"on rank %d: splits must be" % (n - 1)):
        hvd.alltoall(np.arange(float(n)), splits=[0] * (n + 1) if bad else [1] * n,
                     name="np.one.splits")
    assert time.monotonic() - started < 10
    np.testing.assert_array_equal(hvd.allreduce(np.ones(1), op=hvd.Sum), np.full(1, float(n)))


def test_a_forked_child_gets_an_error_and_leaves_the_rank_running():
    """A child forked without exec (a DataLoader worker, os.fork) has none of hvd's threads: its
    operations, and the wait of one the rank started before the fork, fail at once instead of
    hanging, and its exit (hvd.shutdown at interpreter exit) leaves the rank's engine running."""
    r, n = world()
    # Rank 0's stays pending through the fork: the others submit theirs after the barrier
    # below, which rank 0 reaches once its child is gone.
    pending = None
    if r == 0:
        pending = hvd.allreduce_async(np.full(3, 0.0), op=hvd.Sum, name="forked.pending")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                hvd.allreduce(np.ones(3), name="forked.child")
            except hvd.FailedPreconditionError as e:
                code = 0 if "forked from rank %d" % r in str(e) else 2
            if code == 0 and pending is not None and n > 1:
                polled = hvd.poll(pending)  # never finishes here: the poll says go and wait
                try:
                    hvd.synchronize(pending)
                    code = 3
                except hvd.FailedPreconditionError as e:
                    code = 0 if "before this process was forked" in str(e) else 4
                if not polled:
                    code = 5
            hvd.shutdown()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    hvd.barrier()
    if r != 0:
        pending = hvd.allreduce_async(np.full(3, float(r)), op=hvd.Sum, name="forked.pending")
    np.testing.assert_array_equal(hvd.synchronize(pending), np.full(3, n * (n - 1) / 2))
    np.testing.assert_array_equal(hvd.allreduce(np.full(3, float(r)), op=hvd.Sum, name="forked.parent"),
                                  np.full(3, n * (n - 1) / 2))


def test_ctrl_c_interrupts_a_wait_and_the_operation_goes_on():
    """SIGINT (Ctrl-C) raises KeyboardInterrupt in a wait within about 0.1 s, though the
    operation waits for a rank that has not submitted it; a later wait takes it up."""
    import signal
    import threading
    import time
    r, n = world()
    if n == 1:
        pytest.skip("needs an operation that waits for another rank")
    marker = "/tmp/hvd_test_sigint_%s_%%d" % os.environ.get("HVD_RENDEZVOUS_PORT", "0")
    if r != 0 and os.path.exists(marker % r):
        os.remove(marker % r)  # left by an earlier run that stopped halfway
    hvd.barrier()
    if r == 0:
        # Rank 0 submits only once every other rank has been interrupted.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and not all(
                os.path.exists(marker % q) for q in range(1, n)):
            time.sleep(0.01)
        got = hvd.allreduce(np.full(3, 0.0), op=hvd.Sum, name="interrupted")
    else:
        handle = hvd.allreduce_async(np.full(3, float(r)), op=hvd.Sum, name="interrupted")
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            hvd.synchronize(handle)
        took = time.monotonic() - t0
        open(marker % r, "w").close()
        got = hvd.synchronize(handle)
        os.remove(marker % r)
        assert took < 10, took
    np.testing.assert_array_equal(got, np.full(3, n * (n - 1) / 2))


def test_mpi_enabled_is_false_without_mpi():
    """These sessions run under hvdrun's own controller (tests/mpi runs one under mpirun)."""
    assert mpi_enabled() is False


def test_nccl_built_is_the_version_code():
    """As Horovod's: NCCL_VERSION_CODE of the header the build used, or 0 without NCCL."""
    code = nccl_built()
    assert type(code) is int
    header = os.environ.get("HVD_TEST_NCCL_HEADER")
    if header is None:
        assert code == 0
        return
    with open(header) as f:
        text = f.read()
    major, minor, patch = (int(re.search(r"#define NCCL_%s (\d+)" % k, text).group(1))
                           for k in ("MAJOR", "MINOR", "PATCH"))
    # NCCL's own formula: two digits for the minor version from 2.9 on.
    want = (major * 1000 + minor * 100 + patch if major <= 2 and minor <= 8
            else major * 10000 + minor * 100 + patch)
    assert code == want
