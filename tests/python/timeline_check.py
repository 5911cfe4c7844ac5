"""The timeline under hvdrun -np 2, as Horovod users read it (Horovod's test_timeline and its
start_timeline / stop_timeline). Prints TIMELINE-OK on success.

1. HOROVOD_TIMELINE=<file> and HOROVOD_TIMELINE_MARK_CYCLES=1 set before hvd.init(): once
   init returns, rank 0's file is whole JSON with the process's start time; after an
   allreduce named 'test_allreduce', rank 0's file (written while the job runs) holds
   'allreduce.test_allreduce', NEGOTIATE_ALLREDUCE, ALLREDUCE and CYCLE_START; at shutdown it is
   a JSON array whose ALLREDUCE event of that tensor has its bytes and the algorithm it ran
   with, and rank 1 wrote none.
2. HOROVOD_TIMELINE=DYNAMIC: nothing is written until hvd.start_timeline(path); operations
   between start and stop_timeline are in that file, those after are not; no CYCLE_START
   without mark_cycles. Without HOROVOD_TIMELINE set, start_timeline raises ValueError. As in
   Horovod's test_timeline_api, a file read as soon as stop_timeline returns is whole JSON with
   start_time_since_epoch_in_micros, and no event's timestamp is negative.
3. Each rank's readiness is a tick under NEGOTIATE_ALLREDUCE (an event named by the rank), as
   in Horovod, with rank 0 answering (HVD_SYMMETRIC_NEGOTIATION=off) and with the ranks
   agreeing in rounds (on), for a first request and for cached ones: rank 0's file has one tick
   per rank inside each bar, the bar starts at the first, and rank 1, which submits 300 ms
   after rank 0 each step, ticks at least 100 ms after it.
4. A negotiation that has not ended is in the file while the job runs: the open bar ("B") of a
   tensor rank 1 has not submitted yet, with rank 0's tick; its "E" once it runs. A tensor of a
   process set other than the global one, under the same name, has a row of its own.
"""

import json
import os
import re
import tempfile
import time

import torch

import hvd.torch as hvd

rank = int(os.environ["HOROVOD_RANK"])
workdir = os.environ.get("TIMELINE_DIR") or tempfile.gettempdir()
static_path = os.path.join(workdir, "hvd_timeline_static_%d.json" % os.getpid())
# Rank 0 names the files; rank 1's pid differs, so each rank names its own and checks only
# that it wrote nothing (a path without %r is rank 0's alone).
for key, value in {"HOROVOD_TIMELINE": static_path, "HOROVOD_TIMELINE_MARK_CYCLES": "1"}.items():
    os.environ[key] = value
hvd.init()
if rank == 0:
    # Whole JSON from the start: a job stopped before its first operation left "[" alone.
    with open(static_path) as f:
        first = json.load(f)
    assert "start_time_since_epoch_in_micros" in json.dumps(first), first
hvd.allreduce(torch.tensor([1, 2, 3], dtype=torch.float32), name="test_allreduce")
if rank == 0:
    # Horovod's test reads it after 0.1 s; the engine writes within 10 ms of going idle. A
    # loaded machine may not run it for a while, so this waits up to 20 s.
    # Whole JSON while the job runs: each write ends the array (read between two writes).
    wanted = ("allreduce.test_allreduce", "NEGOTIATE_ALLREDUCE", '"ALLREDUCE"', "CYCLE_START")
    deadline = time.monotonic() + 20
    while True:
        with open(static_path) as f:
            text = f.read()
        try:
            running = json.loads(text)
        except ValueError:
            running = None
        if (all(w in text for w in wanted) and running is not None) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for want in wanted:
        assert want in text, (want, text)
    assert running is not None, "not JSON while the job runs: ..." + text[-300:]
    # Microseconds in fixed notation, to the nanosecond: never rounded to 6 digits.
    assert not re.search(r'"(ts|dur)":-?[0-9.]+[eE]', text), text
    assert all(re.fullmatch(r"-?\d+\.\d{3}", t)
               for t in re.findall(r'"(?:ts|dur)":(-?[0-9.eE+]+)', text) if t != "0"), text
