"""hvd.elastic and hvd.torch.elastic: State, ObjectState, run_fn, TorchState, ElasticSampler.

Simulated worlds (4 ranks shrinking to 2) run inside one process through the sampler's
_partition(num_replicas, rank) or a patched size/rank; real collectives (sync, commit) run in
the real world, the same calls on every rank. Engine resets are fakes: no test restarts it.
"""

import collections
import copy
import functools
import math
import random

import pytest
import torch

import hvd
import hvd.torch as hvd_torch
from conftest import world
from hvd import elastic
from hvd.torch import elastic as torch_elastic


def object_state(**kwargs):
    return elastic.ObjectState(hvd_torch.broadcast_object, hvd.rank, **kwargs)


def test_names():
    assert hvd.HostsUpdatedInterrupt is elastic.HostsUpdatedInterrupt
    assert hvd_torch.HostsUpdatedInterrupt is elastic.HostsUpdatedInterrupt
    assert hvd_torch.elastic is torch_elastic
    assert torch_elastic.State is elastic.State and torch_elastic.ObjectState is elastic.ObjectState
    assert elastic.HostsUpdatedInterrupt().skip_sync is False
    assert elastic.HostsUpdatedInterrupt(True).skip_sync is True


def test_object_state_save_restore_commit():
    state = object_state(epoch=0, history=[])
    state.epoch = 3
    state.history.append(1)
    state.restore()
    assert (state.epoch, state.history) == (0, [])
    state.epoch = 3
    state.history.append(1)
    state.commit()
    for _ in range(2):  # a restore does not alias the saved copy
        state.epoch = 5
        state.history.append(2)
        state.restore()
        assert (state.epoch, state.history) == (3, [1])


def test_object_state_sync_takes_rank0_commit():
    r, _ = world()
    state = object_state(epoch=10 + r, name="first%d" % r)
    state.epoch = 20 + r
    state.name = "rank%d" % r
    state.commit()
    state.epoch = 99  # not committed: sync sends the committed values
    state.sync()
    assert (state.epoch, state.name) == (20, "rank0")
    object_state().sync()  # nothing to send: no broadcast


def test_check_host_updates_outside_elastic_job():
    object_state(epoch=0).check_host_updates()
    hosts_updated = getattr(hvd._core, "hosts_updated", None)
    if hosts_updated is not None:  # the same branch on every rank
        assert hosts_updated() is False


def test_commit_raises_when_hosts_updated(monkeypatch):
    monkeypatch.setattr(hvd._core, "hosts_updated", lambda: True, raising=False)
    state = object_state(epoch=0)
    state.epoch = 4
    with pytest.raises(elastic.HostsUpdatedInterrupt) as info:
        state.commit()
    assert info.value.skip_sync is False
    state.epoch = 7
    state.restore()
    assert state.epoch == 4  # saved before the check


class FakeState(elastic.State):
    """Logs the calls run_fn makes: save, restore, sync and reset (state.reset)."""

    def __init__(self, log):
        super().__init__(bcast_object=None, get_rank=lambda: 0)
        for name in ("save", "restore", "sync"):
            setattr(self, name, functools.partial(log.append, name))
        self.reset = functools.partial(log.append, "state.reset")


@pytest.mark.parametrize("error", [hvd.HvdError, hvd.PeerLostError, hvd.HvdTimeoutError])
def test_run_fn_retries_in_horovods_order(error):
    log = []
    state = FakeState(log)
    state.register_reset_callbacks([lambda: log.append("cb1")])
    state.register_reset_callbacks([lambda: log.append("cb2")])
    outcomes = iter([error("peer gone"), elastic.HostsUpdatedInterrupt(skip_sync=False),
                     elastic.HostsUpdatedInterrupt(skip_sync=True), None])

    def train(state, a, b=0):
        log.append("train")
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome
        return a + b

    wrapped = elastic.run_fn(train, lambda: log.append("engine.reset"))
    assert wrapped.__name__ == "train"
    assert wrapped(state, 1, b=2) == 3
    on_reset = ["engine.reset", "state.reset", "cb1", "cb2"]
    assert log == (["sync", "train", "restore"] + on_reset      # HvdError: back to the commit
                   + ["sync", "train"] + on_reset               # new hosts: keep the state
                   + ["sync", "train"] + on_reset               # skip_sync=True
                   + ["train"])


