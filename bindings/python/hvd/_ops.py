"""Framework-neutral collectives: hvd.numpy and hvd.torch call these with an adapter.

An adapter turns a framework's tensor into what the core takes (a contiguous tensor, its data
address, the core's dtype code and its shape) and builds result tensors. Its interface:

    prepare(t) -> (c, ptr, dtype_code, shape)  c is t, or a contiguous copy of it
    empty_like(c) -> a new contiguous tensor of c's dtype and shape
    ptr(t) -> data address of a tensor made by empty_like
    from_output(core_handle, like) -> the result bytes of a gather-like op as a tensor of
                                      like's dtype (a view of the engine's memory, no copy)
    copy_(dst, src) -> copies src into dst (in-place ops on non-contiguous tensors)

Every operation is named. Without a name, the next number of a per-process counter is used
("allreduce.noname.17"), as Horovod does, one counter per process set: the members of a set
agree as long as they issue their unnamed operations on it in the same order. Given names get
the operation as prefix ("allreduce.<name>"), so an allreduce and a broadcast may share a name.

Every operation runs on a process set, given by id as ``ps`` (0: every rank; hvd.ProcessSet).

Memory handed to the core stays referenced by the core handle until the operation finishes.
"""

import itertools
import numbers
import operator
import threading

from hvd import _core
from hvd._core import HvdError

# (kind, process set id) -> counter of unnamed operations. One counter per kind: ranks that
# make different numbers of unnamed calls of one kind (an allgather that fails on one rank
# while another has joined) still name their next call of another kind alike.
_counters = {}


def forget_counters(ps):
    """Drops the unnamed-operation counters of process set ``ps`` (removed): a set given its
    id later starts at 0 on every member, whatever the removed set's members had counted."""
    for key in [k for k in _counters if k[1] == ps]:
        del _counters[key]


def op_name(kind, name, ps=0):
    if name is None:
        counter = _counters.setdefault((kind, ps), itertools.count())
        return "%s.noname.%d" % (kind, next(counter))
    full = "%s.%s" % (kind, name)
    if not full.isascii():
        try:
            full.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate, from bytes decoded with errors
            raise ValueError("tensor name %r is not valid Unicode text (%s); names travel to "
                             "the other ranks as UTF-8" % (name, e.reason)) from None
    return full


def refuse(kind, name, ps, error, members=None):
    """This rank refused an operation's argument (`error`, which the caller raises next): the
    operation goes to the other ranks as a refusal under the name it would have had (a group of
    `members` when given), so that theirs fails with this rank's reason instead of waiting for
    this one, as the engine does with the arguments it refuses. Returns once every rank has
    submitted it, as the operation would have, so that its name is free again here."""
    if members == 0:
        return  # an empty group: the others submit nothing, nor take a number
    try:
        base = op_name(kind, name, ps)
    except ValueError:
        return  # the name itself was refused: no other rank can have it
    names = [base] if members is None else ["%s.%d" % (base, i) for i in range(members)]
    kind_name = next(c.__name__ for c in type(error).__mro__ if not c.__name__.startswith("_"))
    why = "%s: %s" % (kind_name, error)
    try:
        handles = _core.refuse(kind.replace("grouped_", ""), names, why, ps)
    except Exception:  # refused here at once (not initialized, shut down, a name in flight)
        return
    for h in handles:
        try:
            h.wait()
        except HvdError:
            pass  # the refusal itself, as the other ranks get it


def refusing(kind, name, ps, members=None):
    """A context in which an argument error (TypeError, ValueError, or hvd's own) is refused
    on every rank (refuse) before it is raised here."""
    return _Refusing(kind, name, ps, members)


class _Refusing:
    __slots__ = ("_args",)

    def __init__(self, *args):
        self._args = args

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is not None and isinstance(error, (TypeError, ValueError, _core.HvdError)):
            refuse(*self._args[:3], error, self._args[3])
        return False


def handle_of(handle, call):
    """`handle` if it is one an *_async call returned, else a TypeError saying so."""
    if not (hasattr(handle, "wait") and hasattr(handle, "poll")):  # Handle, SparseHandle
        raise TypeError("%s takes the handle an *_async call returned, got %r (a %s)"
                        % (call, handle, type(handle).__name__))
    return handle


