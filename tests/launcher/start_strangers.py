"""Strangers on a forming job's ports, with few file descriptors: the job still forms.

    start_strangers.py HVDRUN WORKER

A job of 2 ranks (multihost_worker: collectives checked by formula) runs under `ulimit -n 256`;
rank 1 starts 4 s late. Meanwhile a stranger opens 300 silent connections to every TCP port the
job listens on: hvdrun's store and rank 0's listener. Each runs out of descriptors. The job must
still form and pass (a listener that stopped accepting at its first failed accept left rank 1
unable to connect, and rank 0 blamed rank 1 at the start timeout), hvdrun must not flood its
log (the store retried a failed accept at once, logging each time), and the whole must end
within a minute. Prints PASS or FAIL: lines; exit 0 on pass.
"""

import os
import socket
import subprocess
import sys
import time

HVDRUN, WORKER = sys.argv[1], sys.argv[2]
STRANGERS = 300  # per listener


def tree(root):
    """The pids of `root` and its descendants."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def listening_ports(pids):
    """TCP ports in LISTEN state whose socket one of `pids` holds."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                try:
                    link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    ports = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            x = line.split()
            if x[3] == "0A" and x[9] in inodes:
                ports.add(int(x[1].split(":")[1], 16))
    return ports


script = '[ "$HVD_RANK" = 1 ] && sleep 4; exec "$0"'
job = subprocess.Popen(
    ["bash", "-c", 'ulimit -n 256; exec "$@"', "x", HVDRUN, "-np", "2", "--start-timeout", "20",
     "sh", "-c", script, WORKER],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
held, attacked = [], set()
start = time.monotonic()
# Until rank 0 and the store listen (at most 3.5 s: before rank 1 starts), hold connections to
# each listener found.
while time.monotonic() - start < 3.5 and len(attacked) < 2 and job.poll() is None:
    for port in listening_ports(tree(job.pid)) - attacked:
        attacked.add(port)
        for _ in range(STRANGERS):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=1)
                held.append(s)
            except OSError:
                break
    time.sleep(0.02)
try:
    out, err = job.communicate(timeout=60)
except subprocess.TimeoutExpired:
    os.killpg(job.pid, 9)
    out, err = job.communicate()
    print("FAIL: the job did not end within 60 s")
for s in held:
    s.close()
failed = False


def fail(why):
    global failed
    failed = True
    print("FAIL: " + why)


if len(attacked) < 2:
    fail("found %d listener(s) of the job to attack, expected 2 (the store and rank 0)"
         % len(attacked))
print("held %d connections to ports %s" % (len(held), sorted(attacked)))
if job.returncode != 0:
    fail("hvdrun exited %s" % job.returncode)
if out.count("CHECKS-OK rank") != 2:
    fail("not both ranks checked OK")
lines = err.count("\n")
if lines > 60:
    fail("%d lines on stderr (a warning per stranger or per failed accept)" % lines)
if failed:
    print("--- stdout\n" + out[-3000:] + "--- stderr\n" + err[-3000:])
    sys.exit(1)
print("PASS")
