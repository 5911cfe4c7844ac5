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

Elastic training (``hvd.elastic``: State, ObjectState, run) retries after these errors; its
``HostsUpdatedInterrupt`` is exported here too.
"""

import atexit as _atexit
import threading as _threading

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
# Horovod's adaptive summation (allreduce of float32/float64 tensors on a power-of-two number of
# ranks; in DistributedOptimizer it combines each rank's parameter change).
Adasum = _core.ADASUM


class ProcessSet:
    """A set of ranks that runs collectives among itself, as Horovod's ``ProcessSet``.

    Make one from a list of world ranks and pass it to ``hvd.init(process_sets=[...])`` or
    ``hvd.add_process_set``; then pass it as ``process_set=`` to any operation. Ranks, roots
    and splits count in the set, except a broadcast's ``root_rank``, which is a world rank (as
    in Horovod). Each set negotiates on its own: a set waiting for a slow member holds back no
    other set.
    """

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet takes a list of ranks; hvd does not take MPI "
                             "communicators") from None
        if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
            raise ValueError("ProcessSet takes a list of integer ranks, got %r" % (ranks_or_comm,))
        self.ranks = ranks

    def _invalidate(self):
        # As in Horovod, the ranks stay: the object can be added again.
        self.process_set_id = None

    def size(self):
        """The number of ranks in the set, or None before it is added."""
        if self.process_set_id is None:
            return None
        return len(_core.process_set_ranks(self.process_set_id))

    def rank(self):
        """This rank's place in the set (0 for its lowest rank), or None before it is added.
        Raises ValueError on a rank that is not a member."""
        if self.process_set_id is None:
            return None
        ranks = _core.process_set_ranks(self.process_set_id)
        if _core.rank() not in ranks:
            raise ValueError("rank %d is not a member of process set %d (ranks %s)"
                             % (_core.rank(), self.process_set_id, ranks))
        return ranks.index(_core.rank())

    def included(self):
        """Whether this rank is one of the set's ranks (None for a set without ranks)."""
        if self.ranks is None:
            return None
        return _core.rank() in self.ranks

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=None)" % (
            self.process_set_id, self.ranks)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_process_sets = {0: [global_process_set]}  # id -> the ProcessSet objects that name it


def _process_set_id(process_set):
    """The engine's id of an operation's process set (None: the global set)."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be an hvd.ProcessSet, got %r" % (process_set,))
    if process_set.process_set_id is None:
        raise ValueError("%s has not been added (hvd.init(process_sets=...) or "
                         "hvd.add_process_set) or was removed" % (process_set,))
    return process_set.process_set_id


def _register(process_set, process_set_id):
    process_set.process_set_id = process_set_id
    process_set.ranks = list(_core.process_set_ranks(process_set_id))
    known = _process_sets.setdefault(process_set_id, [])
    if process_set not in known:
        known.append(process_set)


def init(comm=None, process_sets=None):
    """Starts the engine from the environment (HVD_* or HOROVOD_* variables, mpirun, Slurm).

    A process started without a launcher is a world of size 1. Calling it again starts
    nothing; as in Horovod it gives the ProcessSets passed to it the ids of the sets with
    their ranks.
    ``process_sets``: ProcessSets every rank adds as the engine starts (in the same order on
    every rank), or ``"dynamic"`` to allow ``add_process_set`` and ``remove_process_set``
    later, as HOROVOD_DYNAMIC_PROCESS_SETS=1 does. As in Horovod, duplicates are not allowed:
    an entry with the world's ranks or an earlier entry's is left without an id, and init
    raises ValueError naming it (the engine runs, with every other entry added). MPI
    communicators (``comm``) are not taken.
    """
    if comm is not None:
        raise ValueError("hvd.init(comm=...): MPI communicators are not supported")
    dynamic = isinstance(process_sets, str)
    if dynamic and process_sets != "dynamic":
        raise ValueError("hvd.init(process_sets=...) takes a list of ProcessSets or 'dynamic', "
                         "got %r" % (process_sets,))
    sets = [] if dynamic or process_sets is None else list(process_sets)
    for ps in sets:
        if not isinstance(ps, ProcessSet):
            raise ValueError("hvd.init(process_sets=...) takes ProcessSets, got %r" % (ps,))
    if not _core.is_initialized():
        _core.init([ps.ranks for ps in sets if ps is not global_process_set], dynamic)
        global_process_set.ranks = list(range(_core.size()))
    _bind_process_sets(sets)


def _bind_process_sets(sets):
    """Gives each ProcessSet passed to init the id of the set with its ranks, as Horovod does on
    every init (so a second init binds new objects to the sets the engine has).

    As in Horovod, duplicates are not allowed: an entry whose ranks are the world's or an
    earlier entry's is left without an id, and ValueError names the first such entry once every
    other entry has its id."""
    ids = {tuple(ranks): i for i, ranks in get_process_set_ids_and_ranks().items()}
    seen, duplicates = {0}, []
    for index, ps in enumerate(sets):
        if ps is global_process_set:
            continue
        process_set_id = ids.get(tuple(ps.ranks))
        if process_set_id is None:
            raise ValueError("hvd.init: process_sets entry number %d (%s) names no process set; "
                             "the engine started already, add it with hvd.add_process_set"
                             % (index, ps))
        if process_set_id in seen:
            duplicates.append((index, ps))
            ps._invalidate()
            continue
        seen.add(process_set_id)
        _register(ps, process_set_id)
    if duplicates:
        index, ps = duplicates[0]
        raise ValueError("hvd.init: process_sets entry number %d is a duplicate: its ranks %s are "
                         "those of %s" % (index, ps.ranks, "the global process set" if
                                          ids[tuple(ps.ranks)] == 0 else "an earlier entry"))


# Held by add_process_set and remove_process_set from the engine's call to the registry's
# update: the engine gives a removed set's id to the next set added, so another thread's
# addition must not take the id before the removal has invalidated its objects.
_process_set_calls = _threading.Lock()


def add_process_set(process_set):
    """Adds a process set (a ProcessSet or a list of ranks) and returns it. Collective: every
    rank calls it, with the same ranks, in the same order. Needs HOROVOD_DYNAMIC_PROCESS_SETS=1
    (or HVD_) or ``hvd.init(process_sets="dynamic")``. As in Horovod, the set gets the id of a
    removed set (the first removed first) if there is one, else the next unused id."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if not _core.dynamic_process_sets():
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 (or HVD_DYNAMIC_PROCESS_SETS=1) to "
                         "allow adding process sets after hvd.init()")
    with _process_set_calls:
        _register(process_set, _core.add_process_set(process_set.ranks))
    return process_set