class Handle:
    """An operation (or a group of operations) in flight.

    ``poll()`` says whether it has finished; ``wait()`` blocks without the GIL, raises the
    engine's error or returns the result. Waiting again returns the same result, also when
    several threads wait at once: the first to finish builds it (under the handle's lock, since
    the core's waits release the GIL), the others take it.
    """

    __slots__ = ("_parts", "_finish", "_state", "_value", "_stream", "_lock", "__weakref__")

    def __init__(self, parts, finish, stream=None):
        self._parts = parts      # list of _core.Handle
        self._finish = finish    # parts -> result, run once after success
        self._state = 0          # 0 pending, 1 done, 2 failed
        self._value = None       # the result, or the exception
        self._stream = stream    # device tensors: () -> the stream that uses the result
        self._lock = threading.Lock()

    def poll(self):
        if self._state:
            return True
        for p in self._parts:
            if not p.poll():
                return False
        return True

    def wait(self):
        if self._state == 0:
            parts = self._parts  # of host results, () once another thread has built one
            error = None
            done = []
            for p in parts:
                try:
                    p.wait()
                    done.append(p)
                except HvdError as e:
                    if error is None:
                        error = e
            # Stream-ordered completion: the caller's current stream waits for the device work
            # (a no-op when the engine already waited for it), also that of the parts that
            # succeeded beside a failed one, whose memory goes once they are dropped.
            self._order_stream(done)
            with self._lock:
                if self._state == 0:
                    # The value before the state: a thread that sees the state reads it.
                    self._value = error if error is not None else self._finish(parts)
                    self._state = 2 if error is not None else 1
                    if self._stream is None:
                        # Device results keep theirs: each later waiter's stream waits for them.
                        self._parts = ()
        else:
            # Waited for before (by another thread, perhaps): this caller's current stream, too,
            # waits for the device work before it uses the result.
            self._order_stream(self._parts)
        if self._state == 2:
            raise self._value
        return self._value

    def _order_stream(self, parts):
        if self._stream is not None and parts:
            stream = self._stream()
            for p in parts:
                p.stream_wait(stream)


class _BadOp:
    """An op that check_op could not take, raised by valid_op inside the operation's refusal:
    every rank hears it, where raising it at once would leave the others waiting."""
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


_KNOWN_OPS = frozenset((_core.SUM, _core.AVERAGE, _core.ADASUM, _core.MIN, _core.MAX,
                        _core.PRODUCT))


def check_op(op, average=None):
    """Horovod's rules: op defaults to Average; the deprecated ``average`` flag maps to it.
    What is wrong is raised later, by valid_op."""
    if average is not None:
        if op is not None:
            return _BadOp(ValueError("pass either op or the deprecated average, not both"))
        return _core.AVERAGE if average else _core.SUM
    if op is None:
        return _core.AVERAGE
    return op


def valid_op(op):
    """check_op's op as the engine takes it (an int), else its error: call it where an error is
    refused on every rank."""
    if op.__class__ is int and op in _KNOWN_OPS:
        return op
    if isinstance(op, _BadOp):
        raise op.error
    if isinstance(op, numbers.Integral) and not isinstance(op, bool) and int(op) in _KNOWN_OPS:
        return int(op)
    raise ValueError("unknown reduce op %r; use hvd.Sum, hvd.Average, hvd.Adasum, hvd.Min, "
                     "hvd.Max or hvd.Product" % (op,))


def _stream(A, t):
    """What the caller's stream is at wait time, for an adapter that has device tensors."""
    waiter = getattr(A, "waiter", None)
    return waiter(t) if waiter is not None else None


def _group_stream(A, ts):
    """_stream of a group: its first device tensor's (the engine takes groups that mix host and
    device tensors, running each part on its own, and the device part's results need the
    wait; hvd.torch refuses them, as Horovod does)."""
    for t in ts:
        s = _stream(A, t)
        if s is not None:
            return s
    return None


def _one_device(A, kind, cs):
    """Horovod refuses a group whose tensors lie on different devices (a RuntimeError), before
    anything is submitted; so does hvd, for adapters whose tensors have a device."""
    where = getattr(A, "device", None)
    if where is None or len(cs) < 2:
        return
    first = where(cs[0])
    for i, c in enumerate(cs[1:], 1):
        if where(c) != first:
            raise _core.InvalidArgumentError(
                "%s: the tensors of a group must lie on one device, as in Horovod; tensor 0 is "
                "on %s and tensor %d on %s" % (kind, first, i, where(c)))


