"""hvd.run (Horovod's run API): a function run on every rank of a job hvdrun starts, each rank's
result returned in rank order.

These tests start their own jobs, so they run once, in the single-process session (python_single);
in the sessions under hvdrun every rank would start them again.
"""

import re
import shutil
import time

import pytest

import hvd
from conftest import world


@pytest.fixture(autouse=True)
def single_session_only():
    if world()[1] > 1:
        pytest.skip("hvd.run starts its own jobs; the single-process session runs these")


@pytest.mark.parametrize("np", [1, 2, 3])
def test_results_come_back_in_rank_order(np):
    # Defined in the test, so it travels by value (a module-level function would be pickled by
    # reference, and this test module cannot be imported on the ranks).
    def train(scale, name):
        import torch
        import hvd.torch as h
        h.init()
        total = h.allreduce(torch.tensor([float(h.rank() + 1)]) * scale, op=h.Sum, name=name)
        rank, size = h.rank(), h.size()
        h.shutdown()
        return rank, size, float(total)

    results = hvd.run(train, args=(2.0,), kwargs={"name": "t"}, np=np)
    # The sum over ranks r of 2 (r + 1) is n (n + 1).
    assert results == [(r, np, float(np * (np + 1))) for r in range(np)]


def test_a_lambda_and_a_closure_travel_by_value():
    base = 40
    assert hvd.run(lambda x: x + base, args=(2,), np=2) == [42, 42]


def test_a_large_argument_goes_through_a_file():
    blob = bytes(range(256)) * 1024  # 256 KiB, more than the environment takes
    results = hvd.run(lambda b: (len(b), b[255], b[-1]), args=(blob,), np=2)
    assert results == [(262144, 255, 255)] * 2


def test_a_large_result_comes_back_whole():
    """Results of a few MiB from every rank at once (a model's weights, say): their lines
    interleave in the job's output, and each rank's comes back byte for byte."""
    def blob():
        import os
        import random
        rank = int(os.environ["HVD_RANK"])
        return random.Random(rank).randbytes(3_000_000 + rank)

    import random
    results = hvd.run(blob, num_proc=3)
    assert [len(r) for r in results] == [3_000_000, 3_000_001, 3_000_002]
    for rank, r in enumerate(results):
        assert r == random.Random(rank).randbytes(3_000_000 + rank), rank


def test_a_rank_that_cannot_reach_hvd_run_prints_its_result():
    """The fallback: a rank that cannot connect to hvd.run's result server prints its result as
    marked lines of its output, which hvd.run takes out of it."""
    def unreachable(n):
        import os
        os.environ["HVD_RUN_RESULT_ADDR"] = "127.0.0.1:1"  # nobody listens there
        return "x" * n + os.environ["HVD_RANK"]

    assert hvd.run(unreachable, args=(100_000,), num_proc=2) == ["x" * 100_000 + "0",
                                                                  "x" * 100_000 + "1"]


def test_num_proc_and_the_deprecated_np():
    def size():
        import os
        return int(os.environ["HVD_SIZE"])

    assert hvd.run(size, num_proc=2) == [2, 2]
    with pytest.warns(DeprecationWarning, match="np is deprecated"):
        assert hvd.run(size, np=3) == [3, 3, 3]


def test_the_ranks_output_passes_through_and_the_result_lines_do_not(capfd):
    def talk():
        import os
        import sys
        sys.stdout.write("rank %s speaks" % os.environ["HVD_RANK"])  # no end of line
        return "done"

    assert hvd.run(talk, np=2) == ["done", "done"]
    out = capfd.readouterr().out
    assert "rank 0 speaks" in out and "rank 1 speaks" in out, out
    assert "hvd.run result" not in out, out


