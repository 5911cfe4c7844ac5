"""Elastic training without a framework: horovod.common.elastic's State, ObjectState and run.

A training function wrapped by :func:`run` is retried after a failure instead of ending the job:

1. ``state.sync()`` makes every rank hold rank 0's state (skipped when the previous attempt
   ended with ``HostsUpdatedInterrupt(skip_sync=True)``).
2. ``func(state, ...)`` runs; its return value is returned.
3. On ``HvdError`` (``HorovodInternalError``: a peer was lost, a timeout, ...) every rank goes
   back to its last ``state.commit()`` with ``state.restore()``. Not on the ones that are also
   ``ValueError``s (``InvalidArgumentError``, ``FailedPreconditionError``: a mismatch, a bad
   argument): they are the script's, and end the job as any other exception does.
   On ``HostsUpdatedInterrupt`` (raised by ``state.commit()`` when the launcher published a new
   world) the state is kept as it is.
4. ``reset()`` restarts the engine in the new world (a worker hvdrun left out of it exits
   quietly), ``state.on_reset()`` runs ``state.reset()``
   and the registered callbacks, and the loop goes back to 1.

The number of resets is bounded by the launcher, not here. Thread-safety: a State belongs to
the training thread; nothing here is safe to call from two threads at once.
"""

import copy
import functools
import sys

from hvd import FailedPreconditionError, HvdError, _core, init, shutdown


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``State.commit()`` when the set of hosts changed: :func:`run` resets the engine
    without restoring the committed state. ``skip_sync``: whether the next attempt may skip
    ``state.sync()`` (hvd always raises it with False: the new ranks need the state)."""

    def __init__(self, skip_sync=False):
        super().__init__("the hosts of the elastic job were updated")
        self.skip_sync = skip_sync


class State:
    """What an elastic job keeps across resets. Subclasses define save, restore and sync.

    ``bcast_object(obj)`` returns rank 0's obj on every rank; ``get_rank()`` returns this rank.
    Unlike Horovod, no listener thread queues host updates: ``check_host_updates`` asks the
    engine with a collective (``_core.hosts_updated``), so every rank agrees without a
    separate broadcast.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Adds callables run (in order) after every reset, e.g. to rescale the learning rate."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (the point a failure rolls back to), then checks for new hosts.
        Collective: every rank commits at the same step."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when the launcher published a newer world.
        Collective. A no-op outside an elastic job, or with a core built without the check."""
        hosts_updated = getattr(_core, "hosts_updated", None)
        if hosts_updated is not None and hosts_updated():
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self):
        """Keeps a copy of the state in memory."""
        raise NotImplementedError()

    def restore(self):
        """Goes back to the last saved copy."""
        raise NotImplementedError()

    def sync(self):
        """Makes every rank's state equal to rank 0's. Collective."""
        raise NotImplementedError()

    def reset(self):
        """Called after the engine restarted in a new world, before the callbacks."""


class ObjectState(State):
    """State held in attributes: ``ObjectState(bcast, get_rank, epoch=0, batch=0)`` gives
    ``state.epoch`` and ``state.batch``. Values must pickle.

    Differs from Horovod: save and restore deep-copy the values, so an attribute mutated in
    place (a list, a dict) after a commit still rolls back.
    """

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {name: copy.deepcopy(getattr(self, name))
                             for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


def run_fn(func, reset):
    """Wraps ``func(state, *args, **kwargs)`` in the retry loop described at the top of this
    module; ``reset()`` restarts the engine."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                    # hvdrun may now make this worker the rank 0 of a later world.
                    _core.elastic_state_synced()
                return func(state, *args, **kwargs)
            except HvdError as e:
                # A mismatch or a bad argument (InvalidArgumentError, FailedPreconditionError:
                # ValueErrors, which Horovod's retry loop lets through too) is the script's bug,
                # which a new world would only meet again.
                if isinstance(e, ValueError):
                    raise
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            try:
                reset()
            except FailedPreconditionError as e:
                if "has no place in world" not in str(e):
                    raise
                # hvdrun left this worker out of the new world (its host was blacklisted or
                # removed) and is stopping it: leave quietly.
                print("hvd.elastic: %s; this worker exits" % e, file=sys.stderr, flush=True)
                raise SystemExit(0) from None
            state.on_reset()

    return wrapper


def _reset():
    shutdown()
    init()


def run(func):
    """Decorator: ``@hvd.elastic.run def train(state): ...``; see the top of this module."""
    return run_fn(func, _reset)
