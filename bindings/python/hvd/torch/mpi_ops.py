"""hvd.torch collectives with horovod.torch's names, arguments and defaults.

Tensors may be on the CPU or on a CUDA device (one device per rank). A CUDA tensor's data is
taken as ready on the current stream when the op is called: hvd's work waits for that stream's
work without blocking the caller, and the op's handle finishes once its results are written,
so they may be used on any stream. A non-contiguous tensor is made contiguous first (in-place
ops then copy the result back). Supported dtypes: uint8, int8, int16 (and uint16 where torch has it),
int32, int64, float16, bfloat16, float32, float64, bool; others raise TypeError. The extension takes tensor.data_ptr() (no libtorch
headers), so the engine reads and writes the tensor's memory without a copy. Results of
allgather, alltoall and reducescatter are views of memory the engine allocated.

allreduce, grouped_allreduce, allgather, broadcast, alltoall, reducescatter and
grouped_reducescatter are differentiable (torch.autograd.Function), with horovod.torch's backward passes:
  allreduce      the gradient allreduced with the same op and factors
  allgather      the gradient averaged over ranks, this rank's rows
  broadcast      the gradient averaged over ranks on the root, zero elsewhere
  alltoall       the gradient sent back with the received splits
  reducescatter  the gradients allgathered (divided by size for Average); grouped: each
                 member's, in one grouped allgather
The async and in-place variants are not differentiable.
"""

import warnings

import torch

from hvd import _core, _ops, _process_set_id, global_process_set
# What horovod.torch.mpi_ops also holds (scripts import the ops' names from it:
# `from horovod.torch.mpi_ops import Sum`).
from hvd import (  # noqa: F401  (re-exported)
    Adasum,
    HorovodInternalError,
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hvd._ops import Handle  # noqa: F401  (the type of async results)
from hvd.torch.compression import Compression

_TO_CORE = {
    torch.uint8: _core.UINT8,
    torch.int8: _core.INT8,
    torch.int32: _core.INT32,
    torch.int64: _core.INT64,
    torch.float16: _core.FLOAT16,
    torch.bfloat16: _core.BFLOAT16,
    torch.float32: _core.FLOAT32,
    torch.float64: _core.FLOAT64,
    torch.bool: _core.BOOL,
    torch.int16: _core.INT16,
}
if hasattr(torch, "uint16"):  # torch 2.3 and later
    _TO_CORE[torch.uint16] = _core.UINT16


# Every op asks these of its tensors, so they use is_cpu / is_cuda: reading t.device.type
# builds a torch.device each time, about ten times the cost.
def _where(t):
    """The core's view of where a tensor lives: its address on the CPU; for a CUDA tensor the
    address, the device and the current stream, which hvd's work on it is ordered after."""
    if t.is_cpu:
        return t.data_ptr()
    return (t.data_ptr(), t.device.index, torch.cuda.current_stream(t.device).cuda_stream)


class _UnsupportedDtypeError(TypeError, ValueError):
    """A tensor of a dtype hvd does not reduce. Horovod raises ValueError for it; hvd raised
    TypeError before: both catch it."""


class _TorchAdapter:
    @staticmethod
    def prepare(t):
        if not isinstance(t, torch.Tensor):
            raise TypeError("hvd.torch expects a torch.Tensor, got %s" % type(t).__name__)
        code = _TO_CORE.get(t.dtype)
        if code is None:
            raise _UnsupportedDtypeError("hvd does not support %s tensors; supported dtypes: %s"
                                         % (t.dtype, ", ".join(str(d) for d in _TO_CORE)))
        if not t.is_cpu:
            if not t.is_cuda:
                raise TypeError("hvd.torch supports CPU and CUDA tensors; got a tensor on %s"
                                % t.device)
            if not _core.HAVE_CUDA:
                raise TypeError("this hvd was built without CUDA; got a tensor on %s" % t.device)
        if t.layout is not torch.strided:
            raise TypeError("hvd.torch supports dense tensors only; got layout %s" % t.layout)
        if not t.is_contiguous():
            t = t.contiguous()
        return t, _where(t), code, t.shape

    @staticmethod
    def empty_like(t):
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)

    @staticmethod
    def device(t):
        """Where a tensor lies, for the one-device rule of groups: "cpu" or "cuda:N"."""
        return "cpu" if t.is_cpu else str(t.device)

    @staticmethod
    def waiter(t):
        """For a CUDA tensor: the current stream's address when the result is waited for."""
        if not t.is_cuda:
            return None
        device = t.device
        return lambda: torch.cuda.current_stream(device).cuda_stream

    @staticmethod
    def ptr(t):
        return _where(t)

    @staticmethod
    def from_output(h, like):
        if like.device.type == "cuda":
            shape = list(h.output_shape)
            nbytes = like.element_size()
            for d in shape:
                nbytes *= d
            if nbytes == 0:
                return torch.empty(shape, dtype=like.dtype, device=like.device)
            raw = torch.as_tensor(h.device_output(nbytes), device=like.device)
            if like.dtype != torch.uint8:
                raw = raw.view(like.dtype)
            return raw.view(shape)
        raw = h.output()
        if raw.size == 0:
            return torch.empty(h.output_shape, dtype=like.dtype)
        out = torch.from_numpy(raw)
        if like.dtype != torch.uint8:
            out = out.view(like.dtype)
        return out.view(h.output_shape)

    @staticmethod
    def copy_(dst, src):
        with torch.no_grad():
            dst.copy_(src)
        return dst


