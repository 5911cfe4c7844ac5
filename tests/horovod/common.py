"""The helpers Horovod's parallel tests import from their `common` module, for running those
tests against hvd (scripts/horovod_test.sh). Also a shim for Python 3.11 and later, where the
tests' inspect.getargspec no longer exists."""
import contextlib
import inspect
import os
import tempfile


def mpi_env_rank_and_size():
    """(rank, size) from the launcher's environment (Open MPI, PMI, then horovodrun's names that
    hvdrun also sets), else (0, 1)."""
    for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE"),
                               ("HOROVOD_RANK", "HOROVOD_SIZE")):
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    """Skips the test, or fails it where HOROVOD_TEST_GPU=1 asks for the GPU tests to run."""
    if os.environ.get("HOROVOD_TEST_GPU") == "1":
        test.fail(message)
    else:
        test.skipTest(message)


@contextlib.contextmanager
def temppath():
    """A fresh temporary file name; the file is removed afterwards if it was made."""
    fd, path = tempfile.mkstemp()
    os.close(fd)
    os.remove(path)
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)


if not hasattr(inspect, "getargspec"):  # removed in Python 3.11; the tests only read .args
    inspect.getargspec = inspect.getfullargspec
