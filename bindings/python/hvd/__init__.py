"""hvd: Horovod-style collectives for NumPy (hvd.numpy) and PyTorch (hvd.torch).

This top-level package holds what does not depend on a framework: the per-process engine
(init, shutdown, rank, size, ...), the reduction constants and the exception classes. A
Horovod script ports by changing ``import horovod.torch as hvd`` to ``import hvd.torch as hvd``.

Errors from the engine raise :class:`HvdError` (a ``RuntimeError``, also exported as
``HorovodInternalError``) or one subclass per status code:

* ``InvalidArgumentError``, ``FailedPreconditionError``: the call, its tensor or the setting was
  wrong, for example a shape, dtype or root that differs across ranks, a call before
  ``hvd.init()``, or (from ``init``) a knob that differs across ranks. After an operation's,
  the next operation works. Both are also ``ValueError``s, as Horovod raises.
* ``PeerLostError``, ``HvdTimeoutError``: a rank died or stopped answering, or (Timeout) a tensor
  waited past ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` for ranks that never submitted it. The
  communicator is gone; every later operation fails too.
* ``ResourceExhaustedError``: a rank could not allocate the memory an operation needs. The
  operation fails on every rank, naming the rank (on that rank alone for a CPU output under
  1 MiB); the next operation works.
* ``AbortedError``: the engine was shut down. ``InternalError``: a bug or a failed system call.

Elastic training (``hvd.elastic``: State, ObjectState, run) retries after these errors; its
``HostsUpdatedInterrupt`` is exported here too.
"""

import atexit as _atexit
import sys as _sys
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
# Horovod's adaptive summation (allreduce of float16/32/64 tensors on a power-of-two number of
# ranks, or of hosts for CUDA tensors on NCCL; in DistributedOptimizer it combines each rank's
# parameter change).
Adasum = _core.ADASUM


class ProcessSet:
    """A set of ranks that runs collectives among itself, as Horovod's ``ProcessSet``.

    Make one from a list of world ranks, or from an mpi4py communicator whose processes are
    all in hvd's world, and pass it to ``hvd.init(process_sets=[...])`` (a communicator's set
    only there, as in Horovod) or ``hvd.add_process_set``; then pass it as ``process_set=`` to
    any operation. Ranks, roots and splits count in the set, except a broadcast's
    ``root_rank``, which is a world rank (as in Horovod). Each set negotiates on its own: a set
    waiting for a slow member holds back no other set.
    """

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        if _is_mpi_comm(ranks_or_comm):
            if not _core.HAVE_MPI:
                raise ValueError("ProcessSet(comm): this build of hvd has no MPI (rebuild with "
                                 "-DHVD_WITH_MPI=ON)")
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet takes a list of ranks or an mpi4py communicator, got %r"
                             % (ranks_or_comm,)) from None
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
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (
            self.process_set_id, self.ranks, self.mpi_comm)

    __repr__ = __str__


def _is_mpi_comm(obj):
    """Whether obj is an mpi4py communicator. A program that holds one has imported mpi4py.MPI;
    nothing here imports it (that would start MPI)."""
    mpi = _sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(obj, mpi.Comm)


# hvd's world as MPI sees it, for translating communicators into hvd's ranks: the group of
# the communicator hvd.init was given, or the ranks of MPI_COMM_WORLD it listed (hvd's rank i
# is _world_list[i]; kept only where the engine took the list); neither: MPI_COMM_WORLD.
# Cleared (the group freed) by shutdown.
_world_group = None
_world_list = None


def _comm_world_ranks(comm, what):
    """The ranks in hvd's world of the processes of mpi4py communicator `comm`, in the
    communicator's order. Raises ValueError naming `what` where one is outside hvd's world, or
    `comm` is not a usable communicator."""
    from mpi4py import MPI
    try:
        world = _world_group if _world_group is not None else MPI.COMM_WORLD.Get_group()
        group = comm.Get_group()
    except MPI.Exception as e:
        raise ValueError("%s: %s" % (what, e)) from None
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(comm.Get_size())), world)
    finally:
        group.Free()
        if world is not _world_group:
            world.Free()
    if _world_list is not None:
        ranks = [_world_list.index(r) if r in _world_list else MPI.UNDEFINED for r in ranks]
    if any(r == MPI.UNDEFINED for r in ranks):
        raise ValueError("%s: the communicator has processes outside hvd's world" % (what,))
    return list(ranks)


