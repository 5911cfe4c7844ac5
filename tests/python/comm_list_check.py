"""hvd.init(comm=[...]) in a job hvdrun started without mpirun: a list of every rank in order is
the world as launched, and hvd starts no MPI; a part of it is refused on every rank, saying it
needs mpirun, and a plain init then starts the job as launched; mpi_threads_supported raises
ValueError, as Horovod's does without MPI. With --with-mpi4py the program
has imported mpi4py first (MPI's world is then each process alone): the same holds, and
comm_process_set_id refuses, since MPI's ranks are not hvd's. Exits non-zero on any failure;
prints COMM-LIST-OK-<rank>."""

import os
import sys

if "--with-mpi4py" in sys.argv:
    from mpi4py import MPI

import hvd.numpy as hvd

n = int(os.environ["HVD_SIZE"])
hvd.init(comm=list(range(n)))
assert hvd.size() == n and hvd.rank() == int(os.environ["HVD_RANK"]), (hvd.rank(), hvd.size())
assert not hvd.mpi_enabled()
try:  # as Horovod's where MPI is not in use
    hvd.mpi_threads_supported()
    raise AssertionError("mpi_threads_supported must raise ValueError without MPI")
except ValueError as e:
    assert "MPI is not enabled" in str(e), str(e)
if "--with-mpi4py" in sys.argv:
    try:
        hvd.comm_process_set_id(MPI.COMM_WORLD)
        raise AssertionError("comm_process_set_id must refuse where MPI's ranks are not hvd's")
    except ValueError as e:
        assert "did not meet through MPI" in str(e), str(e)
else:
    assert "mpi4py" not in sys.modules
hvd.barrier()
hvd.shutdown()
try:
    hvd.init(comm=[0])
    raise AssertionError("a part of the ranks must be refused")
except hvd.FailedPreconditionError as e:
    assert "needs the job started by mpirun" in str(e), str(e)
assert not hvd.is_initialized()
hvd.init()
r = hvd.rank()
hvd.barrier()
hvd.shutdown()
sys.stdout.write("COMM-LIST-OK-%d\n" % r)
sys.stdout.flush()
