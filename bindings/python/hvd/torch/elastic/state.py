"""horovod.torch.elastic.state's names for the state (hvd.torch.elastic holds them)."""

from hvd.torch.elastic import ObjectState, State, TorchState  # noqa: F401