@pytest.mark.parametrize("error", [ValueError, hvd.InvalidArgumentError,
                                   hvd.FailedPreconditionError])
def test_run_fn_lets_other_errors_through(error):
    """The script's bugs end the job: a mismatch or a bad argument would meet every new world
    again (and Horovod's loop lets ValueErrors through as well)."""
    log = []

    def train(state):
        raise error("a bug")

    with pytest.raises(error):
        elastic.run_fn(train, lambda: log.append("engine.reset"))(FakeState(log))
    assert log == ["sync"]


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(),
                               torch.nn.Linear(3, 2)).double()


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def snapshot(model, opt):
    params = [t.clone() for t in model.state_dict().values()]
    return params, [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]


def assert_equal_snapshots(a, b):
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        assert torch.equal(x, y)


def test_torch_state_restores_model_and_optimizer_bit_exactly():
    model = make_model(0)
    opt = sgd(model)
    train_step(model, opt, 0)  # the momentum buffers exist
    state = torch_elastic.TorchState(model=model, optimizer=opt, epoch=0)
    state.epoch = 1
    state.commit()
    committed = snapshot(model, opt)
    train_step(model, opt, 1)
    after_one_step = snapshot(model, opt)
    assert not torch.equal(committed[0][0], after_one_step[0][0])
    train_step(model, opt, 2)
    state.epoch = 2
    state.restore()
    assert state.epoch == 1
    assert_equal_snapshots(snapshot(model, opt), committed)
    train_step(model, opt, 1)  # the same step from the same state: the same bits
    assert_equal_snapshots(snapshot(model, opt), after_one_step)


def test_torch_state_sync_takes_rank0_model_and_optimizer():
    r, _ = world()
    model = make_model(1 + r)
    opt = sgd(model)
    train_step(model, opt, r)
    reference = make_model(1)  # rank 0's, computed here
    reference_opt = sgd(reference)
    train_step(reference, reference_opt, 0)
    state = torch_elastic.TorchState(model=model, optimizer=opt, batch=r)
    state.sync()
    assert_equal_snapshots(snapshot(model, opt), snapshot(reference, reference_opt))
    assert state.batch == 0


def test_torch_state_swaps_handlers_and_keeps_none_as_attributes():
    a, b = make_model(0), make_model(5)
    state = torch_elastic.TorchState(model=a, optimizer=None, epoch=0)
    assert "optimizer" not in state._handlers and state.optimizer is None
    a_before = [t.clone() for t in a.state_dict().values()]
    state.model = b  # saves b
    assert state.model is b and state._handlers["model"].value is b
    b_before = [t.clone() for t in b.state_dict().values()]
    with torch.no_grad():
        for p in list(a.parameters()) + list(b.parameters()):
            p.add_(1.0)
    state.restore()
    assert all(torch.equal(x, y) for x, y in zip(b.state_dict().values(), b_before))
    assert not any(torch.equal(x, y) for x, y in zip(a.state_dict().values(), a_before))
    state.sync()  # None is an ObjectState attribute: broadcast with the rest
    assert state.optimizer is None and state.epoch == 0


def test_torch_state_handles_a_learning_rate_scheduler_in_place():
    """As Horovod's LRSchedulerStateHandler: the scheduler stays the object given (driving the
    real optimizer), restore rolls its counters back with the optimizer's lr, and sync takes
    rank 0's."""
    r, _ = world()
    model = make_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    state = torch_elastic.TorchState(model=model, optimizer=opt, scheduler=sched,
                                     plateau=plateau, epoch=0)
    assert state.scheduler is sched and state.plateau is plateau
    assert isinstance(state._handlers["scheduler"], torch_elastic.LRSchedulerStateHandler)
    state.commit()
    for _ in range(2):
        opt.step()
        sched.step()
    plateau.step(1.0)
    assert sched.last_epoch == 2 and opt.param_groups[0]["lr"] == pytest.approx(0.025)
    state.restore()
    assert state.scheduler is sched and sched.optimizer is opt
    assert sched.last_epoch == 0 and opt.param_groups[0]["lr"] == pytest.approx(0.1)
    assert plateau.last_epoch == 0
    # Sync: every rank takes rank 0's counters (rank r has stepped r times).
    for _ in range(r):
        sched.step()
    state.sync()
    assert sched.last_epoch == 0 and state.scheduler is sched


