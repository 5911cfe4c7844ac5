"""hvd.init(process_sets=[...]) under hvdrun -np 3: the sets given at start get their ids in
order, work at once, and (without HOROVOD_DYNAMIC_PROCESS_SETS) no set can be added later.
As in Horovod (its test_process_sets_static), a set whose ranks are the world's or an earlier
set's names that set and takes no id, and the order a rank lists a set's ranks in does not
matter. Prints PROCESS-SETS-INIT-OK on success."""

import os

import torch

import hvd.torch as hvd

rank_env = int(os.environ["HOROVOD_RANK"])
outer = hvd.ProcessSet([0, 2] if rank_env != 1 else [2, 0])  # listed in another order on rank 1
everyone = hvd.ProcessSet([2, 1, 0])  # the world's ranks: the global set
lone = hvd.ProcessSet([1])
outer_again = hvd.ProcessSet([2, 0])  # an earlier set's ranks
hvd.init(process_sets=[outer, everyone, lone, outer_again])
r = hvd.rank()
assert hvd.size() == 3, "run with hvdrun -np 3"
assert (outer.process_set_id, lone.process_set_id) == (1, 2), (outer, lone)
assert everyone.process_set_id == 0 and outer_again.process_set_id == 1, (everyone, outer_again)
assert outer.ranks == [0, 2] and lone.ranks == [1] and everyone.ranks == [0, 1, 2]
assert hvd.get_process_set_ids_and_ranks() == {0: [0, 1, 2], 1: [0, 2], 2: [1]}, \
    hvd.get_process_set_ids_and_ranks()
assert [ps.process_set_id for ps in hvd.process_sets()] == [0, 1, 2]
assert hvd.process_set_by_id(1) is outer and hvd.process_set_by_id(0) is hvd.global_process_set
y = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum, process_set=outer_again if r != 1
                  else lone)
assert torch.equal(y, torch.full((2,), 2.0 if r != 1 else 1.0)), y
y = hvd.allreduce(torch.full((1,), float(r)), op=hvd.Sum, process_set=everyone)
assert torch.equal(y, torch.full((1,), 3.0)), y
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
