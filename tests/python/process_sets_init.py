"""hvd.init(process_sets=[...]) under hvdrun -np 3: the sets given at start get their ids in
order, work at once, and (without HOROVOD_DYNAMIC_PROCESS_SETS) no set can be added later.
As in Horovod, duplicates are not allowed: an entry whose ranks are the world's or an earlier
entry's is left without an id and init raises ValueError naming the first such entry, the
engine running with the others; the order a rank lists a set's ranks in does not matter.
Prints PROCESS-SETS-INIT-OK on success."""

import os

import torch

import hvd.torch as hvd

rank_env = int(os.environ["HOROVOD_RANK"])
outer = hvd.ProcessSet([0, 2] if rank_env != 1 else [2, 0])  # listed in another order on rank 1
everyone = hvd.ProcessSet([2, 1, 0])  # the world's ranks: a duplicate of the global set
lone = hvd.ProcessSet([1])
outer_again = hvd.ProcessSet([2, 0])  # an earlier entry's ranks
try:
    hvd.init(process_sets=[outer, everyone, lone, outer_again])
    raise AssertionError("hvd.init with duplicate process sets must raise ValueError")
except ValueError as e:
    assert "entry number 1 is a duplicate" in str(e) and "global process set" in str(e), str(e)
assert hvd.is_initialized()
r = hvd.rank()
assert hvd.size() == 3, "run with hvdrun -np 3"
assert (outer.process_set_id, lone.process_set_id) == (1, 2), (outer, lone)
assert everyone.process_set_id is None and outer_again.process_set_id is None, \
    (everyone, outer_again)
assert outer.ranks == [0, 2] and lone.ranks == [1]
assert hvd.get_process_set_ids_and_ranks() == {0: [0, 1, 2], 1: [0, 2], 2: [1]}, \
    hvd.get_process_set_ids_and_ranks()
assert [ps.process_set_id for ps in hvd.process_sets()] == [0, 1, 2]
assert hvd.process_set_by_id(1) is outer and hvd.process_set_by_id(0) is hvd.global_process_set
try:
    hvd.allreduce(torch.ones(1), process_set=outer_again)
    raise AssertionError("an op on a duplicate entry (no id) must raise ValueError")
except ValueError as e:
    assert "has not been added" in str(e), str(e)
mine = outer if r in (0, 2) else lone
y = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum, process_set=mine)
assert torch.equal(y, torch.full((2,), 2.0 if mine is outer else 1.0)), y
try:
    hvd.add_process_set([0, 1])
    raise AssertionError("add_process_set without HOROVOD_DYNAMIC_PROCESS_SETS must fail")
except ValueError as e:
    assert "HOROVOD_DYNAMIC_PROCESS_SETS" in str(e)
hvd.barrier()
print("PROCESS-SETS-INIT-OK rank %d" % r, flush=True)