def _free_world_group():
    global _world_group, _world_list
    group, _world_group, _world_list = _world_group, None, None
    mpi = _sys.modules.get("mpi4py.MPI")
    if group is not None and mpi is not None and not mpi.Is_finalized():
        group.Free()


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
                         "hvd.add_process_set) or was removed (an elastic reset removes every "
                         "process set, as in Horovod: add it again in a reset callback, with "
                         "HOROVOD_DYNAMIC_PROCESS_SETS=1)" % (process_set,))
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
    ``comm``, as in Horovod: None (the launcher's world), a list of ranks of MPI_COMM_WORLD
    (hvd's rank i is MPI's rank ``comm[i]``; only the listed processes call init with it), or
    an mpi4py communicator (hvd's world is its processes, hvd's ranks its ranks). A list or a
    communicator needs the job started by mpirun (or hvdrun --mpi); the ranks meet through MPI
    on that communicator, local ranks are the members sharing a host. Elsewhere a list of every
    launched rank in order is the world as launched (without MPI), and a part of it is refused.
    ``process_sets``: ProcessSets every rank adds as the engine starts (in the same order on
    every rank), or ``"dynamic"`` to allow ``add_process_set`` and ``remove_process_set``
    later, as HOROVOD_DYNAMIC_PROCESS_SETS=1 does. A ProcessSet made from a communicator may
    differ from rank to rank (each rank's half of a split): as in Horovod, every distinct set
    of processes the ranks' communicators name is added, ahead of the sets given as ranks, in
    Horovod's order; comm must then be None or a communicator. As in Horovod,
    duplicates are not allowed: an entry with the world's ranks or an earlier entry's is left
    without an id, and init raises ValueError naming it (the engine runs, with every other
    entry added).
    """
    global _world_group, _world_list
    dynamic = isinstance(process_sets, str)
    if dynamic and process_sets != "dynamic":
        raise ValueError("hvd.init(process_sets=...) takes a list of ProcessSets or 'dynamic', "
                         "got %r" % (process_sets,))
    sets = [] if dynamic or process_sets is None else list(process_sets)
    for ps in sets:
        if not isinstance(ps, ProcessSet):
            raise ValueError("hvd.init(process_sets=...) takes ProcessSets, got %r" % (ps,))
    # A set made from a communicator stays one (its ranks differ from rank to rank).
    via_comm = [ps for ps in sets if ps is not global_process_set and ps.mpi_comm is not None]
    if comm is None and via_comm and not _core.is_initialized():
        from mpi4py import MPI
        comm = MPI.COMM_WORLD  # the world the communicators' processes are counted in
    mpi_comm, world_ranks = None, []
    if comm is None:
        pass
    elif _is_mpi_comm(comm):
        if not _core.HAVE_MPI:
            raise ValueError("hvd.init(comm=...): this build of hvd has no MPI (rebuild with "
                             "-DHVD_WITH_MPI=ON)")
        if not comm:  # mpi4py: MPI.COMM_NULL is false
            raise ValueError("hvd.init(comm=...): the communicator is MPI.COMM_NULL")
        if comm.Is_inter():
            raise ValueError("hvd.init(comm=...) takes an intracommunicator, got an "
                             "intercommunicator")
        mpi_comm = comm.py2f()
    else:
        try:
            world_ranks = list(comm)
        except TypeError:
            raise ValueError("hvd.init(comm=...) takes a list of ranks or an mpi4py "
                             "communicator, got %r" % (comm,)) from None
        if any(not isinstance(r, int) or isinstance(r, bool) for r in world_ranks):
            raise ValueError("hvd.init(comm=...) takes a list of integer ranks, got %r" % (comm,))
        if via_comm:
            raise NotImplementedError("process sets made from MPI communicators need hvd.init's "
                                      "comm to be an MPI communicator (or None), not a list of "
                                      "ranks")
    if not _core.is_initialized():
        group = comm.Get_group() if _is_mpi_comm(comm) else None
        try:
            given = _sets_from_comms(comm, via_comm, group)
            given += [ps.ranks for ps in sets
                      if ps is not global_process_set and ps.mpi_comm is None]
            _core.init(given, dynamic, mpi_comm, world_ranks)
        except BaseException:
            if group is not None:
                group.Free()
            raise
        _free_world_group()
        _world_group = group
        # A list the engine took (not the world as launched, which it drops): MPI's world is
        # hvd's then, so communicators translate through it.
        _world_list = list(world_ranks) if world_ranks and _core.mpi_enabled() else None
        global_process_set.ranks = list(range(_core.size()))
        global_process_set.mpi_comm = comm if _is_mpi_comm(comm) else None
    _bind_process_sets(sets)


def _sets_from_comms(comm, via_comm, world_group):
    """Every distinct set of processes that the ranks' communicators of `via_comm` name, as
    lists of hvd's ranks, in Horovod's order: the communicators' in the order given, each one's
    sets by their ranks in the communicator's order. Collective over `comm` (hvd's world). A
    rank that cannot translate its communicator makes every rank raise, naming it."""
    global _world_group
    if not via_comm:
        return []
    out = []
    saved, _world_group = _world_group, world_group
    try:
        for index, ps in enumerate(via_comm):
            try:
                mine, error = _comm_world_ranks(ps.mpi_comm, "the ProcessSet of communicator "
                                                "number %d" % index), None
            except Exception as e:  # ValueError, or MPI's own on a freed communicator
                mine, error = None, "rank %d: %s" % (comm.Get_rank(), e)
            everyone = comm.allgather((mine, error))
            errors = [err for _, err in everyone if err]
            if errors:
                raise ValueError("hvd.init: " + "; ".join(errors))
            out.extend(sorted(ranks) for ranks in sorted({tuple(m) for m, _ in everyone}))
    finally:
        _world_group = saved
    return out


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
        if ps.mpi_comm is not None:  # this rank's members, which may differ from another's
            ps.ranks = sorted(_comm_world_ranks(ps.mpi_comm, "hvd.init: process_sets entry "
                                                "number %d" % index))
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
    if process_set.mpi_comm is not None:
        raise NotImplementedError("adding a process set made from an MPI communicator after "
                                  "hvd.init is not supported (as in Horovod): give its ranks, "
                                  "or pass it to hvd.init(process_sets=[...])")
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


def comm_process_set_id(comm):
    """The id of the process set whose ranks are the processes of mpi4py communicator `comm`
    (0 for one congruent with hvd's world). Raises ValueError where there is none."""
    if not _core.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if not _core.mpi_enabled():
        raise ValueError("comm_process_set_id: this job's ranks did not meet through MPI (start "
                         "it with mpirun or hvdrun --mpi), so MPI's ranks are not hvd's")
    ranks = tuple(sorted(_comm_world_ranks(comm, "comm_process_set_id")))
    for process_set_id, known in get_process_set_ids_and_ranks().items():
        if tuple(known) == ranks:
            return process_set_id
    raise ValueError("MPI communicator does not correspond to any registered process set.")


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
    _free_world_group()
    global_process_set.mpi_comm = None


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
    """As Horovod's: whether MPI, which this job uses, gives MPI_THREAD_MULTIPLE, so that the
    program may call MPI (mpi4py) alongside hvd. Raises ValueError where the job does not use
    MPI (started without mpirun, and HVD_CPU_OPERATIONS is not mpi), as Horovod's does."""
    if not _core.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if not _core.mpi_enabled():
        raise ValueError("Horovod MPI is not enabled: start the job with mpirun (or hvdrun --mpi), "
                         "or set HVD_CPU_OPERATIONS=mpi")
    return bool(_core.mpi_threads_supported())


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