def test_handler_registry_takes_a_handler_of_ones_own():
    """Horovod's get_handler_registry / set_handler_registry: a handler for a type of one's
    own, subclassing StateHandler; save, restore and sync go through it."""
    from hvd.torch.elastic import state as state_module

    class Counter:
        def __init__(self):
            self.n = 0

    class CounterHandler(state_module.StateHandler):
        def save(self):
            self.saved = self.value.n

        def restore(self):
            self.value.n = self.saved

        def sync(self):
            self.value.n = hvd_torch.broadcast_object(self.value.n, root_rank=0)

    registry = state_module.get_handler_registry()
    state_module.set_handler_registry(registry + [(Counter, CounterHandler)])
    try:
        c = Counter()
        state = torch_elastic.TorchState(counter=c)
        assert state.counter is c
        c.n = 5
        state.commit()
        c.n = 7
        state.restore()
        assert c.n == 5 and state.counter is c
    finally:
        state_module.set_handler_registry(registry)
    assert state_module.get_handler_registry() is registry


def shuffled(length, seed, epoch):
    order = list(range(length))
    random.Random(seed + epoch).shuffle(order)
    return order


def partitions(sampler, num_replicas):
    parts = []
    for r in range(num_replicas):
        sampler._partition(num_replicas, r)
        parts.append(list(sampler))
        assert len(sampler) == len(parts[-1])
    return parts


@pytest.mark.parametrize("length,num_replicas", [(0, 2), (1, 1), (12, 4), (13, 4), (13, 3),
                                                 (2, 7), (31, 7)])
def test_sampler_covers_the_dataset_once_per_epoch(length, num_replicas):
    sampler = torch_elastic.ElasticSampler(list(range(length)), shuffle=True, seed=3)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        parts = partitions(sampler, num_replicas)
        per_rank = math.ceil(length / num_replicas)
        assert [len(p) for p in parts] == [per_rank] * num_replicas
        # Padding repeats the epoch's order from its start (cyclically when it is shorter).
        counts = collections.Counter(i for p in parts for i in p)
        order = shuffled(length, 3, epoch)
        pad = per_rank * num_replicas - length
        expected = collections.Counter(order + [order[k % length] for k in range(pad)])
        assert counts == expected
        again = torch_elastic.ElasticSampler(list(range(length)), shuffle=True, seed=3)
        again.set_epoch(epoch)
        assert partitions(again, num_replicas) == parts  # deterministic in (seed, epoch)


def test_sampler_without_shuffle_deals_round_robin():
    sampler = torch_elastic.ElasticSampler(list(range(10)), shuffle=False)
    assert partitions(sampler, 3) == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert sampler.get_indices(0, 3) == [2, 5, 8] and sampler.get_indices(1, 3) == [1]


def test_sampler_in_the_real_world_with_a_dataloader():
    r, n = world()
    dataset = torch.utils.data.TensorDataset(torch.arange(11))
    sampler = torch_elastic.ElasticSampler(dataset, seed=1)
    assert (sampler.num_replicas, sampler.rank) == (n, r)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
    mine = []
    for i, (x,) in enumerate(loader):
        assert x.tolist() == sampler.get_indices(i, 2)
        mine += x.tolist()
    everyone = hvd_torch.allgather_object(mine)
    assert set().union(*everyone) == set(range(11))
    assert sum(len(m) for m in everyone) == n * math.ceil(11 / n)


@pytest.mark.parametrize("length", [24, 25])
def test_sampler_resumes_after_the_world_shrinks(monkeypatch, length):
    batch = 2
    old = [torch_elastic.ElasticSampler(list(range(length)), seed=7) for _ in range(4)]
    for r, s in enumerate(old):
        s._partition(4, r)
    before = []
    for b in range(2):  # two batches on each of 4 ranks, recorded by every rank
        for s in old:
            before += s.get_indices(b, batch)
        for s in old:
            s.record_batch(b, batch)
    assert all(s.processed_indices == set(before) for s in old)  # every rank knows them all
    committed = old[0].state_dict()  # rank 3 dies; rank 0's commit is enough
    monkeypatch.setattr(torch_elastic, "size", lambda: 2)
    after = []
    for r in range(2):
        monkeypatch.setattr(torch_elastic, "rank", lambda r=r: r)
        s = torch_elastic.ElasticSampler(list(range(length)), seed=7)
        s.load_state_dict(committed)
        assert (s.num_replicas, s.rank) == (2, r)
        after += list(s)
    if length == 24:  # 16 done, 8 left: 4 each, nothing repeated or skipped
        assert sorted(before + after) == list(range(length))
    else:  # 25: 16 done, 9 left: 5 each, the first remaining sample (in order) twice
        remaining = [i for i in shuffled(length, 7, 0) if i not in set(before)]
        assert sorted(before + after) == sorted(list(range(length)) + remaining[:1])


