"""hvd.init(process_sets=[...]) under hvdrun -np 3: the sets given at start get their ids in
order, work at once, and (without HOROVOD_DYNAMIC_PROCESS_SETS) no set can be added later.
Prints PROCESS-SETS-INIT-OK on success."""

import torch

import hvd.torch as hvd

outer = hvd.ProcessSet([0, 2])
lone = hvd.ProcessSet([1])
hvd.init(process_sets=[outer, lone])
r = hvd.rank()
assert hvd.size() == 3, "run with hvdrun -np 3"
assert (outer.process_set_id, lone.process_set_id) == (1, 2), (outer, lone)
assert outer.ranks == [0, 2] and lone.ranks == [1]
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