_A = _TorchAdapter


def _set_rank_size(ps):
    """This rank's place in process set ps and the set's size."""
    if ps == 0:
        return _core.rank(), _core.size()
    ranks = _core.process_set_ranks(ps)
    return ranks.index(_core.rank()), len(ranks)


def _op(op, average):
    if average is not None:
        warnings.warn("the average argument is deprecated; use op=hvd.Average or op=hvd.Sum",
                      DeprecationWarning, stacklevel=3)
    return _ops.check_op(op, average)


def _needs_grad(t):
    # The autograd.Function costs a few microseconds a call; take it only when it matters.
    return isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled()


def poll(handle):
    """True once the async operation behind handle has finished."""
    return _ops.handle_of(handle, "poll").poll()


def synchronize(handle):
    """Waits for an async operation and returns its output; raises HvdError on failure."""
    return _ops.handle_of(handle, "synchronize").wait()


# ---------------------------------------------------------------- allreduce

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    return _ops.allreduce_async(_A, tensor, name, _op(op, average), prescale_factor,
                                postscale_factor, inplace=False, ps=_process_set_id(process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    return _ops.allreduce_async(_A, tensor, name, _op(op, average), prescale_factor,
                                postscale_factor, inplace=True, ps=_process_set_id(process_set))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set).wait()


class HvdAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        return _ops.allreduce_async(_A, tensor, name, op, prescale_factor, postscale_factor,
                                    inplace=False, ps=_process_set_id(process_set)).wait()

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale,
                         postscale_factor=ctx.postscale, process_set=ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces tensor over the ranks of process_set (default op: Average); a new tensor."""
    ps = _process_set_id(process_set)
    compressed, cctx = compression.compress(tensor)
    op = _op(op, average)
    if _needs_grad(compressed):
        reduced = HvdAllreduce.apply(compressed, name, op, prescale_factor, postscale_factor,
                                     process_set)
    else:
        reduced = _ops.allreduce_async(_A, compressed, name, op, prescale_factor,
                                       postscale_factor, inplace=False, ps=ps).wait()
    return compression.decompress(reduced, cctx)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    return _ops.grouped_allreduce_async(_A, tensors, name, _op(op, average), prescale_factor,
                                        postscale_factor, inplace=False,
                                        ps=_process_set_id(process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    return _ops.grouped_allreduce_async(_A, tensors, name, _op(op, average), prescale_factor,
                                        postscale_factor, inplace=True,
                                        ps=_process_set_id(process_set))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


class HvdGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        return tuple(_ops.grouped_allreduce_async(_A, tensors, name, op, prescale_factor,
                                                  postscale_factor, inplace=False,
                                                  ps=_process_set_id(process_set)).wait())

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce(list(grads), op=ctx.op, prescale_factor=ctx.prescale,
                                    postscale_factor=ctx.postscale, process_set=ctx.process_set)
        return (None, None, None, None, None) + tuple(reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """Allreduces a list of tensors negotiated as one group; returns a list."""
    _process_set_id(process_set)
    pairs = [compression.compress(t) for t in tensors]
    if not pairs:
        return []
    reduced = HvdGroupedAllreduce.apply(name, _op(op, average), prescale_factor,
                                        postscale_factor, process_set, *[p[0] for p in pairs])
    return [compression.decompress(t, p[1]) for t, p in zip(reduced, pairs)]


# ---------------------------------------------------------------- allgather

def allgather_async(tensor, name=None, process_set=global_process_set):
    return _ops.allgather_async(_A, tensor, name, ps=_process_set_id(process_set))


class HvdAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.scalar = tensor.dim() == 0
        ctx.process_set = process_set
        return _ops.allgather_async(_A, tensor, name, ps=_process_set_id(process_set)).wait()

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=_core.AVERAGE, process_set=ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ctx.process_set)
        place, _ = _set_rank_size(_process_set_id(ctx.process_set))
        offset = int(rows[:place].sum())
        mine = grad.narrow(0, offset, ctx.rows)
        return (mine.reshape(()) if ctx.scalar else mine), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates the set's ranks' tensors along dimension 0 (which may differ per rank)."""
    ps = _process_set_id(process_set)
    if _needs_grad(tensor):
        return HvdAllgather.apply(tensor, name, process_set)
    return _ops.allgather_async(_A, tensor, name, ps=ps).wait()


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    return _ops.grouped_allgather_async(_A, tensors, name, ps=_process_set_id(process_set))


class HvdGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        ctx.scalars = [t.dim() == 0 for t in tensors]
        ctx.process_set = process_set
        return tuple(_ops.grouped_allgather_async(_A, tensors, name,
                                                  ps=_process_set_id(process_set)).wait())

    @staticmethod
    def backward(ctx, *grads):
        # As Horovod's: the gradients averaged over the set, each rank's rows cut out.
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=_core.AVERAGE,
                                    process_set=ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ctx.process_set)
        place, _ = _set_rank_size(_process_set_id(ctx.process_set))
        offsets = rows[:place].sum(0).tolist() if place > 0 else [0] * len(ctx.rows)
        mine = []
        for g, offset, count, scalar in zip(reduced, offsets, ctx.rows, ctx.scalars):
            part = g.narrow(0, offset, count)
            mine.append(part.reshape(()) if scalar else part)
        return (None, None) + tuple(mine)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors negotiated as one group; returns a list. Differentiable,
    as allgather."""
    tensors = list(tensors)
    _process_set_id(process_set)
    if any(_needs_grad(t) for t in tensors):
        return list(HvdGroupedAllgather.apply(name, process_set, *tensors))
    return grouped_allgather_async(tensors, name, process_set).wait()


# ---------------------------------------------------------------- sparse tensors

class SparseHandle:
    """A sparse allreduce in flight: two allgathers (indices and values). synchronize() (or
    calling it, as Horovod's sparse handle is called) returns the reduced sparse tensor."""

    def __init__(self, tensor, indices, values, divisor):
        self._tensor, self._indices, self._values = tensor, indices, values
        self._divisor = divisor
        self._result = None

    def poll(self):
        return self._indices.poll() and self._values.poll()

    def wait(self):
        if self._result is None:
            values = self._values.wait()
            indices = self._indices.wait()
            if self._divisor != 1:
                values = values / self._divisor
            t = self._tensor
            self._result = torch.sparse_coo_tensor(indices.t(), values, t.size(),
                                                   dtype=t.dtype)
        return self._result

    __call__ = wait


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduces a sparse COO tensor over the set as Horovod does: every rank's indices and
    values are allgathered (duplicates add up when the result is coalesced), and Average
    divides the values by the set's size. Returns a handle for synchronize()."""
    ps = _process_set_id(process_set)
    if op not in (_core.SUM, _core.AVERAGE):
        raise ValueError("sparse_allreduce_async supports op=hvd.Sum and hvd.Average")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    base = _ops.op_name("sparse_allreduce", name, ps)
    # Allgather concatenates along the first dimension: the indices go transposed.
    indices = _ops.allgather_async(_A, t._indices().t().contiguous(), base + ".indices", ps=ps)
    values = _ops.allgather_async(_A, t._values().contiguous(), base + ".values", ps=ps)
    return SparseHandle(t, indices, values,
                        _set_rank_size(ps)[1] if op == _core.AVERAGE else 1)


# ---------------------------------------------------------------- broadcast

def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    return _ops.broadcast_async(_A, tensor, root_rank, name, inplace=False,
                                ps=_process_set_id(process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    return _ops.broadcast_async(_A, tensor, root_rank, name, inplace=True,
                                ps=_process_set_id(process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


class HvdBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return _ops.broadcast_async(_A, tensor, root_rank, name, inplace=False,
                                    ps=_process_set_id(process_set)).wait()

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=_core.AVERAGE, process_set=ctx.process_set)
        if _core.rank() != ctx.root_rank:
            grad = torch.zeros_like(grad)
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's tensor on every rank of process_set (a new tensor; the input is
    unchanged). root_rank is a world rank, as in Horovod."""
    ps = _process_set_id(process_set)
    if _needs_grad(tensor):
        return HvdBroadcast.apply(tensor, root_rank, name, process_set)
    return _ops.broadcast_async(_A, tensor, root_rank, name, inplace=False, ps=ps).wait()


# ---------------------------------------------------------------- alltoall

def _splits_list(splits):
    """Horovod's rule: splits are an int32 tensor, or a sequence of integers (Python's or
    NumPy's, a NumPy array included: Horovod makes an int32 tensor of it); anything else raises
    ValueError at the call."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise ValueError("alltoall splits must be an int32 tensor, got %s" % splits.dtype)
        return [int(s) for s in splits.tolist()]
    return [_ops.split_count(s) for s in splits]


def _splits_device(splits):
    """Where received splits go: the device of the splits given (Horovod's splits.new())."""
    return splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """synchronize() returns (output, received_splits as an int32 tensor, on the device of
    the splits given)."""
    device = _splits_device(splits)
    with _ops.refusing("alltoall", name, _process_set_id(process_set)):
        splits_list = _splits_list(splits)
    h = _ops.alltoall_async(_A, tensor, splits_list, name,
                            ps=_process_set_id(process_set))
    finish = h._finish

    def with_tensor_splits(parts):
        out, received = finish(parts)
        return out, torch.tensor(received, dtype=torch.int32, device=device)

    h._finish = with_tensor_splits
    return h


class HvdAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set, device):
        out, received = _ops.alltoall_async(_A, tensor, splits, name,
                                            ps=_process_set_id(process_set)).wait()
        ctx.received = received
        ctx.process_set = process_set
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 0
        received_t = torch.tensor(received, dtype=torch.int32, device=device)
        ctx.mark_non_differentiable(received_t)
        return out, received_t

    @staticmethod
    def backward(ctx, grad_output, _unused):
        grad, _ = alltoall(grad_output, splits=ctx.received, process_set=ctx.process_set)
        if grad.shape[0] < ctx.rows:  # rows past the splits were not sent: zero gradient
            pad = grad.new_zeros((ctx.rows - grad.shape[0],) + tuple(grad.shape[1:]))
            grad = torch.cat([grad, pad])
        return grad, None, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[j] rows of tensor to rank j (equal parts when splits is None).

    Returns the received rows in rank order; when splits is given, also the received splits
    (an int32 tensor), as horovod.torch does.
    """
    ps = _process_set_id(process_set)
    with _ops.refusing("alltoall", name, ps):
        split_list = _splits_list(splits)
    out, received = HvdAlltoall.apply(tensor, split_list, name, process_set,
                                      _splits_device(splits))
    return out if splits is None else (out, received)


# ---------------------------------------------------------------- reducescatter

def reducescatter_async(tensor, name=None, op=None, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    return _ops.reducescatter_async(_A, tensor, name, _ops.check_op(op), prescale_factor,
                                    postscale_factor, ps=_process_set_id(process_set))


def _reducescatter_grad_scale(op, prescale_factor, postscale_factor, ps):
    """Horovod's reducescatter gradient (its test_horovod_reducescatter_grad and _average): the
    allgather of the output gradients, times the set's size for Sum and as is for Average (and
    times the scale factors)."""
    scale = prescale_factor * postscale_factor
    if op == _core.SUM:
        scale *= _set_rank_size(ps)[1]
    return scale


class HvdReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ps = _process_set_id(process_set)
        out = _ops.reducescatter_async(_A, tensor, name, op, prescale_factor,
                                       postscale_factor, ps=ps).wait()
        # After the op: a bad factor is refused there, on every rank, not raised here alone.
        ctx.scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor, ps)
        ctx.process_set = process_set
        return out

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather(grad_output.contiguous(), process_set=ctx.process_set)
        if ctx.scale != 1.0:
            grad = grad * ctx.scale
        return grad, None, None, None, None, None


def _check_compression(compression, fn):
    if not hasattr(compression, "compress"):  # an op given third, as before compression came
        raise TypeError("%s(tensor, name, compression, op, ...): the third argument is the "
                        "compression, as in horovod.torch; got %r (give op= by name)"
                        % (fn, compression))


def reducescatter(tensor, name=None, compression=Compression.none, op=None,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces over ranks (default op: Average); rank r gets its part of dimension 0 (parts
    differ by at most one row; the first rows % size ranks get the extra one). compression
    as in allreduce: what travels is compressed, the part comes back in the input's dtype."""
    _process_set_id(process_set)
    _check_compression(compression, "reducescatter")
    compressed, cctx = compression.compress(tensor)
    part = HvdReducescatter.apply(compressed, name, _ops.check_op(op), prescale_factor,
                                  postscale_factor, process_set)
    return compression.decompress(part, cctx)


def grouped_reducescatter_async(tensors, name=None, op=None, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    return _ops.grouped_reducescatter_async(_A, tensors, name, _ops.check_op(op),
                                            prescale_factor, postscale_factor,
                                            ps=_process_set_id(process_set))


class HvdGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ps = _process_set_id(process_set)
        out = tuple(_ops.grouped_reducescatter_async(_A, tensors, name, op, prescale_factor,
                                                     postscale_factor, ps=ps).wait())
        ctx.scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor, ps)  # (after)
        ctx.ps = ps
        return out

    @staticmethod
    def backward(ctx, *grads):
        gathered = _ops.grouped_allgather_async(_A, [g.contiguous() for g in grads], None,
                                                ps=ctx.ps).wait()
        if ctx.scale != 1.0:
            gathered = [g * ctx.scale for g in gathered]
        return (None, None, None, None, None) + tuple(gathered)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=None,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors negotiated as one group; returns a list. A member
    that differs across ranks fails the whole group on every rank."""
    _process_set_id(process_set)
    _check_compression(compression, "grouped_reducescatter")
    pairs = [compression.compress(t) for t in tensors]
    if not pairs:
        return []
    parts = HvdGroupedReducescatter.apply(name, _ops.check_op(op), prescale_factor,
                                          postscale_factor, process_set, *[p[0] for p in pairs])
    return [compression.decompress(t, p[1]) for t, p in zip(parts, pairs)]


# ---------------------------------------------------------------- barrier, join

def barrier(process_set=global_process_set):
    """Returns once every rank of process_set has called barrier()."""
    _ops.barrier(_process_set_id(process_set))


def join(device=-1):
    """This rank has no more data: it takes part in the others' allreduces with zeros until
    every rank has joined. Returns the rank that joined last. As in Horovod, `device` names the
    CUDA device for those zeros (-1: the CPU, or the device this rank has used)."""
    return _ops.join(device)


class _Basics:
    """What Horovod's tests read through ``hvd.mpi_ops._basics``: the engine's process sets,
    by id. (Horovod's object of this name also starts and stops the engine; hvd's
    ``hvd.init`` and ``hvd.shutdown`` do that.)"""

    @staticmethod
    def _get_process_set_ids_and_ranks():
        """``{process set id: its world ranks, ascending}``, the global set (id 0) included."""
        from hvd import get_process_set_ids_and_ranks
        return get_process_set_ids_and_ranks()

    @staticmethod
    def _comm_process_set_id(comm):
        """The id of the process set of mpi4py communicator ``comm``'s processes."""
        from hvd import comm_process_set_id
        return comm_process_set_id(comm)

    @staticmethod
    def _process_set_size(process_set_id):
        ranks = _core.process_set_ranks(process_set_id)
        if not ranks:
            raise ValueError("Process set does not exist or has not been registered.")
        return len(ranks)

    @staticmethod
    def _process_set_rank(process_set_id):
        ranks = list(_core.process_set_ranks(process_set_id))
        if not ranks:
            raise ValueError("Process set does not exist or has not been registered.")
        if _core.rank() not in ranks:
            raise ValueError("Process is not part of provided process set.")
        return ranks.index(_core.rank())


_basics = _Basics()
