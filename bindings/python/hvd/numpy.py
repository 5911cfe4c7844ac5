"""hvd.numpy: the collectives on NumPy arrays, synchronous and asynchronous.

    import hvd.numpy as hvd
    hvd.init()
    total = hvd.allreduce(np.arange(4.0), op=hvd.Sum)
    h = hvd.allreduce_async(x); ...; y = hvd.synchronize(h)

Arrays go to the engine by address, without a copy (a non-contiguous array is made contiguous
first; in-place ops then copy the result back). Supported dtypes: uint8, int8, int16, uint16, int32, int64,
float16, float32, float64, bool. Async handles keep the arrays alive until they finish.
"""

import numpy as _np

from hvd import (  # noqa: F401  (re-exported)
    AbortedError,
    Adasum,
    Average,
    FailedPreconditionError,
    HorovodInternalError,
    HvdError,
    HvdTimeoutError,
    InternalError,
    InvalidArgumentError,
    Max,
    Min,
    PeerLostError,
    ResourceExhaustedError,
    Product,
    Sum,
    ProcessSet,
    add_process_set,
    comm_process_set_id,
    cross_rank,
    cross_size,
    get_process_set_ids_and_ranks,
    global_process_set,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    process_set_by_id,
    process_sets,
    rank,
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hvd import _core, _ops, _process_set_id

_TO_CORE = {
    _np.dtype(_np.uint8): _core.UINT8,
    _np.dtype(_np.int8): _core.INT8,
    _np.dtype(_np.int16): _core.INT16,
    _np.dtype(_np.uint16): _core.UINT16,
    _np.dtype(_np.int32): _core.INT32,
    _np.dtype(_np.int64): _core.INT64,
    _np.dtype(_np.float16): _core.FLOAT16,
    _np.dtype(_np.float32): _core.FLOAT32,
    _np.dtype(_np.float64): _core.FLOAT64,
    _np.dtype(_np.bool_): _core.BOOL,
}


class _NumpyAdapter:
    @staticmethod
    def prepare(a):
        if not isinstance(a, _np.ndarray):
            a = _np.asarray(a)
        code = _TO_CORE.get(a.dtype)
        if code is None:
            raise TypeError("hvd.numpy does not support arrays of dtype %s; supported: %s"
                            % (a.dtype, ", ".join(str(d) for d in _TO_CORE)))
        if not a.flags.c_contiguous:
            a = _np.ascontiguousarray(a)
        return a, a.__array_interface__["data"][0], code, a.shape

    @staticmethod
    def empty_like(a):
        return _np.empty(a.shape, dtype=a.dtype)

    @staticmethod
    def ptr(a):
        return a.__array_interface__["data"][0]

    @staticmethod
    def from_output(h, like):
        return h.output().view(like.dtype).reshape(h.output_shape)

    @staticmethod
    def copy_(dst, src):
        _np.copyto(dst, src)
        return dst


_A = _NumpyAdapter


def _writable(a):
    if not isinstance(a, _np.ndarray) or not a.flags.writeable:
        raise ValueError("in-place hvd.numpy operations need a writable numpy.ndarray")
    return a


def poll(handle):
    return _ops.handle_of(handle, "poll").poll()


def synchronize(handle):
    """Waits for an async operation and returns its result (raises HvdError on failure)."""
    return _ops.handle_of(handle, "synchronize").wait()


def allreduce_async(array, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    return _ops.allreduce_async(_A, array, name, _ops.check_op(op), prescale_factor,
                                postscale_factor, inplace=False,
                                ps=_process_set_id(process_set))


def allreduce(array, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    return allreduce_async(array, name, op, prescale_factor, postscale_factor,
                           process_set=process_set).wait()


def allreduce_async_(array, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    return _ops.allreduce_async(_A, _writable(array), name, _ops.check_op(op), prescale_factor,
                                postscale_factor, inplace=True,
                                ps=_process_set_id(process_set))


def allreduce_(array, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    return allreduce_async_(array, name, op, prescale_factor, postscale_factor,
                            process_set=process_set).wait()


def grouped_allreduce_async(arrays, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    return _ops.grouped_allreduce_async(_A, arrays, name, _ops.check_op(op), prescale_factor,
                                        postscale_factor, inplace=False,
                                ps=_process_set_id(process_set))


def grouped_allreduce(arrays, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    return grouped_allreduce_async(arrays, name, op, prescale_factor, postscale_factor,
                                   process_set=process_set).wait()


def grouped_allreduce_async_(arrays, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    arrays = [_writable(a) for a in arrays]
    return _ops.grouped_allreduce_async(_A, arrays, name, _ops.check_op(op), prescale_factor,
                                        postscale_factor, inplace=True,
                                ps=_process_set_id(process_set))


def grouped_allreduce_(arrays, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return grouped_allreduce_async_(arrays, name, op, prescale_factor, postscale_factor,
                                    process_set=process_set).wait()


def allgather_async(array, name=None, process_set=global_process_set):
    return _ops.allgather_async(_A, array, name, ps=_process_set_id(process_set))


def allgather(array, name=None, process_set=global_process_set):
    """Concatenates the ranks' arrays along the first dimension (which may differ)."""
    return allgather_async(array, name, process_set=process_set).wait()


def grouped_allgather_async(arrays, name=None, process_set=global_process_set):
    return _ops.grouped_allgather_async(_A, arrays, name, ps=_process_set_id(process_set))


def grouped_allgather(arrays, name=None, process_set=global_process_set):
    return grouped_allgather_async(arrays, name, process_set=process_set).wait()


def broadcast_async(array, root_rank, name=None, process_set=global_process_set):
    return _ops.broadcast_async(_A, array, root_rank, name, inplace=False,
                                ps=_process_set_id(process_set))


def broadcast(array, root_rank, name=None, process_set=global_process_set):
    return broadcast_async(array, root_rank, name, process_set=process_set).wait()


def broadcast_async_(array, root_rank, name=None, process_set=global_process_set):
    return _ops.broadcast_async(_A, _writable(array), root_rank, name, inplace=True,
                                ps=_process_set_id(process_set))


def broadcast_(array, root_rank, name=None, process_set=global_process_set):
    return broadcast_async_(array, root_rank, name, process_set=process_set).wait()


def alltoall_async(array, splits=None, name=None, process_set=global_process_set):
    """Result of synchronize(): (output, received_splits) with received_splits an int32 array."""
    h = _ops.alltoall_async(_A, array, splits, name, ps=_process_set_id(process_set))
    finish = h._finish
    h._finish = lambda parts: _with_splits_array(finish(parts))
    return h


def _with_splits_array(result):
    output, received = result
    return output, _np.asarray(received, dtype=_np.int32)


def alltoall(array, splits=None, name=None, process_set=global_process_set):
    """Sends splits[j] rows of array to rank j (equal parts when splits is None).

    Returns (output, received_splits).
    """
    return alltoall_async(array, splits, name, process_set=process_set).wait()


def reducescatter_async(array, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=global_process_set):
    return _ops.reducescatter_async(_A, array, name, _ops.check_op(op), prescale_factor,
                                    postscale_factor, ps=_process_set_id(process_set))


def reducescatter(array, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=global_process_set):
    """Reduces across ranks; rank r gets its part of the first dimension (the first
    rows % size ranks get one extra row)."""
    return reducescatter_async(array, name, op, prescale_factor, postscale_factor,
                               process_set=process_set).wait()


def grouped_reducescatter_async(arrays, name=None, op=None, prescale_factor=1.0,
                                postscale_factor=1.0, process_set=global_process_set):
    return _ops.grouped_reducescatter_async(_A, arrays, name, _ops.check_op(op), prescale_factor,
                                            postscale_factor, ps=_process_set_id(process_set))


def grouped_reducescatter(arrays, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                          process_set=global_process_set):
    """Reducescatters a list of arrays negotiated as one group; returns a list."""
    return grouped_reducescatter_async(arrays, name, op, prescale_factor,
                                       postscale_factor, process_set=process_set).wait()


def barrier(process_set=global_process_set):
    _ops.barrier(_process_set_id(process_set))


def join():
    """This rank has no more data; returns the rank that joined last."""
    return _ops.join()