def _in_out(A, tensor, inplace):
    """The contiguous input and where the result goes: the input itself, or a new buffer."""
    c, ptr, dt, shape = A.prepare(tensor)  # (a caller refuses what it raises: refusing)
    if inplace:
        return c, ptr, dt, shape, c, ptr
    out = A.empty_like(c)
    return c, ptr, dt, shape, out, A.ptr(out)


def _check_adasum(A, op, c, ps):
    """Horovod refuses Adasum of host tensors over a world whose size is not a power of two at
    the call, with NotImplementedError and these words (scripts catch it). A process set's size
    and device tensors (whose hosts must number a power of two) are the engine's to check."""
    if op != _core.ADASUM or ps != 0:
        return
    where = getattr(A, "device", None)
    if where is not None and where(c) != "cpu":
        return
    n = _core.size()
    if n & (n - 1):
        raise _AdasumSizeError("Running Adasum with non-power of 2 ranks is not supported yet. "
                               "(hvd: this world has %d ranks)" % n)


class _AdasumSizeError(NotImplementedError, ValueError):
    """Horovod's NotImplementedError; also the ValueError hvd raised for it before."""


def _rank_number(x):
    """A root rank: an integer (Python's, NumPy's, a 0-d integer tensor), as Horovod's binding
    takes; not a float or text."""
    try:
        if isinstance(x, bool):
            raise TypeError
        return operator.index(x)
    except TypeError:
        raise TypeError("root_rank must be an integer, got %r (a %s)"
                        % (x, type(x).__name__)) from None


def split_count(s):
    """An alltoall split: an integer row count (Horovod's rule: anything else is a
    ValueError)."""
    try:
        if isinstance(s, bool) or getattr(getattr(s, "dtype", None), "kind", "") == "b":
            raise TypeError
        return operator.index(s)
    except TypeError:
        raise ValueError("alltoall splits must be integers, got %r (a %s)"
                         % (s, type(s).__name__)) from None


def factor(x, what):
    """A scale factor: a real number (Horovod's binding takes no text for one)."""
    if x.__class__ is float:
        return x
    if isinstance(x, (str, bytes)):
        raise TypeError("%s must be a number, got %r" % (what, x))
    return float(x)


def allreduce_async(A, tensor, name, op, prescale, postscale, inplace, ps=0):
    try:  # (not `refusing`: this is every gradient's path, and a try costs nothing)
        c, ptr, dt, shape, out, out_ptr = _in_out(A, tensor, inplace)
        op = valid_op(op)
        prescale = factor(prescale, "prescale_factor")
        postscale = factor(postscale, "postscale_factor")
    except (TypeError, ValueError, HvdError) as e:
        refuse("allreduce", name, ps, e)
        raise
    _check_adasum(A, op, c, ps)
    h = _core.allreduce(op_name("allreduce", name, ps), ptr, out_ptr, dt, shape, op,
                        float(prescale), float(postscale), (c, out), ps)
    if inplace and c is not tensor:
        return Handle([h], lambda parts: A.copy_(tensor, c), _stream(A, c))
    return Handle([h], lambda parts: out, _stream(A, c))


def grouped_allreduce_async(A, tensors, name, op, prescale, postscale, inplace, ps=0):
    tensors = list(tensors)
    if not tensors:
        return Handle([], lambda parts: [])
    with refusing("grouped_allreduce", name, ps, len(tensors)):
        prepared = [A.prepare(t) for t in tensors]
        _one_device(A, "grouped_allreduce", [p[0] for p in prepared])
        op = valid_op(op)
        prescale = factor(prescale, "prescale_factor")
        postscale = factor(postscale, "postscale_factor")
    _check_adasum(A, op, prepared[0][0], ps)
    base = op_name("grouped_allreduce", name, ps)
    names, cs, ptrs, outs, out_ptrs, dts, shapes = [], [], [], [], [], [], []
    for i, (c, ptr, dt, shape) in enumerate(prepared):
        out = c if inplace else A.empty_like(c)
        names.append("%s.%d" % (base, i))
        cs.append(c)
        ptrs.append(ptr)
        outs.append(out)
        out_ptrs.append(ptr if inplace else A.ptr(out))
        dts.append(dt)
        shapes.append(shape)
    parts = _core.grouped_allreduce(names, ptrs, out_ptrs, dts, shapes, op, float(prescale),
                                    float(postscale), (cs, outs), ps)

    def finish(_):
        if not inplace:
            return outs
        return [A.copy_(t, c) if c is not t else t for t, c in zip(tensors, cs)]

    return Handle(parts, finish, _group_stream(A, cs))


