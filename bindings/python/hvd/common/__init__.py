"""horovod.common's module names, for scripts that import from them (hvd holds the objects):
hvd.common.exceptions, hvd.common.elastic, hvd.common.process_sets."""
