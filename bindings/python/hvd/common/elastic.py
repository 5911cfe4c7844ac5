"""horovod.common.elastic's names (hvd.elastic holds them)."""

from hvd.elastic import ObjectState, State, run_fn  # noqa: F401
