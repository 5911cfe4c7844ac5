"""hvd: Horovod-style collectives for NumPy (hvd.numpy) and PyTorch (hvd.torch).

This top-level package holds what does not depend on a framework: the per-process engine
(init, shutdown, rank, size, ...), the reduction constants and the exception classes. A
Horovod script ports by changing ``import horovod.torch as hvd`` to ``import hvd.torch as hvd``.

Errors from the engine raise :class:`HvdError` (a ``RuntimeError``, also exported as
``HorovodInternalError``) or one subclass per status code:

* ``InvalidArgumentError``, ``FailedPreconditionError``: the call or its tensor was wrong, for
  example a shape, dtype or root that differs across ranks. Recoverable: the next operation
  works.
* ``PeerLostError``, ``HvdTimeoutError``: a rank died or stopped answering. The communicator
  is gone; every later operation fails too.
* ``ResourceExhaustedError``: a rank could not allocate the memory an operation needs. The
  operation fails on every rank, naming the rank; the next operation works.
* ``AbortedError``: the engine was shut down. ``InternalError``: a bug or a failed system call.
"""

import atexit as _atexit

from hvd import _core
from hvd._core import (
    AbortedError,
    FailedPreconditionError,
    HvdError,
    HvdTimeoutError,
    InternalError,
    InvalidArgumentError,
    PeerLostError,
    ResourceExhaustedError,
)

__version__ = _core.VERSION

HorovodInternalError = HvdError

# Reduction operations (the values are the core's ReduceOp codes).
Sum = _core.SUM
Average = _core.AVERAGE
Min = _core.MIN
Max = _core.MAX
Product = _core.PRODUCT


class ProcessSet:
    """The set of ranks an operation runs on. Only the global set exists in this version."""

    def __repr__(self):
        return "hvd.global_process_set"


global_process_set = ProcessSet()


def init(comm=None, process_sets=None):
    """Starts the engine from the environment (HVD_* or HOROVOD_* variables, mpirun, Slurm).

    A process started without a launcher is a world of size 1. Calling it again is a no-op.
    ``comm`` and ``process_sets`` exist for Horovod compatibility and must be None.
    """
    if comm is not None:
        raise ValueError("hvd.init(comm=...): MPI communicators are not supported")
    if process_sets not in (None, "dynamic") and process_sets != [global_process_set]:
        raise ValueError("hvd.init(process_sets=...): only the global process set exists")
    _core.init()


def shutdown():
    """Stops the engine. Pending operations fail with AbortedError. Idempotent."""
    _core.shutdown()


def is_initialized():
    return _core.is_initialized()


def rank():
    return _core.rank()


def size():
    return _core.size()


def local_rank():
    return _core.local_rank()


def local_size():
    return _core.local_size()


def cross_rank():
    return _core.cross_rank()


def cross_size():
    return _core.cross_size()


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    return _core.size() == _core.local_size() * _core.cross_size()


def mpi_built():
    return _core.HAVE_MPI


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    """True when this build runs CUDA tensors' collectives through NCCL."""
    return bool(_core.HAVE_NCCL)


def cuda_built():
    """True when this build takes CUDA tensors (through NCCL, or staged through host memory)."""
    return bool(_core.HAVE_CUDA)


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


_atexit.register(_core.shutdown)