def _alive(pid):
    """Whether process pid runs (a zombie does not)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_the_job_ends_with_the_process_that_called_run(tmp_path, how):
    """The process that called hvd.run interrupted (a notebook's interrupt: SIGINT to it alone)
    or killed: hvdrun and the ranks stop within seconds, as horovod.run's do. They trained on
    to the end of the function before (here 60 s), the result going nowhere."""
    import os
    import signal
    import subprocess
    import sys
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import hvd\n"
        "def train(d):\n"
        "    import os, time\n"
        "    with open(os.path.join(d, 'rank.' + os.environ['HVD_RANK']), 'w') as f:\n"
        "        f.write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
        "hvd.run(train, args=(%r,), num_proc=2)\n" % str(tmp_path))
    proc = subprocess.Popen([sys.executable, str(driver)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            pids = []
            for r in (0, 1):
                try:
                    pids.append(int((tmp_path / ("rank.%d" % r)).read_text()))
                except (OSError, ValueError):
                    pass
            time.sleep(0.1)
        assert len(pids) == 2, "the ranks did not start"
        os.kill(proc.pid, getattr(signal, how))
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "ranks still running after the %s" % how
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def test_a_failing_rank_raises():
    def fail():
        import os
        if os.environ["HVD_RANK"] == "1":
            raise ValueError("rank 1 fails")
        return 0

    with pytest.raises(RuntimeError, match="processes exited with non-zero status"):
        hvd.run(fail, np=2)


_RAISES_LAST = """
import os, sys, time
import torch
import hvd.torch as h
h.init()
pids = h.allgather_object(os.getpid())
h.allreduce(torch.ones(4), name="warm")
if h.rank() == 1:
    try:
        raise RuntimeError("rank 1 fails")
    finally:
        # A slow teardown: the others (whose allreduce this shutdown fails) exit first.
        h.shutdown()
        t0 = time.time()
        for pid in pids[:1]:
            while time.time() - t0 < 60:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.02)
for i in range(100000):
    h.allreduce(torch.ones(4), name="step%d" % i)
"""


def test_the_rank_that_raised_is_named_though_the_others_exit_first(tmp_path):
    """Rank 1 raises and shuts hvd down; rank 0's allreduce fails on that shutdown and it exits
    first. hvdrun names rank 1 as the cause, from rank 0's note, and exits with its code."""
    import subprocess
    import sys
    from hvd.runner import _hvdrun
    script = tmp_path / "raises_last.py"
    script.write_text(_RAISES_LAST)
    done = subprocess.run([_hvdrun(), "-np", "2", "--grace-seconds", "30", sys.executable,
                           str(script)], capture_output=True, text=True, timeout=120)
    err = done.stderr
    assert done.returncode == 1, err
    assert "rank 1 called shutdown" in err, err
    assert re.search(r"hvdrun: rank 0 \(pid \d+\) exited with code 1, after another rank's "
                     r"failure ended hvd there: Aborted: hvd has been shut down \(rank 1", err), err
    assert re.search(r"hvdrun: rank 1 \(pid \d+\) exited with code 1: the likely cause", err), err


_LEAVES_EARLY = """
import sys
import torch
import hvd.torch as h
h.init()
h.allreduce(torch.ones(4), name="warm")
if h.rank() == int(sys.argv[1]):
    sys.exit(0)  # its hvd shuts down at exit, while the others wait for it in the next allreduce
h.allreduce(torch.ones(4), name="next")
"""


def test_a_rank_that_exits_0_while_the_others_wait_is_named():
    """Rank 2 (or rank 0) of 3 ends with code 0 after one allreduce; the others fail in the next
    one on its shutdown. hvdrun exits non-zero and names the rank that left, whose code of 0 is
    no failure of its own, as the likely cause, whether it was reaped before the first failure
    or after it."""
    import subprocess
    import sys
    from hvd.runner import _hvdrun
    for leaver in (2, 0):
        done = subprocess.run([_hvdrun(), "-np", "3", sys.executable, "-c", _LEAVES_EARLY,
                               str(leaver)], capture_output=True, text=True, timeout=120)
        err = done.stderr
        assert done.returncode != 0, err
        assert "rank %d called shutdown" % leaver in err, err
        assert re.search(r"hvdrun: rank %d \(pid \d+\) exited with code 0 while the others still ran "
                         r"collectives, and its exit shut hvd down on them: the likely cause"
                         % leaver, err), err
        assert len(re.findall("the likely cause", err)) == 1, err


_FAILS_ON_ITS_OWN = """
import os, sys, time
import torch
import hvd.torch as h
h.init()
pids = h.allgather_object(os.getpid())
h.allreduce(torch.ones(4), name="warm")
marker = sys.argv[1]
if h.rank() == 1:
    try:
        raise RuntimeError("rank 1 fails")
    finally:
        h.shutdown()  # ends hvd on rank 0 too, with nothing of rank 0's pending
        open(marker, "w").close()
        t0 = time.time()  # a slow teardown: rank 0 exits first
        while time.time() - t0 < 60:
            try:
                os.kill(pids[0], 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
# Rank 0 then fails in its own code, not in an hvd operation.
t0 = time.time()
while not os.path.exists(marker) and time.time() - t0 < 60:
    time.sleep(0.02)
time.sleep(1)
raise RuntimeError("rank 0 fails too, on its own")
"""


