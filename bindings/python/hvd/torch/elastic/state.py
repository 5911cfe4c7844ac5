"""horovod.torch.elastic.state's names for the state (hvd.torch.elastic holds them)."""

from hvd.torch.elastic import (  # noqa: F401
    LRSchedulerStateHandler,
    ModelStateHandler,
    ObjectState,
    OptimizerStateHandler,
    SamplerStateHandler,
    State,
    StateHandler,
    TorchState,
    get_handler_registry,
    set_handler_registry,
)
