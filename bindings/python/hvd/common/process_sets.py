"""horovod.common.process_sets' names (hvd holds them)."""

from hvd import (  # noqa: F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