hvd.shutdown()
if rank == 0:
    with open(static_path) as f:
        events = json.load(f)
    ours = [e for e in events if e.get("tid") == "allreduce.test_allreduce"]
    names = [e["name"] for e in ours]
    # The bar opens ("B"), each rank's tick, the bar ends ("E") as the allreduce begins.
    assert names[0] == "NEGOTIATE_ALLREDUCE" and ours[0]["ph"] == "B", ours
    assert names[-2] == "NEGOTIATE_ALLREDUCE" and ours[-2]["ph"] == "E", ours
    assert names[-1] == "ALLREDUCE", ours
    assert sorted(names[1:-2]) == ["0", "1"], ours  # each rank's tick
    assert ours[-1]["args"]["bytes"] == 12 and ours[-1]["args"]["status"] == "ok", ours
    # How it ran: both ranks on this host share memory unless HVD_SHM=off; 12 bytes over TCP
    # take recursive doubling (the small-message algorithm).
    shm_off = os.environ.get("HVD_SHM", "auto").lower() in ("0", "off", "false")
    expected = ("recursive doubling" if shm_off
                else "shared memory, the tensors where they lie")
    assert ours[-1]["args"].get("algorithm") == expected, ours
    assert any(e["name"] == "CYCLE_START" for e in events), events
    os.unlink(static_path)
else:
    assert not os.path.exists(static_path), static_path

# The dynamic timeline.
os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"
del os.environ["HOROVOD_TIMELINE_MARK_CYCLES"]
hvd.init()
dynamic_path = os.path.join(workdir, "hvd_timeline_dynamic_%d.json" % os.getpid())
hvd.allreduce(torch.ones(2), name="before")
hvd.start_timeline(dynamic_path)
hvd.allreduce(torch.ones(4), name="during")
hvd.allgather(torch.ones(3), name="gathered")
hvd.stop_timeline()
# Rank 0 takes its stop before its next operation; without this barrier another rank's
# "after" could reach rank 0's coordinator (and be drawn) before rank 0 got there.
hvd.barrier()
hvd.allreduce(torch.ones(2), name="after")
hvd.barrier()  # the stop is taken before the next operation: the file is closed now
if rank == 0:
    with open(dynamic_path) as f:
        events = json.load(f)
    names = {(e.get("tid"), e["name"]) for e in events}
    assert ("allreduce.during", "ALLREDUCE") in names, events
    assert ("allgather.gathered", "ALLGATHER") in names, events
    assert ("allgather.gathered", "NEGOTIATE_ALLGATHER") in names, events
    assert not any(t in ("allreduce.before", "allreduce.after") for t, _ in names), events
    assert not any(e["name"] == "CYCLE_START" for e in events), events
    os.unlink(dynamic_path)
else:
    assert not os.path.exists(dynamic_path), dynamic_path


def read_at_once(path, cycles):
    """Read right after stop_timeline returns: the file is whole (Horovod's test_timeline_api
    reads it so), starts with Horovod's process_name event, and every timestamp counts from
    the file's start."""
    with open(path) as f:
        events = json.load(f)
    assert "start_time_since_epoch_in_micros" in events[0]["args"], events[:2]
    names = {e["name"] for e in events}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= names, events
    assert ("CYCLE_START" in names) == cycles, events
    assert all(e["ts"] >= 0 for e in events if "ts" in e), events
    os.unlink(path)


# Start (with cycle marks), stop and start again, as Horovod's test_timeline_api does; the
# first start's cycle began before its file (a mark from then would be negative).
for i, cycles in enumerate((True, True, False)):
    path = os.path.join(workdir, "hvd_timeline_api_%d_%d.json" % (i, os.getpid()))
    hvd.start_timeline(path, mark_cycles=cycles)
    hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce")
    time.sleep(0.2)
    hvd.stop_timeline()
    if rank == 0:
        read_at_once(path, cycles)
    else:
        assert not os.path.exists(path), path
hvd.shutdown()

