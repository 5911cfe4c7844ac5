"""Process set ids as Horovod gives them, under hvdrun -np 2 and 3 with
HOROVOD_DYNAMIC_PROCESS_SETS=1: a removed set's id goes to the next set added (the first
removed first), sets with the ranks of another are refused, the ids read through
hvd.mpi_ops._basics (where Horovod's tests read them) agree on every rank, and a set given a
removed set's id numbers its unnamed operations from 0.
Prints PROCESS-SETS-IDS-OK on success."""

import torch

import hvd.torch as hvd

hvd.init()
n = hvd.size()
table = hvd.mpi_ops._basics._get_process_set_ids_and_ranks
assert n >= 2, "run under hvdrun -np 2 or more"
assert table() == {0: list(range(n))}, table()

first = hvd.add_process_set([0])
second = hvd.add_process_set(range(1, n))
assert (first.process_set_id, second.process_set_id) == (1, 2), (first, second)
assert table() == {0: list(range(n)), 1: [0], 2: list(range(1, n))}, table()
# The same ids on every rank.
for ps in (first, second):
    got = hvd.allgather(torch.tensor([ps.process_set_id]))
    assert got.tolist() == [ps.process_set_id] * n, got
assert hvd.mpi_ops._basics._process_set_size(2) == n - 1
if hvd.rank() == 0:
    assert hvd.mpi_ops._basics._process_set_rank(1) == 0
else:
    try:
        hvd.mpi_ops._basics._process_set_rank(1)
        raise AssertionError("a rank outside set 1 has no rank in it")
    except ValueError:
        pass

# Removed, and added again: the set gets its id back.
assert hvd.remove_process_set(first) and first.process_set_id is None
assert table() == {0: list(range(n)), 2: list(range(1, n))}, table()
assert hvd.add_process_set(first) is first and first.process_set_id == 1, first
assert hvd.remove_process_set(first)

# The next set takes the removed one's id (at 2 ranks its ranks are the world's: refused).
if n > 2:
    third = hvd.add_process_set([0, n - 1])
    assert third.process_set_id == 1, third
    if hvd.rank() in (0, n - 1):
        got = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, process_set=third)
        assert got.item() == float(n - 1), got
else:
    try:
        hvd.add_process_set([0, n - 1])
        raise AssertionError("a set with the world's ranks is refused")
    except ValueError:
        pass
    third = None
for ranks in (range(n - 1, 0, -1), range(n)):  # the ranks of set 2, and the world's
    try:
        hvd.add_process_set(ranks)
        raise AssertionError("a set with the ranks of another is refused: %s" % list(ranks))
    except ValueError:
        pass

# Two ids free, the first freed first: 2 then 1 (3 ranks: set 1 went to the third set, removed
# after set 2), or 1 then 2 (2 ranks: id 1 was still free when set 2 was removed).
hvd.remove_process_set(second)
if third is not None:
    hvd.remove_process_set(third)
order = [2, 1] if third is not None else [1, 2]
again = [hvd.add_process_set([q]) for q in (n - 1, 0)]
assert [ps.process_set_id for ps in again] == order, (again, order)
fresh = hvd.add_process_set([0, 1]) if n > 2 else None
if fresh is not None:
    assert fresh.process_set_id == 3, fresh  # none free: the next unused id
    again.append(fresh)
for ps in again:
    hvd.remove_process_set(ps)
assert table() == {0: list(range(n))}, table()

# Unnamed operations are numbered per set id: a set that gets a removed set's id starts at 0 on
# every member, whatever the removed set's members had counted (else their names differ).
if n > 2:
    pair = hvd.add_process_set([0, 2])
    if hvd.rank() in (0, 2):
        for _ in range(2):
            hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=pair)
    reused = pair.process_set_id
    hvd.remove_process_set(pair)
    # Free now: ids 1 and 3 (removed above), then pair's; sets of one rank take the first two.
    fillers = [hvd.add_process_set([q]) for q in (1, 2)]
    other = hvd.add_process_set([0, 1])
    assert other.process_set_id == reused, (other, reused)
    if hvd.rank() in (0, 1):
        got = hvd.allreduce(torch.full((2,), float(hvd.rank() + 1)), op=hvd.Sum, process_set=other)
        assert got.tolist() == [3.0, 3.0], got
        assert hvd.broadcast_object("x%d" % hvd.rank(), root_rank=1, process_set=other) == "x1"
    for ps in [other] + fillers:
        hvd.remove_process_set(ps)
assert not hvd.remove_process_set(hvd.global_process_set)
hvd.barrier()
print("PROCESS-SETS-IDS-OK rank %d" % hvd.rank(), flush=True)
