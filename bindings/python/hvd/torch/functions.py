"""Helpers that move model state between ranks: parameters, optimizer state, Python objects."""

import pickle

import numpy as np
import torch

from hvd import _core, _ops, _process_set_id, global_process_set
from hvd.torch.mpi_ops import (
    allgather,
    broadcast_,
    broadcast_async_,
    synchronize,
)


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Copies root_rank's tensors into every rank's, in place.

    params: a state_dict (dict name -> tensor), model.named_parameters() (pairs) or a list of
    tensors. All broadcasts are enqueued before any is waited on, so they fuse. root_rank is a
    world rank, as in Horovod, also with a process_set.
    """
    _process_set_id(process_set)
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = []
        for i, p in enumerate(params):
            items.append(p if isinstance(p, tuple) else ("param.%d" % i, p))
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not torch.is_tensor(p):
            raise ValueError("broadcast_parameters: %s is a %s, not a tensor"
                             % (name, type(p).__name__))
        handles.append(broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p,
                                        root_rank, "bp." + str(name), process_set))
    for h in handles:
        synchronize(h)


def _dumps(obj):
    """obj's bytes, by cloudpickle as in Horovod (lambdas and closures go by value), or by
    pickle where cloudpickle is not installed. Either is read back by pickle.loads."""
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(obj)
    return cloudpickle.dumps(obj)


def _object_op_name(name, process_set):
    # Not type(obj).__name__ as Horovod does: non-root ranks often pass None, and the names
    # must agree across ranks. Unnamed calls take the next number of the set's counter.
    return name if name is not None else _ops.op_name("object", None, _process_set_id(process_set))


def _payload(obj, kind, first_op, process_set):
    """obj pickled into a uint8 tensor; an object that cannot be pickled fails the object op's
    first collective (`kind` named `first_op`) on every rank too, not here alone."""
    try:
        return torch.from_numpy(np.frombuffer(_dumps(obj), dtype=np.uint8).copy())
    except Exception as e:
        _ops.refuse(kind, first_op, _process_set_id(process_set), e)
        raise


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's obj (cloudpickled) on every rank of process_set (root_rank is a world
    rank)."""
    name = _object_op_name(name, process_set)
    if _core.rank() == root_rank:
        payload = _payload(obj, "broadcast", "bo.%s.size" % name, process_set)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, "bo.%s.size" % name, process_set)
    if _core.rank() != root_rank:
        payload = torch.empty(int(length[0]), dtype=torch.uint8)
    broadcast_(payload, root_rank, "bo.%s.data" % name, process_set)
    if _core.rank() == root_rank:
        return obj
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's obj (cloudpickled) in process_set, in rank order."""
    name = _object_op_name(name, process_set)
    payload = _payload(obj, "allgather", "ao.%s.size" % name, process_set)
    sizes = allgather(torch.tensor([payload.numel()], dtype=torch.int64),
                      name="ao.%s.size" % name, process_set=process_set).tolist()
    data = allgather(payload, name="ao.%s.data" % name, process_set=process_set).numpy()
    result, offset = [], 0
    for n in sizes:
        result.append(pickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return result


def _state_layout(optimizer):
    """Root's description of the optimizer: options per group, and per parameter (by position
    in param_groups) its state's tensors (shape, dtype, and whether it lies on its parameter's
    device: Adam's moments do, its step counter stays on the CPU) and plain values."""
    groups, state = [], {}
    index = 0
    for group in optimizer.param_groups:
        groups.append({k: v for k, v in group.items() if k != "params"})
        for p in group["params"]:
            entry = {}
            for key, value in optimizer.state.get(p, {}).items():
                if torch.is_tensor(value):
                    entry[key] = ("tensor", tuple(value.shape), value.dtype,
                                  value.device == p.device)
                else:
                    entry[key] = ("value", value)
            if entry:
                state[index] = entry
            index += 1
    return {"groups": groups, "state": state}


def _params_layout(optimizer):
    """What must be the same on every rank for the root's state to fit: the optimizer's class
    and each group's parameters' shapes."""
    return (type(optimizer).__name__,
            [[tuple(p.shape) for p in g["params"]] for g in optimizer.param_groups])


def _params_difference(root, mine):
    """How this rank's _params_layout differs from the root's, or "" where it does not."""
    if root[0] != mine[0]:
        return "%s, not the root's %s" % (mine[0], root[0])
    if len(root[1]) != len(mine[1]):
        return "%d param groups, not the root's %d" % (len(mine[1]), len(root[1]))
    for g, (theirs, ours) in enumerate(zip(root[1], mine[1])):
        if len(theirs) != len(ours):
            return ("%d parameters in param group %d, not the root's %d"
                    % (len(ours), g, len(theirs)))
        for i, (a, b) in enumerate(zip(theirs, ours)):
            if a != b:
                return ("shape %s for parameter %d of param group %d, not the root's %s"
                        % (list(b), i, g, list(a)))
    return ""


def _take_first_step(optimizer, step=True):
    """Horovod's way to create a fresh optimizer's state: zero gradients, one step."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    if not step:
        return
    if type(optimizer).__module__ == "hvd.torch.optimizer":  # a DistributedOptimizer
        super(type(optimizer), optimizer).step()  # its wrapped class's: no allreduce
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Makes every rank's optimizer state (options such as lr, momentum buffers, Adam moments
    and steps) equal to root_rank's.

    State that an optimizer creates lazily on its first step works too: the root describes its
    state (a pickled broadcast), other ranks create missing tensors with the same shapes and
    drop state the root does not have, then every tensor is broadcast in place.

    As in Horovod, an optimizer with no state yet creates it first: every parameter that
    requires a gradient gets a zero gradient, and the optimizer takes one step on them (a
    DistributedOptimizer's own step, which does not communicate). So Adam's step count is 1
    afterwards, momentum buffers exist, and weight decay has acted once on the parameters, as
    under Horovod. Unlike Horovod, the other ranks take that step only where the root took it
    (its state was empty too), with the root's options: a root with state (a checkpoint it
    resumed from) gives all of it, and a step elsewhere would only move those ranks'
    parameters (weight decay) away from the root's.
    """
    _process_set_id(process_set)
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS")
    # Every rank raises where one's optimizer differs from the root's (the root too: it would
    # wait in the broadcasts for the ranks that raised), naming each such rank and what
    # differs, before anything changes (the root's first step below).
    ps = _process_set_id(process_set)
    layouts = allgather_object(_params_layout(optimizer), name="optimizer_state.check",
                               process_set=process_set)
    world = list(_core.process_set_ranks(ps)) if ps else list(range(len(layouts)))
    if root_rank not in world:
        raise ValueError("broadcast_optimizer_state: root_rank %r is not a rank of the process "
                         "set %s" % (root_rank, world))
    theirs = layouts[world.index(root_rank)]
    differences = [(r, _params_difference(theirs, mine)) for r, mine in zip(world, layouts)]
    differ = ["rank %d: %s" % (r, d) for r, d in differences if d]
    if differ:
        raise ValueError("broadcast_optimizer_state: the optimizer differs from root rank %d's: %s"
                         % (root_rank, "; ".join(differ)))
    root = _core.rank() == root_rank
    primed = False
    if root and len(optimizer.state) == 0:
        _take_first_step(optimizer)
        primed = True
    layout = broadcast_object(dict(_state_layout(optimizer), primed=primed) if root else None,
                              root_rank, name="optimizer_state", process_set=process_set)
    if not root and len(optimizer.state) == 0:
        for group, options in zip(optimizer.param_groups, layout["groups"]):
            group.update(options)
        _take_first_step(optimizer, step=layout["primed"])
    tensors = []
    index = 0
    for group, options in zip(optimizer.param_groups, layout["groups"]):
        group.update(options)
        for p in group["params"]:
            entry = layout["state"].get(index)
            if entry is None:
                optimizer.state.pop(p, None)
            else:
                mine = optimizer.state.setdefault(p, {})
                for key in [k for k in mine if k not in entry]:
                    del mine[key]
                for key, desc in entry.items():
                    if desc[0] == "value":
                        mine[key] = desc[1]
                        continue
                    _, shape, dtype, on_param_device = desc
                    # Where the root keeps it, on this rank: its parameter's device (each rank's
                    # own GPU), or the CPU.
                    device = p.device if on_param_device else torch.device("cpu")
                    t = mine.get(key)
                    if (not torch.is_tensor(t) or tuple(t.shape) != shape or t.dtype != dtype
                            or t.device != device):
                        mine[key] = t = torch.zeros(shape, dtype=dtype, device=device)
                    tensors.append(("%d.%s" % (index, key), t))
            index += 1
    broadcast_parameters(tensors, root_rank, process_set)
