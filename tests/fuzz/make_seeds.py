#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target into corpus/<target>/ (run from anywhere).

Each seed is a well-formed input built by the wire formats' own rules (bootstrap/store.h,
bootstrap/auth.h, transport/tcp/mesh_hello.h, coordinator/messages.cc,
transport/tcp/control_channel.h), so the fuzzers start past the first length checks.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def u32(v):
    return struct.pack("<I", v)


def s(b):
    return u32(len(b)) + b


def vec(fmt, items):
    return u32(len(items)) + b"".join(struct.pack("<" + fmt, x) for x in items)


# store: frames of set and get requests
def store_req(op, key, value=b""):
    p = op + u32(len(key)) + key + value
    return u32(len(p)) + p


write("store", "set_get", store_req(b"S", b"hvd/addr/0", b"127.0.0.1:4000") + store_req(b"G", b"hvd/addr/0"))
write("store", "empty_key", store_req(b"S", b"", b"") + store_req(b"G", b"x"))
write("store", "bad_op", store_req(b"X", b"k"))

# handshake: byte0 = context kind (0 store, 1 hello), byte1 = verdict, then the client message
nonce = bytes(range(16))
mac = bytes(32)
write("handshake", "store", b"\x00A" + b"store" + nonce + mac)
hello = struct.pack("<IiBii", 0x31445648, 1, 0, 0, 4)
write("handshake", "hello_data", b"\x01R" + hello + nonce + mac)
hello = struct.pack("<IiBii", 0x31445648, 3, 1, 0, 4)
write("handshake", "hello_control", b"\x01C" + hello + nonce + mac)


# control: frames of request lists, response lists, shutdown, abort, heartbeat
def request(name, shape, type_=0, dtype=7, op=0, root=-1):
    return (struct.pack("<B", type_) + s(name) + struct.pack("<BBiidd", dtype, op, root, -1, 1.0, 1.0)
            + vec("q", shape) + vec("q", []) + s(b"") + struct.pack("<i", 0))


def request_list(reqs, epoch=0, bits=()):
    return u32(len(reqs)) + b"".join(reqs) + struct.pack("<Q", epoch) + vec("Q", list(bits))


def response(names, shapes, type_=0, dtype=7, op=0, root=-1, sizes=(), error=b"", code=1):
    out = struct.pack("<BB", 0, type_) + u32(len(names)) + b"".join(s(n) for n in names)
    out += u32(len(shapes)) + b"".join(vec("q", sh) for sh in shapes)
    out += struct.pack("<BBidd", dtype, op, root, 1.0, 1.0) + vec("q", list(sizes)) + s(error)
    out += struct.pack("<Bi", code, -1) + vec("i", [])
    return out


def cached_response(bits):
    return struct.pack("<B", 1) + vec("I", list(bits))


def frame(type_, payload):
    return u32(len(payload) + 1) + struct.pack("<B", type_) + payload


write("control", "requests", frame(1, request_list([request(b"grad.0", [4, 1]), request(b"grad.1", [3])])))
write("control", "cached_requests", frame(1, request_list([], epoch=1, bits=[0b101])))
write("control", "responses", frame(2, u32(2) + response([b"grad.0", b"grad.1"], [[4, 1], [4, 2]])
                                    + response([b"w"], [[8]], type_=2, root=0)))
write("control", "cached_responses", frame(2, u32(1) + cached_response([0, 2])))
write("control", "error_response", frame(2, u32(1) + response([b"x"], [[2]], type_=7, error=b"shape differs")))
write("control", "allgather", frame(2, u32(1) + response([b"g"], [[2, 3]], type_=1, sizes=[2, 5])))
# a part of a round: round, rank, epoch, ready bits, withdrawn bits, threshold, knobs
# (hierarchical allreduce, recursive doubling's limit, staging pieces)
write("control", "round", frame(6, struct.pack("<QiQ", 1, 1, 1) + vec("Q", [0b101]) + vec("Q", [])
                                + struct.pack("<QiQQ", 64 << 20, 0, 64 << 10, 4 << 20)))
write("control", "misc", frame(3, struct.pack("<i", 1)) + frame(5, b"") + frame(4, b"rank 2 lost"))

# env: lines of <name index byte><value>
write("env", "hvdrun", b"\x00" + b"1\n\x01" + b"4\n\x07" + b"127.0.0.1\n\x08" + b"29500\n\x0a" + b"67108864\n")
write("env", "knobs", b"\x00" + b"0\n\x01" + b"1\n\x0b" + b"2.5\n\x0c" + b"1024\n\x0d" + b"30\n\x13" + b"mpi\n\x15" + b"debug\n")
write("env", "slurm", b"\x22" + b"3\n\x23" + b"8\n\x24" + b"1\n\x25" + b"1\n\x26" + b"node[01-04]\n\x28" + b"2(x4)\n\x2a" + b"4\n")
write("env", "bad", b"\x00" + b"x\n\x01" + b"-3\n")
