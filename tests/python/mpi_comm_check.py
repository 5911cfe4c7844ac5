"""hvd.init(comm=...) and ProcessSet(comm) with mpi4py communicators, under mpirun (np >= 3).

1. hvd.init(comm=subcomm) on each half of MPI_COMM_WORLD split by rank parity: two worlds run
   side by side; identity is the communicator's; allreduce (a grid of dtypes, counts and ops),
   allgather, broadcast and reducescatter give the values computed here from the members' MPI
   ranks.
2. hvd.init(comm=[last, 0]): only those two processes start hvd, hvd's rank i being MPI's rank
   comm[i]; a process outside the list that calls init with it is refused, naming itself.
3. hvd.init(process_sets=[ProcessSet(subcomm), ProcessSet([0, 1])]): every distinct set the
   ranks' communicators name is added (evens 1, odds 2) ahead of the sets given as ranks (3);
   comm_process_set_id; collectives over a communicator's set; a communicator's set cannot be
   added after init; a duplicate raises ValueError; the same objects work after a shutdown; a
   communicator with processes outside hvd's world on one rank makes every rank raise.
4. Bad input: a list with a repeated rank, a rank MPI_COMM_WORLD lacks, something that is
   neither a list nor a communicator: ValueError naming what was wrong, on every rank.

HVD_CPU_OPERATIONS=mpi runs the same over MPI's collectives on the communicators. Prints
MPI-COMM-OK on each rank that passes.
"""

import sys

import numpy as np
from mpi4py import MPI

import hvd.numpy as hvd

world = MPI.COMM_WORLD
me, n = world.Get_rank(), world.Get_size()
assert n >= 3, "run under mpirun -np 3 or more"


def expect_error(kind, needle, fn):
    try:
        fn()
    except kind as e:
        assert needle in str(e), "%s: %r lacks %r" % (kind.__name__, str(e), needle)
        return
    raise AssertionError("expected %s containing %r" % (kind.__name__, needle))


def value(mpi_rank, count, dtype):
    """What MPI rank `mpi_rank` contributes: small integers, exact in every dtype."""
    return ((np.arange(count) * 3 + mpi_rank * 7) % 11 + 1).astype(dtype)


def check_collectives(members, tag):
    """members[i]: the MPI rank of hvd's rank i."""
    assert hvd.size() == len(members) and members[hvd.rank()] == me, (hvd.rank(), members)
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.float16):
        for count in (0, 1, 7, 4099):
            mine = value(me, count, dtype)
            ref = [value(m, count, np.float64) for m in members]
            for op, reduce in ((hvd.Sum, sum), (hvd.Max, lambda a: np.maximum.reduce(a)),
                               (hvd.Min, lambda a: np.minimum.reduce(a))):
                got = hvd.allreduce(mine, op=op, name="%s.ar.%s.%d.%d" % (tag, np.dtype(dtype).name,
                                                                          count, op))
                want = reduce(ref) if count else np.zeros(0)
                assert got.dtype == mine.dtype and np.array_equal(got.astype(np.float64), want), \
                    (tag, dtype, count, op, got[:4], want[:4])
    rows = hvd.allgather(np.full((me % 3 + 1, 2), me, dtype=np.int64), name=tag + ".ag")
    want = np.concatenate([np.full((m % 3 + 1, 2), m, dtype=np.int64) for m in members])
    assert np.array_equal(rows, want), (tag, rows, want)
    got = hvd.broadcast(np.full(5, me, dtype=np.float32), root_rank=len(members) - 1,
                        name=tag + ".bc")
    assert np.array_equal(got, np.full(5, members[-1], dtype=np.float32)), (tag, got)
    k = len(members)
    part = hvd.reducescatter(np.full(2 * k, me + 1, dtype=np.float64), op=hvd.Sum,
                             name=tag + ".rs")
    assert np.array_equal(part, np.full(2, sum(m + 1 for m in members), dtype=np.float64)), \
        (tag, part)


