"""A rank of hvd.run (hvd/runner.py): runs the pickled function from HVD_RUN_TASK and sends its
result to hvd.run over TCP, or prints it as marked lines for hvd.run to take out of the output
where it cannot connect."""

import base64
import os
import pickle
import socket
import struct
import sys

from hvd.runner import (RESULT_ADDR_VAR, RESULT_MARK, RESULT_PIECE, RESULT_TOKEN_VAR, TASK_VAR,
                        _pickler)


def _rank():
    """This rank's rank now (an elastic world may have changed it), else hvdrun's."""
    try:
        import hvd
        if hvd.is_initialized():
            return hvd.rank()
    except Exception:  # shut down, or never initialized: the launcher's number stands
        pass
    names = ["HVD_RANK", "HOROVOD_RANK"]
    mpi = ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]
    # Under mpirun (hvd.run's use_mpi), mpirun's numbers count: an HVD_RANK may be inherited
    # from a job this one runs inside.
    names = mpi + names if os.environ.get("HVD_RUN_UNDER_MPI") == "1" else names + mpi
    for var in names:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _send(rank, pickled):
    """The result to hvd.run over TCP; False where that fails (it is printed instead)."""
    address = os.environ.get(RESULT_ADDR_VAR, "")
    token = os.environ.get(RESULT_TOKEN_VAR, "")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or len(token) != 32:
        return False
    try:
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(token.encode("ascii") + struct.pack("!qq", rank, len(pickled)))
            conn.sendall(pickled)
            conn.settimeout(120)
            return conn.recv(1) == b"k"
    except OSError as e:
        sys.stderr.write("hvd._run_task: cannot send rank %d's result to hvd.run at %s (%s); "
                         "printing it instead\n" % (rank, address, e))
        return False


def main():
    text = os.environ.pop(TASK_VAR, None)
    if not text:
        sys.stderr.write("hvd._run_task: %s is not set; this module is run by hvd.run\n"
                         % TASK_VAR)
        return 2
    if text.startswith("@"):
        with open(text[1:], "rb") as f:
            task = f.read()
    else:
        task = base64.b64decode(text)
    func, args, kwargs = pickle.loads(task)
    result = func(*args, **kwargs)
    pickled = _pickler().dumps(result)
    rank = _rank()
    if _send(rank, pickled):
        return 0
    data = base64.b64encode(pickled).decode("ascii")
    count = max(1, -(-len(data) // RESULT_PIECE))
    sys.stdout.flush()
    for i in range(count):
        piece = data[i * RESULT_PIECE:(i + 1) * RESULT_PIECE]
        # One write per line: never torn, whatever else this process writes meanwhile.
        os.write(sys.stdout.fileno(),
                 ("%s%d %d %d %s\n" % (RESULT_MARK, rank, i, count, piece)).encode("ascii"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