def test_a_rank_that_fails_on_its_own_is_not_said_to_follow_another(tmp_path):
    """A rank's hvd ended by another rank's shutdown leaves a note only once one of its
    operations fails on that. Rank 0 here raises in its own code after rank 1's shutdown and
    exits first, and hvdrun does not say that its exit followed from rank 1's failure."""
    import subprocess
    import sys
    from hvd.runner import _hvdrun
    done = subprocess.run([_hvdrun(), "-np", "2", "--grace-seconds", "30", sys.executable, "-c",
                           _FAILS_ON_ITS_OWN, str(tmp_path / "rank1_shut_down")],
                          capture_output=True, text=True, timeout=120)
    err = done.stderr
    assert done.returncode == 1, err
    assert "rank 0 fails too, on its own" in done.stdout + err
    assert re.search(r"hvdrun: rank 0 \(pid \d+\) exited with code 1", err), err
    assert "after another rank's failure ended hvd there" not in err, err


_NEVER_SUBMITS = """
import os
os.environ["HVD_STALL_CHECK_TIME_SECONDS"] = "1"
os.environ["HVD_STALL_SHUTDOWN_TIME_SECONDS"] = "2"
import torch
import hvd.torch as h
h.init()
h.allreduce(torch.ones(2), name="only_rank_%d" % h.rank())  # each waits for the other's
"""


def test_a_stall_shutdown_is_not_said_to_be_another_ranks_failure():
    """hvdrun names the first rank to exit after hvd's stall shutdown ended the job there, not
    'another rank's failure': no rank failed, and the note names the ranks that were late."""
    import subprocess
    import sys
    from hvd.runner import _hvdrun
    done = subprocess.run([_hvdrun(), "-np", "2", sys.executable, "-c", _NEVER_SUBMITS],
                          capture_output=True, text=True, timeout=120)
    err = done.stderr
    assert done.returncode != 0, err
    assert "after another rank's failure" not in err, err
    assert re.search(r"hvdrun: rank [01] \(pid \d+\) exited with code 1, after hvd's stall "
                     r"shutdown ended the job there: .*ranks \[[01]\], which never submitted it",
                     err), err


_OWN_FAILURE_THEN_A_SIGNAL = """
import os, signal, sys, time
import torch
import hvd.torch as h
h.init()
pids = h.allgather_object(os.getpid())
h.allreduce(torch.ones(4), name="warm")
if h.rank() == 0:
    raise ValueError("rank 0's own bug")
def gone(pid):  # exited and reaped, or a zombie hvdrun is about to reap
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
t0 = time.time()
while not gone(pids[0]) and time.time() - t0 < 60:
    time.sleep(0.01)
time.sleep(0.1)
os.kill(os.getpid(), signal.SIGKILL)  # well inside hvdrun's 1 s window after rank 0's exit
"""


def test_a_signal_just_after_a_rank_failed_on_its_own_does_not_take_the_blame():
    """Rank 0, whose hvd had joined the job, fails in its own code and leaves no note; rank 1 is
    killed by a signal a moment later. The signal death is not named the likely cause (it is
    more likely a consequence): hvdrun names rank 0 and exits with its code."""
    import subprocess
    import sys
    from hvd.runner import _hvdrun
    done = subprocess.run([_hvdrun(), "-np", "2", "--grace-seconds", "30", sys.executable, "-c",
                           _OWN_FAILURE_THEN_A_SIGNAL], capture_output=True, text=True,
                          timeout=120)
    err = done.stderr
    assert done.returncode == 1, err
    assert "ValueError: rank 0's own bug" in err, err
    assert "AttributeError" not in err and "[1]<stderr>:Traceback" not in err, err
    assert re.search(r"hvdrun: rank 0 \(pid \d+\) exited with code 1", err), err
    assert "likely cause" not in err, err


