"""hvd.run: Horovod's run API (``horovod.run``). Runs a Python function on every rank of a job
that hvdrun starts, and returns what each rank's call returned, in rank order.

The function and its arguments travel to the ranks pickled (with cloudpickle, so a function
defined in a script or a lambda travels by value; Debian's python3-cloudpickle) in the
environment; each rank imports hvd._run_task, calls the function and sends its result back over
a TCP connection to this process (or, where it cannot connect, prints it as marked lines of its
output, which this process takes out of the stream it passes on).

Thread-safety: each call runs its own hvdrun; calls from several threads do not share state.
"""

import base64
import hmac
import os
import pickle
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading

# Each rank sends its pickled result to this process over TCP (_ResultServer), at the address
# and with the token of these variables. A rank that cannot connect prints it instead, as
# result lines: the marker, then "<rank> <index> <count> <piece>", the pieces of the base64 of
# the pickled result, each line written whole (hvdrun passes on a line of up to 1 MiB whole;
# mpirun may split lines, and a result that comes garbled that way is an error, not a wrong
# value).
RESULT_ADDR_VAR = "HVD_RUN_RESULT_ADDR"
RESULT_TOKEN_VAR = "HVD_RUN_RESULT_TOKEN"
RESULT_MARK = "\x1fhvd.run result "
RESULT_PIECE = 3072
TASK_VAR = "HVD_RUN_TASK"
# What hvdrun (or mpirun) puts before a rank's line: "[3]<stdout>:", "[1,3]<stdout>:".
_RANK_PREFIX = re.compile(r"(\[[0-9,]+\]<stdout>: ?)?")
# A pickled task longer than this goes in a file instead of the environment (one variable of
# the environment may hold at most 128 KiB on Linux); ranks on other hosts need that file at
# the same path.
_MAX_ENV_TASK = 96 * 1024


def _pickler():
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:
        return pickle