# 1. Two worlds, one per parity.
half = world.Split(color=me % 2, key=me)
hvd.init(comm=half)
members = [r for r in range(n) if r % 2 == me % 2]
assert (hvd.rank(), hvd.size()) == (half.Get_rank(), half.Get_size())
# One host: every member shares this host's memory.
assert (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == \
    (hvd.rank(), hvd.size(), 0, 1), (hvd.local_rank(), hvd.local_size())
assert hvd.mpi_enabled() and hvd.global_process_set.mpi_comm is half
assert hvd.comm_process_set_id(half) == 0
check_collectives(members, "half")
hvd.shutdown()
world.Barrier()

# 2. A world of two listed ranks, in the list's order.
listed = [n - 1, 0]
if me in listed:
    hvd.init(comm=listed)
    check_collectives(listed, "listed")
    assert hvd.global_process_set.mpi_comm is None
    hvd.shutdown()
else:
    expect_error(ValueError, "rank %d of MPI_COMM_WORLD, which hvd.init(comm=[%d, 0]) does not list"
                 % (me, n - 1), lambda: hvd.init(comm=listed))
    assert not hvd.is_initialized()
world.Barrier()

# 3. Process sets from communicators, with comm=None (MPI_COMM_WORLD).
from_comm = hvd.ProcessSet(half)
assert from_comm.ranks is None and from_comm.mpi_comm is half
pair = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[from_comm, pair])
evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
assert hvd.get_process_set_ids_and_ranks() == {0: list(range(n)), 1: evens, 2: odds,
                                               3: [0, 1]}, hvd.get_process_set_ids_and_ranks()
assert from_comm.process_set_id == (1 if me % 2 == 0 else 2) and from_comm.ranks == members
assert pair.process_set_id == 3
assert hvd.comm_process_set_id(half) == from_comm.process_set_id
assert hvd.comm_process_set_id(world) == 0
lone = world.Split(color=0 if me == 0 else 1, key=me)
if me == 0:
    expect_error(ValueError, "does not correspond to any registered process set",
                 lambda: hvd.comm_process_set_id(lone))
got = hvd.allreduce(np.full(3, float(me)), op=hvd.Sum, name="set.ar", process_set=from_comm)
assert np.array_equal(got, np.full(3, float(sum(members)))), got
assert from_comm.rank() == members.index(me) and from_comm.size() == len(members)
if me in (0, 1):
    got = hvd.allgather(np.array([me]), name="pair.ag", process_set=pair)
    assert list(got) == [0, 1], got
expect_error(NotImplementedError, "MPI communicator", lambda: hvd.add_process_set(
    hvd.ProcessSet(half)))
# A second init binds new objects to the sets there are; a duplicate raises.
again = hvd.ProcessSet(half.Dup())
same = hvd.ProcessSet(members)
expect_error(ValueError, "entry number 1 is a duplicate", lambda: hvd.init(
    process_sets=[again, same]))
assert again.process_set_id == from_comm.process_set_id and same.process_set_id is None
hvd.barrier()
hvd.shutdown()
world.Barrier()
# The same objects again after a shutdown: still sets of communicators, not this rank's ranks.
hvd.init(process_sets=[from_comm, pair])
assert from_comm.process_set_id == (1 if me % 2 == 0 else 2) and pair.process_set_id == 3
got = hvd.allreduce(np.full(2, 1.0), op=hvd.Sum, name="set.again", process_set=from_comm)
assert np.array_equal(got, np.full(2, float(len(members)))), got
hvd.barrier()  # a set rank 0 is not in is negotiated by rank 0: it must not leave first
hvd.shutdown()
world.Barrier()

# A communicator with a process outside hvd's world on one rank of each world only (rank 0's
# and rank 1's {0, 1}): every rank of both worlds raises, naming that rank; nothing hangs.
mixed = world.Split(color=0 if me < 2 else me, key=me)
expect_error(ValueError, "rank 0: the ProcessSet of communicator number 0: the communicator "
             "has processes outside hvd's world", lambda: hvd.init(comm=half, process_sets=[
                 hvd.ProcessSet(mixed)]))
assert not hvd.is_initialized()
world.Barrier()

# 4. Bad input, refused on every rank before anything starts.
expect_error(ValueError, "must be distinct", lambda: hvd.init(comm=[0, 0]))
expect_error(ValueError, "names rank %d, but MPI_COMM_WORLD has %d processes" % (n + 5, n),
             lambda: hvd.init(comm=[0, n + 5]))
expect_error(ValueError, "takes a list of ranks or an mpi4py communicator",
             lambda: hvd.init(comm=3.5))
expect_error(ValueError, "ProcessSet takes a list of ranks or an mpi4py communicator",
             lambda: hvd.ProcessSet(object()))
assert not hvd.is_initialized()
world.Barrier()
sys.stdout.write("MPI-COMM-OK-%d\n" % me)
sys.stdout.flush()