def test_a_stall_past_the_shutdown_time_fails_every_rank_and_pairs_no_steps():
    """Rank 1 comes to step 0's allreduce after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS; both ranks
    catch errors and go on to step 1 under the same name, as Horovod's test_stall.py does. As in
    Horovod, the stall shuts hvd down on every rank: each rank's two steps fail, naming the late
    rank. (When only the waiting rank failed, rank 1's step 0 was reduced with rank 0's step 1.)"""
    def steps():
        import os
        import time
        # (The HVD_ spellings, which win over Horovod's: the suite sets a check time of 10 s.)
        os.environ["HVD_STALL_CHECK_TIME_SECONDS"] = "1"
        os.environ["HVD_STALL_SHUTDOWN_TIME_SECONDS"] = "2"
        import torch
        import hvd.torch as h
        h.init()
        rank, got = h.rank(), []
        for step in range(2):
            if rank == 1 and step == 0:
                time.sleep(8)
            try:
                v = h.allreduce(torch.tensor([100.0 * step + rank]), name="grad.w", op=h.Sum)
                got.append(("sum", float(v)))
            except h.HvdError as e:
                got.append((type(e).__name__, str(e)))
        h.shutdown()
        return got

    for got in hvd.run(steps, np=2):
        assert [kind for kind, _ in got] == ["HvdTimeoutError"] * 2, got
        for _, why in got:
            assert "'allreduce.grad.w'" in why and "ranks [1], which never submitted it" in why, why


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_a_failing_rank_ends_an_mpirun_job_at_once():
    """As in Horovod's own test: rank 1 fails while rank 0 works on for 120 s without hvd. The
    shutdown of rank 1's engine ends rank 0's engine, both finalize MPI, rank 1 exits and mpirun
    ends the job."""
    def fail_or_sleep():
        import os
        import time
        import hvd.torch as hvd_torch
        hvd_torch.init()
        if hvd_torch.rank() == 1:
            raise RuntimeError("rank 1 fails")
        time.sleep(120)

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="mpirun failed"):
        hvd.run(fail_or_sleep, np=2, use_mpi=True)
    assert time.monotonic() - start < 60


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
@pytest.mark.parametrize("init", [False, True])
def test_under_mpirun_each_rank_returns_its_own_result(init):
    """A function that never initializes hvd, or shuts it down before it returns, still gives
    one result per rank (its rank from mpirun's environment)."""
    def whoami(init):
        import os
        if init:
            import hvd.torch as h
            h.init()
            h.shutdown()
        return int(os.environ["OMPI_COMM_WORLD_RANK"])

    assert hvd.run(whoami, args=(init,), num_proc=3, use_mpi=True) == [0, 1, 2]


def _has_mpi4py():
    try:
        import mpi4py  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(shutil.which("mpirun") is None or not _has_mpi4py(),
                    reason="needs Open MPI's mpirun and mpi4py")
def test_a_program_in_mpi_when_another_rank_shuts_down_is_not_pulled_out_of_it():
    """As Horovod's test_process_sets_static: MPI started by hvd, a barrier of the program's own,
    then hvd.shutdown. Rank 0 leaves the barrier first and shuts down, which ends rank 1's
    engine while rank 1 may still be in the barrier: its background thread finalized MPI under
    it (a crash in Open MPI's shared-memory transport, about 1 job in 4). Five jobs."""
    def barrier_then_shutdown():
        import mpi4py
        mpi4py.rc.initialize = False
        import hvd.torch as h
        h.init(process_sets=[h.ProcessSet([0]), h.ProcessSet([1])])
        from mpi4py import MPI
        MPI.COMM_WORLD.barrier()
        rank = h.rank()
        h.shutdown()
        return rank

    for _ in range(5):
        assert hvd.run(barrier_then_shutdown, num_proc=2, use_mpi=True) == [0, 1]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_under_mpirun_a_large_result_comes_back_whole():
    """mpirun forwards the ranks' output in 4 KiB reads, splitting and mixing lines: results
    come over TCP instead."""
    def blob():
        import os
        import random
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        return random.Random(rank).randbytes(1_000_000 + rank)

    import random
    results = hvd.run(blob, num_proc=3, use_mpi=True)
    for rank, r in enumerate(results):
        assert r == random.Random(rank).randbytes(1_000_000 + rank), rank


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="callable"):
        hvd.run(42, np=2)
    with pytest.raises(ValueError, match="use_gloo and use_mpi"):
        hvd.run(lambda: 0, num_proc=2, use_gloo=True, use_mpi=True)
    with pytest.raises(ValueError, match="hosts or hostfile"):
        hvd.run(lambda: 0, num_proc=2, hosts="localhost:2", hostfile="/dev/null")
