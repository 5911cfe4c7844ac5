"""hvd.torch: horovod.torch's API on the hvd engine.

    import hvd.torch as hvd            # instead of: import horovod.torch as hvd
    hvd.init()
    model.load_state_dict(...)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)

Run under the launcher: ``hvdrun -np 4 /usr/bin/python3 train.py``. Environment knobs may use
the HOROVOD_* names as aliases of HVD_* ones (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, ...).
"""

from hvd import (  # noqa: F401  (re-exported)
    AbortedError,
    Adasum,
    Average,
    FailedPreconditionError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    HvdError,
    HvdTimeoutError,
    InternalError,
    InvalidArgumentError,
    Max,
    Min,
    PeerLostError,
    ResourceExhaustedError,
    ProcessSet,
    Product,
    Sum,
    __version__,
    add_process_set,
    comm_process_set_id,
    cross_rank,
    cross_size,
    ccl_built,
    cuda_built,
    ddl_built,
    get_process_set_ids_and_ranks,
    global_process_set,
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
    process_set_by_id,
    process_sets,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hvd.torch.compression import Compression  # noqa: F401
from hvd.torch.functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hvd.torch.mpi_ops import (  # noqa: F401
    Handle,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from hvd.torch.optimizer import DistributedOptimizer  # noqa: F401
from hvd.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401

# hvd.torch.elastic (run, TorchState, ElasticSampler) builds on the modules above.
from hvd.torch import elastic  # noqa: E402,F401