# Each rank's tick, with either way of negotiating; rank 1 is late by 300 ms each step.
for mode in ("off", "on"):
    ticks_path = os.path.join(workdir, "hvd_timeline_ticks_%s_%d.json" % (mode, os.getpid()))
    os.environ["HOROVOD_TIMELINE"] = ticks_path
    os.environ["HVD_SYMMETRIC_NEGOTIATION"] = mode
    hvd.init()
    for step in range(3):  # the first request, then cached ones
        if rank == 1:
            time.sleep(0.3)
        hvd.allreduce(torch.ones(5), name="late")
    hvd.barrier()
    hvd.shutdown()
    if rank != 0:
        continue
    with open(ticks_path) as f:
        rows = [e for e in json.load(f) if e.get("tid") == "allreduce.late"]
    bars = [i for i, e in enumerate(rows) if e["name"] == "NEGOTIATE_ALLREDUCE" and e["ph"] == "B"]
    assert len(bars) == 3, (mode, rows)
    for i in bars:
        bar, ticks, end = rows[i], rows[i + 1:i + 3], rows[i + 3]
        assert sorted(t["name"] for t in ticks) == ["0", "1"], (mode, rows)
        assert end["name"] == "NEGOTIATE_ALLREDUCE" and end["ph"] == "E", (mode, rows)
        at = {t["name"]: t["ts"] for t in ticks}
        assert bar["ts"] == min(at.values()), (mode, bar, ticks)
        assert all(bar["ts"] <= t <= end["ts"] for t in at.values()), (mode, rows)
        assert at["1"] - at["0"] >= 100e3, (mode, bar, ticks)  # microseconds
        assert rows[i + 4]["name"] == "ALLREDUCE", (mode, rows)
    os.unlink(ticks_path)
del os.environ["HVD_SYMMETRIC_NEGOTIATION"]

# A negotiation that has not ended shows while the job runs: the open bar of a tensor rank 1
# has not submitted, with rank 0's tick, as in Horovod. A tensor of another process set under
# the same name has a row of its own.
stuck_path = os.path.join(workdir, "hvd_timeline_stuck_%d.json" % os.getpid())
os.environ["HOROVOD_TIMELINE"] = stuck_path
alone = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
hvd.init(process_sets=alone)
hvd.allreduce(torch.ones(3), name="x")
hvd.allreduce(torch.ones(3), name="x", process_set=alone[rank])
own_row = "allreduce.x (process set %d)" % alone[0].process_set_id
if rank == 0:
    handle = hvd.allreduce_async(torch.ones(3), name="stuck")
    deadline = time.monotonic() + 20
    rows = []
    while time.monotonic() < deadline:
        try:
            with open(stuck_path) as f:
                rows = [e for e in json.load(f) if e.get("tid") == "allreduce.stuck"]
        except ValueError:
            rows = []
        if len(rows) >= 2:
            break
        time.sleep(0.05)
    assert [(e["name"], e["ph"]) for e in rows] == [("NEGOTIATE_ALLREDUCE", "B"), ("0", "X")], rows
hvd.barrier()  # rank 1 submits "stuck" only now
if rank == 0:
    hvd.synchronize(handle)
else:
    hvd.allreduce(torch.ones(3), name="stuck")
hvd.shutdown()
if rank == 0:
    with open(stuck_path) as f:
        events = json.load(f)
    rows = [(e["name"], e["ph"]) for e in events if e.get("tid") == "allreduce.stuck"]
    assert rows[0] == ("NEGOTIATE_ALLREDUCE", "B") and rows[-2:] == [
        ("NEGOTIATE_ALLREDUCE", "E"), ("ALLREDUCE", "X")], rows
    tids = {e.get("tid") for e in events}
    assert "allreduce.x" in tids and own_row in tids, tids
    os.unlink(stuck_path)

# Without HOROVOD_TIMELINE, as in Horovod: a ValueError that says what to set.
del os.environ["HOROVOD_TIMELINE"]
hvd.init()
try:
    hvd.start_timeline(dynamic_path)
    raise AssertionError("start_timeline without HOROVOD_TIMELINE must raise ValueError")
except ValueError as e:
    assert "HOROVOD_TIMELINE=DYNAMIC" in str(e), str(e)
hvd.barrier()
hvd.shutdown()
print("TIMELINE-OK rank %d" % rank, flush=True)