def allgather_async(A, tensor, name, ps=0):
    with refusing("allgather", name, ps):
        c, ptr, dt, shape = A.prepare(tensor)
    h = _core.allgather(op_name("allgather", name, ps), ptr, dt, shape, c, ps)
    return Handle([h], lambda parts: A.from_output(parts[0], c), _stream(A, c))


def _grouped_with_outputs(A, tensors, name, kind, submit, ps):
    """A group whose results the engine allocates (allgather, reducescatter).

    submit(names, ptrs, dtypes, shapes, keep) enqueues it and returns the core handles."""
    tensors = list(tensors)
    if not tensors:
        return Handle([], lambda parts: [])
    with refusing(kind, name, ps, len(tensors)):
        prepared = [A.prepare(t) for t in tensors]
        cs = [p[0] for p in prepared]
        _one_device(A, kind, cs)
    base = op_name(kind, name, ps)
    names = ["%s.%d" % (base, i) for i in range(len(tensors))]
    parts = submit(names, [p[1] for p in prepared], [p[2] for p in prepared],
                   [p[3] for p in prepared], cs)
    return Handle(parts, lambda ps: [A.from_output(p, c) for p, c in zip(ps, cs)],
                  _group_stream(A, cs))


def grouped_allgather_async(A, tensors, name, ps=0):
    def submit(names, ptrs, dtypes, shapes, keep):
        return _core.grouped_allgather(names, ptrs, dtypes, shapes, keep, ps)
    return _grouped_with_outputs(A, tensors, name, "grouped_allgather", submit, ps)


def broadcast_async(A, tensor, root_rank, name, inplace, ps=0):
    """root_rank is a world rank, as in Horovod, also in a process set."""
    with refusing("broadcast", name, ps):
        c, ptr, dt, shape, out, out_ptr = _in_out(A, tensor, inplace)
        root = _rank_number(root_rank)
    h = _core.broadcast(op_name("broadcast", name, ps), ptr, out_ptr, dt, shape, root,
                        (c, out), ps)
    if inplace and c is not tensor:
        return Handle([h], lambda parts: A.copy_(tensor, c), _stream(A, c))
    return Handle([h], lambda parts: out, _stream(A, c))


def alltoall_async(A, tensor, splits, name, ps=0):
    """Result: (output, received_splits as a list of ints)."""
    with refusing("alltoall", name, ps):
        c, ptr, dt, shape = A.prepare(tensor)
        splits = [] if splits is None else [split_count(s) for s in splits]
    h = _core.alltoall(op_name("alltoall", name, ps), ptr, dt, shape, splits, c, ps)
    return Handle([h], lambda parts: (A.from_output(parts[0], c), parts[0].received_splits),
                  _stream(A, c))


def reducescatter_async(A, tensor, name, op, prescale, postscale, ps=0):
    with refusing("reducescatter", name, ps):
        c, ptr, dt, shape = A.prepare(tensor)
        op = valid_op(op)
        prescale = factor(prescale, "prescale_factor")
        postscale = factor(postscale, "postscale_factor")
    h = _core.reducescatter(op_name("reducescatter", name, ps), ptr, dt, shape, op,
                            prescale, postscale, c, ps)
    return Handle([h], lambda parts: A.from_output(parts[0], c), _stream(A, c))


def grouped_reducescatter_async(A, tensors, name, op, prescale, postscale, ps=0):
    tensors = list(tensors)
    with refusing("grouped_reducescatter", name, ps, len(tensors)):
        op = valid_op(op)
        prescale = factor(prescale, "prescale_factor")
        postscale = factor(postscale, "postscale_factor")

    def submit(names, ptrs, dtypes, shapes, keep):
        return _core.grouped_reducescatter(names, ptrs, dtypes, shapes, op, prescale, postscale,
                                           keep, ps)
    return _grouped_with_outputs(A, tensors, name, "grouped_reducescatter", submit, ps)


def barrier(ps=0):
    _core.barrier(ps).wait()


def join(device=-1):
    """Blocks until every rank has joined; returns the rank that joined last. `device`: the
    CUDA device whose zeros this rank contributes to the others' device collectives when it
    has used none yet (-1: the CPU, or the device it has used)."""
    h = _core.join(int(device))
    h.wait()
    return h.join_last_rank