def test_sampler_counts_as_newer_horovod(monkeypatch):
    """Horovod's newer sampler counts: processed_num is every rank's samples recorded this
    epoch, record_batch adds the next batch of every rank since the last reset (whatever its
    batch_idx), and a state dict of only epoch and processed_num loads as that prefix of the
    epoch's order. Two ranks, simulated."""
    monkeypatch.setattr(torch_elastic, "size", lambda: 2)
    monkeypatch.setattr(torch_elastic, "rank", lambda: 1)
    s = torch_elastic.ElasticSampler(list(range(20)), seed=3)
    order = shuffled(20, 3, 0)
    assert s.processed_num == 0 and len(s) == 10
    s.record_batch(0, 3)
    s.record_batch(7, 3)  # the index is not read: the next 3 rows of both ranks
    assert s.processed_num == 12 and s.processed_indices == set(order[:12])
    saved = copy.deepcopy(s.state_dict())  # as a commit keeps it
    assert saved["processed_num"] == 12 and saved["epoch"] == 0
    s.record_batch(2, 3)
    assert s.processed_num == 18
    s.load_state_dict(saved)  # a restore: the partition starts again after the 12
    assert s.processed_num == 12 and len(s) == 4 and list(s) == order[13::2]
    s.record_batch(5, 3)  # rows 0-2 of the new partition
    assert s.processed_indices == set(order[:18])
    s.record_batch(0, 3)  # one row left per rank
    assert s.processed_num == 20
    counted = torch_elastic.ElasticSampler(list(range(20)), seed=3)
    counted.load_state_dict({"epoch": 0, "processed_num": 6})  # a newer Horovod's state dict
    assert counted.processed_indices == set(order[:6]) and list(counted) == order[7::2]
    counted.set_epoch(1)
    assert counted.processed_num == 0 and len(counted) == 10


def test_sampler_state_save_restore_and_sync():
    r, n = world()
    sampler = torch_elastic.ElasticSampler(list(range(10)), seed=0)
    sampler.set_epoch(5 + r)
    sampler.record_indices([r])
    state = torch_elastic.TorchState(sampler=sampler)
    for _ in range(2):  # restore does not alias the saved state
        sampler.record_indices([9])
        state.restore()
        assert sampler.processed_indices == {r} and sampler.epoch == 5 + r
    state.sync()  # every rank's progress, rank 0's epoch
    assert sampler.processed_indices == set(range(n)) and sampler.epoch == 5
    assert len(sampler) == math.ceil((10 - n) / n)


def test_torch_state_run_resumes_the_epoch_after_a_host_update(monkeypatch):
    r, n = world()
    answers = iter([False, True])  # the second commit sees new hosts (the same on every rank)
    monkeypatch.setattr(hvd._core, "hosts_updated", lambda: next(answers, False), raising=False)
    dataset = torch.utils.data.TensorDataset(torch.arange(30))
    sampler = torch_elastic.ElasticSampler(dataset, seed=2)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
    state = torch_elastic.TorchState(sampler=sampler, batch=0)
    resets, seen = [], []
    state.register_reset_callbacks([lambda: resets.append(len(sampler))])

    def train(state):
        for state.batch, (x,) in enumerate(loader):
            seen.extend(x.tolist())
            state.sampler.record_batch(state.batch, 2)
            state.commit()
        return "done"

    assert torch_elastic.run_fn(train, lambda: None)(state) == "done"
    left = math.ceil((30 - 2 * 2 * n) / n)  # per rank, after two batches of 2 on every rank
    assert resets == [left]
    assert len(seen) == 2 * 2 + left
    everyone = hvd_torch.allgather_object(seen)
    assert set().union(*everyone) == set(range(30))
    if 30 % n == 0:  # the rest splits evenly: nothing seen twice
        assert sum(len(s) for s in everyone) == 30