def _hvdrun():
    """The hvdrun to start: HVDRUN, the one installed in the package, the build tree's, PATH."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("HVDRUN"), os.path.join(here, "bin", "hvdrun"),
                  os.path.join(here, os.pardir, os.pardir, "bin", "hvdrun"),
                  shutil.which("hvdrun")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise RuntimeError("hvd.run: no hvdrun found (set HVDRUN to its path, or install hvd with "
                       "pip so that hvdrun is on PATH)")


def _take_piece(pieces, text):
    """Files one result line, "<rank> <index> <count> <base64 piece>", under its rank. Returns
    what is wrong with it, or None."""
    try:
        rank, index, count, data = text.split(" ", 3)
        rank, index, count = int(rank), int(index), int(count)
    except ValueError:
        return "a rank's result line is garbled: %r" % text[:80]
    have = pieces.setdefault(rank, (count, {}))
    if have[0] != count or index in have[1] or not 0 <= index < count:
        return "rank %d sent its result twice (two processes with rank %d?)" % (rank, rank)
    have[1][index] = data
    return None


def _recv_exact(conn, n):
    chunks, left = [], n
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise OSError("connection closed %d bytes short" % left)
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _is_local(name):
    name = name.strip().strip("[]")
    return (name in ("localhost", "::1") or name.startswith("127.") or
            name == socket.gethostname() or name == socket.getfqdn())


def _host_names(hosts, hostfile):
    names = [h.rsplit(":", 1)[0] for h in (hosts or "").split(",") if h.strip()]
    if hostfile:
        with open(hostfile) as f:
            for line in f:
                words = line.split("#", 1)[0].split()
                if words:
                    names.append(words[0])
    return names


def _result_address(hosts, hostfile):
    """The address the ranks reach this process at: loopback when every host is this machine,
    else the one this machine would use to reach the first other host."""
    remote = [h for h in _host_names(hosts, hostfile) if not _is_local(h)]
    if not remote:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((remote[0].strip("[]"), 9))  # no packet: only picks the route
            return probe.getsockname()[0]
    except OSError:
        return "0.0.0.0"


class _ResultServer:
    """Takes each rank's pickled result over a TCP connection of its own: one message of the
    job's token (32 hex digits), the rank and the length (two big-endian int64) and the bytes,
    answered with one byte once stored. A launcher may split and mix the ranks' output lines
    (mpirun forwards it in 4 KiB reads); a connection carries any size whole."""

    def __init__(self, address):
        self.token = secrets.token_hex(16)
        self.results, self.errors = {}, []
        self._lock = threading.Lock()
        self._server = socket.create_server((address, 0), backlog=128)
        host, port = self._server.getsockname()[:2]
        if host == "0.0.0.0":
            host = socket.gethostname()
        self.address = "%s:%d" % (host, port)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._take, args=(conn,), daemon=True).start()

    def _take(self, conn):
        try:
            with conn:
                conn.settimeout(120)
                head = _recv_exact(conn, 32 + 16)
                if not hmac.compare_digest(head[:32], self.token.encode("ascii")):
                    return  # not one of this job's ranks
                rank, length = struct.unpack("!qq", head[32:])
                data = _recv_exact(conn, length)
                with self._lock:
                    if rank in self.results:
                        self.errors.append("rank %d sent its result twice (two processes with "
                                           "rank %d?)" % (rank, rank))
                    else:
                        self.results[rank] = data
                conn.sendall(b"k")
        except (OSError, ValueError, struct.error):
            return

    def close(self):
        self._server.close()


def _flags(np, min_np, max_np, slots, reset_limit, cooldown_range, hosts, hostfile,
           start_timeout, ssh_port, ssh_identity_file, disable_cache, output_filename, verbose,
           use_mpi, mpi_args, network_interface):
    f = ["-np", str(int(np))]
    if hosts:
        f += ["-H", hosts]
    if hostfile:
        f += ["--hostfile", hostfile]
    if min_np is not None:
        f += ["--min-np", str(int(min_np))]
    if max_np is not None:
        f += ["--max-np", str(int(max_np))]
    if slots is not None:
        f += ["--slots-per-host", str(int(slots))]
    if reset_limit is not None:
        f += ["--reset-limit", str(int(reset_limit))]
    if cooldown_range is not None:
        low, high = cooldown_range
        f += ["--blacklist-cooldown-range", str(low), str(high)]
    if start_timeout is not None:
        f += ["--start-timeout", str(start_timeout)]
    if ssh_port is not None:
        f += ["-p", str(int(ssh_port))]
    if ssh_identity_file:
        f += ["-i", ssh_identity_file]
    if disable_cache:
        f += ["--disable-cache"]
    if output_filename:
        f += ["--output-filename", output_filename]
    if verbose:
        f += ["--verbose"]
    if use_mpi or mpi_args:
        f += ["--mpi"]
    if mpi_args:
        f += ["--mpi-args", mpi_args]
    if network_interface:
        f += ["--network-interface", network_interface]
    return f


def _end_with_this_process():
    """A preexec_fn for hvdrun: it gets SIGTERM (and stops the job's ranks) when the thread
    that started it ends with this process, a driver killed or a notebook's kernel restarted,
    as horovod.run's ranks end with their driver. None where prctl cannot be reached."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook():
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it ended before the call: no signal would come
            os.kill(os.getpid(), signal.SIGTERM)
    return hook


def _stop(job):
    """Stops hvdrun, which stops the job's ranks (SIGTERM: within a second or so; SIGKILL
    after 15 s), and waits for it."""
    if job.poll() is not None:
        return
    try:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=15)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None,
        output_filename=None, verbose=None, use_gloo=None, use_mpi=None, mpi_args=None,
        network_interface=None, executable=None, np=None, min_np=None, max_np=None):
    """Runs func(*args, **kwargs) on num_proc ranks started by hvdrun (on hosts / hostfile, as
    ``hvdrun -H``) and returns the list of their results, in rank order. The arguments are
    horovod.run's; min_num_proc / max_num_proc make the job elastic (np, min_np and max_np are
    their older spellings, deprecated as in Horovod). use_gloo selects hvd's own controller
    (the default), use_mpi mpirun. executable: the Python the ranks run (this one by default).
    Raises RuntimeError when the job fails or a rank returns nothing."""
    import warnings
    if np is not None:
        if num_proc == 1:  # as Horovod: np counts unless num_proc was given
            num_proc = np
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning)
    if min_np is not None:
        if min_num_proc is None:
            min_num_proc = min_np
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning)
    if max_np is not None:
        if max_num_proc is None:
            max_num_proc = max_np
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning)
    if hosts is not None and hostfile is not None:
        raise ValueError("hvd.run: give hosts or hostfile, not both")
    if use_gloo and use_mpi:
        raise ValueError("hvd.run: use_gloo and use_mpi exclude each other")
    if not callable(func):
        raise ValueError("hvd.run: func must be callable, got %r" % (func,))
    pickler = _pickler()
    try:
        task = pickler.dumps((func, tuple(args), dict(kwargs or {})))
    except Exception as e:  # a function pickle cannot carry by value
        raise ValueError("hvd.run: cannot pickle the function and its arguments (%s); install "
                         "python3-cloudpickle to send functions defined in a script" % e) from e
    env = dict(os.environ)
    if use_mpi or mpi_args:
        env["HVD_RUN_UNDER_MPI"] = "1"
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [here, env.get("PYTHONPATH")] if p)
    task_file = None
    encoded = base64.b64encode(task).decode("ascii")
    if len(encoded) <= _MAX_ENV_TASK:
        env[TASK_VAR] = encoded
    else:
        import tempfile
        fd, task_file = tempfile.mkstemp(prefix="hvd_run_task_", suffix=".pkl")
        with os.fdopen(fd, "wb") as f:
            f.write(task)
        env[TASK_VAR] = "@" + task_file
    cmd = [_hvdrun()] + _flags(num_proc, min_num_proc, max_num_proc, slots, reset_limit, cooldown_range, hosts,
                               hostfile, start_timeout, ssh_port, ssh_identity_file,
                               disable_cache, output_filename, verbose, use_mpi, mpi_args,
                               network_interface)
    cmd += [executable or sys.executable, "-m", "hvd._run_task"]
    pieces = {}  # rank -> (count, {index: base64 text}): results that came in the output
    problems = []
    server = _ResultServer(_result_address(hosts, hostfile))
    env[RESULT_ADDR_VAR] = server.address
    env[RESULT_TOKEN_VAR] = server.token
    try:
        with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True,
                              errors="replace", preexec_fn=_end_with_this_process()) as job:
            try:
                for line in job.stdout:
                    at = line.find(RESULT_MARK)
                    if at < 0:
                        sys.stdout.write(line)
                        continue
                    if not _RANK_PREFIX.fullmatch(line[:at]):  # its last line had no end
                        sys.stdout.write(line[:at] + "\n")
                    problem = _take_piece(pieces, line[at + len(RESULT_MARK):].strip())
                    if problem:
                        problems.append(problem)
                sys.stdout.flush()
                rc = job.wait()
            except BaseException:  # KeyboardInterrupt (a notebook's interrupt), a broken stdout
                _stop(job)  # the job ends with this call, as horovod.run's does
                raise
    finally:
        server.close()
        if task_file:
            os.unlink(task_file)
    if rc != 0:
        # Worded as horovod.run's errors are, for scripts that match them.
        what = ("mpirun failed" if use_mpi or mpi_args else
                "one or more processes exited with non-zero status")
        raise RuntimeError("hvd.run: %s (hvdrun exited with %d); the ranks' output above says "
                           "why" % (what, rc))
    problems += server.errors
    if problems:
        raise RuntimeError("hvd.run: " + problems[0])
    results = {rank: pickle.loads(data) for rank, data in server.results.items()}
    for rank, (count, got) in pieces.items():
        if rank in results:
            raise RuntimeError("hvd.run: rank %d sent its result twice (two processes with "
                               "rank %d?)" % (rank, rank))
        if len(got) != count:
            raise RuntimeError("hvd.run: the result of rank %d came incomplete (%d of %d pieces)"
                               % (rank, len(got), count))
        results[rank] = pickle.loads(base64.b64decode("".join(got[i] for i in range(count))))
    if not results:
        raise RuntimeError("hvd.run: the job ended without a result from any rank")
    size = max(results) + 1
    missing = [r for r in range(size) if r not in results]
    if missing:
        raise RuntimeError("hvd.run: no result from rank(s) %s" % missing)
    return [results[r] for r in range(size)]
