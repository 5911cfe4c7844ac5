"""Elastic training for PyTorch: horovod.torch.elastic's run, TorchState and ElasticSampler.

    import hvd.torch as hvd
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state): ...          # state.commit() every few batches

The retry loop is hvd.elastic's (see that module). Thread-safety: a TorchState and its sampler
belong to the training thread.
"""

import copy
import math
import random

import torch

from hvd import rank, size
from hvd.elastic import (  # noqa: F401  (State and HostsUpdatedInterrupt are re-exported)
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    _reset,
    run_fn,
)
from hvd.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)


def run(func):
    """Decorator: retries ``func(state, ...)`` after a failure or a new world (hvd.elastic.run)."""
    return run_fn(func, _reset)


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: splits the samples not yet processed this epoch among the
    current ranks, so a job that shrinks or grows mid-epoch resumes where it left off.

    Every ``reset()`` (at construction, ``set_epoch``, ``load_state_dict`` and after an elastic
    reset) orders all indices (shuffled with ``random.Random(seed + epoch)`` when ``shuffle``),
    drops ``processed_indices``, pads the rest to a multiple of the number of ranks by repeating
    it from its start, and gives rank r the slice ``padded[r::num_replicas]``. Batches index
    that slice: ``get_indices(i, b)`` is ``indices[i * b:(i + 1) * b]``.

    As in Horovod's newer versions, ``record_batch(i, b)`` records the next ``b`` samples of
    EVERY rank since the last reset (rank r's are ``padded[r::num_replicas][k:k + b]`` after k
    rows recorded, known locally since ranks step together), not only this rank's as Horovod's
    older versions did. A commit then holds the whole world's progress, and the samples of a
    rank that dies stay processed (a union taken by ``sync`` would miss them).
    ``load_state_dict`` copies the set, so a restore cannot alias the saved state.

    Newer Horovod versions count instead of listing: ``processed_num`` (the samples of every rank
    processed this epoch, a prefix of the epoch's order) and a state dict of ``epoch`` and
    ``processed_num``. Both are here: ``processed_num`` is the size of ``processed_indices``,
    ``state_dict()`` holds both keys, and ``load_state_dict`` takes either (a count marks that
    many samples from the start of the epoch's order).
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        # torch's Sampler.__init__ does nothing (and its argument is deprecated): not called.
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self._padded = []
        self._rows = 0  # rows of every rank recorded since the last reset (record_batch)
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch ``epoch``: forgets the processed samples and repartitions. As in Horovod,
        this also clears progress when called with the current epoch."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks the next ``batch_size`` samples of every rank since the last reset as
        processed: batch ``batch_idx`` of a loop over this sampler that started at that reset.
        As in Horovod's newer versions, the count is what matters (``batch_idx`` is not read),
        so a loop that numbers its batches from before a reset records the right samples."""
        start = self._rows
        end = min(start + batch_size, self.num_samples)
        if start < end:
            # Rank r's j-th sample is padded[r + j * num_replicas]: batch rows start..end-1 of
            # all ranks are one contiguous run of padded.
            self.record_indices(self._padded[start * self.num_replicas:end * self.num_replicas])
            self._rows = end

    def record_indices(self, indices):
        self.processed_indices.update(indices)

    @property
    def processed_num(self):
        """The number of samples (of every rank) processed this epoch."""
        return len(self.processed_indices)

    @processed_num.setter
    def processed_num(self, count):
        self.processed_indices = set(self._order()[:count])

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch ``batch_idx``."""
        start = batch_idx * batch_size
        end = min(start + batch_size, len(self.indices))
        return self.indices[start:end]

    def state_dict(self):
        return dict(epoch=self.epoch, processed_indices=self.processed_indices,
                    processed_num=self.processed_num)

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        if "processed_indices" in state_dict:
            self.processed_indices = set(state_dict["processed_indices"])
        else:  # a newer Horovod's: a count from the start of the epoch's order
            self.processed_num = int(state_dict["processed_num"])
        self.reset()

    def reset(self):
        """Repartitions the remaining samples for the engine's current size and rank."""
        self._partition(size(), rank())

    def _order(self):
        """The epoch's order of all indices."""
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def _partition(self, num_replicas, rank):
        self.num_replicas = num_replicas
        self.rank = rank
        self._rows = 0
        order = self._order()
        remaining = [i for i in order if i not in self.processed_indices]
        self.remaining_indices = remaining
        self.num_samples = math.ceil(len(remaining) / num_replicas)
        self.total_size = self.num_samples * num_replicas
        pad = self.total_size - len(remaining)
        # Cyclic, so fewer remaining samples than ranks still fill every rank's slot.
        self._padded = remaining + [remaining[i % len(remaining)] for i in range(pad)]
        self.indices = self._padded[rank::num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples


class StateHandler:
    """Saves, restores and syncs one attribute of a TorchState whose value is an object updated
    in place (a model, an optimizer, a scheduler, a sampler). Horovod's interface: a handler of
    one's own subclasses this, overrides save, restore and sync, and goes in the registry
    (set_handler_registry). reset runs after every elastic reset; it does nothing here."""

    def __init__(self, value):
        self.value = value
        self.save()

    def set_value(self, value):
        self.value = value
        self.save()

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass


class _StateDictHandler(StateHandler):
    """A value with a state_dict: a deep copy of it is the commit, load_state_dict restores it
    in place."""

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class LRSchedulerStateHandler(_StateDictHandler):
    """A learning-rate scheduler: its counters (last_epoch, ...) are committed and restored with
    the optimizer it drives, and rank 0's are broadcast at sync."""

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


class SamplerStateHandler(_StateDictHandler):
    def sync(self):
        # Every rank's progress, then rank 0's epoch with it, so all ranks partition alike.
        processed = set().union(*allgather_object(self.value.processed_indices))
        state_dict = dict(self.value.state_dict(), processed_indices=processed,
                          processed_num=len(processed))
        self.value.load_state_dict(broadcast_object(state_dict, root_rank=0))

    def reset(self):
        self.value.reset()


def _scheduler_types():
    """Horovod registers torch's _LRScheduler; newer torch derives its schedulers from
    LRScheduler, and ReduceLROnPlateau from neither in older ones: all of them."""
    sched = torch.optim.lr_scheduler
    kinds = [getattr(sched, name, None)
             for name in ("LRScheduler", "_LRScheduler", "ReduceLROnPlateau")]
    return tuple(dict.fromkeys(k for k in kinds if k is not None))


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (_scheduler_types(), LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """The (type, handler class) pairs TorchState tries in order on each keyword's value."""
    return _handler_registry


def set_handler_registry(registry):
    """Replaces the registry (for TorchStates made from now on)."""
    global _handler_registry
    _handler_registry = registry


class TorchState(ObjectState):
    """Horovod's TorchState: ``TorchState(model=m, optimizer=o, sampler=s, epoch=0, ...)``.

    Modules, optimizers, learning-rate schedulers and ElasticSamplers (under any keyword; the
    types in get_handler_registry()) are saved as deep copies of their state_dict, restored in
    place with load_state_dict and synced from rank 0 with broadcast_parameters,
    broadcast_optimizer_state, broadcast_object, and the union of every rank's processed
    samples. Other values (None included) are ObjectState attributes. ``state.model = other``
    makes the handler follow the new object (and saves it). Differs from Horovod: ``reset()``
    (run after every elastic reset) repartitions the samplers for the new world, also when
    the next attempt skips ``sync``.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs = dict(model=model, optimizer=optimizer, **kwargs)
        handlers = {}
        for name, value in list(kwargs.items()):
            for kind, handler in _handler_registry:
                if isinstance(value, kind):
                    handlers[name] = handler(kwargs.pop(name))
                    break
        # Straight into __dict__: __setattr__ would route these through the handlers again.
        vars(self).update({name: handler.value for name, handler in handlers.items()})
        self._handlers = handlers
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def __setattr__(self, name, value):
        handlers = vars(self).get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self):
        for handler in self._handlers.values():
            getattr(handler, "reset", lambda: None)()  # a handler of one's own may lack it
        super().reset()
