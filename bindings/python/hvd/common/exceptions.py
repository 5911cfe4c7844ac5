"""horovod.common.exceptions' names (hvd holds them)."""

from hvd import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