def remove_process_set(process_set):
    """Removes a process set; returns whether it did (never the global set). Collective, like
    add_process_set. Operations of the set still in flight fail on every member. Every
    ProcessSet object that named it is invalidated."""
    if process_set.process_set_id is None or process_set.process_set_id == 0:
        return False
    if not _core.dynamic_process_sets():
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 (or HVD_DYNAMIC_PROCESS_SETS=1) to "
                         "allow removing process sets")
    with _process_set_calls:
        process_set_id = process_set.process_set_id
        if process_set_id is None:  # another thread removed it meanwhile
            return False
        _core.remove_process_set(process_set_id)
        for ps in _process_sets.pop(process_set_id, [process_set]):
            ps._invalidate()
        process_set._invalidate()
        from hvd import _ops
        _ops.forget_counters(process_set_id)
    return True


def process_sets():
    """The known process sets, one object per id, in id order."""
    return [_process_sets[i][0] for i in sorted(_process_sets)]


def process_set_by_id(process_set_id):
    """The first ProcessSet object registered under ``process_set_id``."""
    if process_set_id not in _process_sets:
        raise ValueError("No known process set with id %s" % (process_set_id,))
    return _process_sets[process_set_id][0]


def get_process_set_ids_and_ranks():
    """``{process set id: its world ranks, ascending}`` for every set this rank knows, the
    global set (id 0) included."""
    return {i: list(_core.process_set_ranks(i)) for i in _core.process_set_ids()}


def shutdown():
    """Stops the engine. Pending operations fail with AbortedError. Idempotent. Process sets
    and the numbering of unnamed operations are forgotten."""
    _core.shutdown()
    # Unnamed operations are numbered per engine: a worker that joins an elastic job's next
    # world starts at 0 as the others do after their reset.
    from hvd import _ops
    _ops._counters.clear()
    for process_set_id in [i for i in _process_sets if i != 0]:
        for ps in _process_sets.pop(process_set_id):
            ps._invalidate()


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a timeline to ``file_path`` (closing any before), as Horovod's: rank 0
    writes it, or each rank its own where the path has ``%r``. Operations submitted after it
    returns are in it. Needs HOROVOD_TIMELINE (or HVD_TIMELINE) set when the engine started:
    DYNAMIC for no file until now. Raises ValueError otherwise, or before hvd.init()."""
    if not file_path:
        raise ValueError("start_timeline needs the path of the file to write")
    try:
        _core.start_timeline(str(file_path), bool(mark_cycles))
    except FailedPreconditionError as e:
        raise ValueError(str(e)) from None


def stop_timeline():
    """Stops the timeline started by start_timeline (or HOROVOD_TIMELINE) and closes its file
    before the engine's next operation. Raises ValueError before hvd.init(), or without
    HOROVOD_TIMELINE set when the engine started."""
    try:
        _core.stop_timeline()
    except FailedPreconditionError as e:
        raise ValueError(str(e)) from None


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
    """True when this job uses MPI at run time, as in Horovod: its ranks were started by
    mpirun (hvdrun --mpi) or its collectives run over MPI (HVD_CPU_OPERATIONS=mpi)."""
    return bool(_core.mpi_enabled())


def mpi_threads_supported():
    return False


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    """The NCCL version this build runs CUDA tensors' collectives through, as Horovod reports
    it (NCCL_VERSION_CODE: 22809 for 2.28.9), or 0 when it has no NCCL."""
    return int(_core.NCCL_VERSION_CODE) if _core.HAVE_NCCL else 0


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

# Elastic training uses the names above, so it is imported last.
from hvd.runner import run  # noqa: E402,F401
from hvd import elastic  # noqa: E402,F401
from hvd.elastic import HostsUpdatedInterrupt  # noqa: E402,F401
