"""The pushpull wire format as an adversary speaks it (see src/transport/message.h
and src/transport/hello.h): 64-byte little-endian headers, and the connector's side
of the handshake, with the proof computed right, wrong, or not at all.

Everything here is the protocol as the repository defines it; when the
handshake changes, this file is the one place to follow it.
"""

import hashlib
import hmac
import os
import socket
import struct
import time

MAGIC = 0x48535050
# The protocol version frames are sent with; learn_version() sets it from what
# the job's nodes speak, so the attacks test authentication, not a version
# mismatch.
VERSION = 2
HEADER_BYTES = 64
HEADER = struct.Struct("<IHHIIQQIIQQQ")
assert HEADER.size == HEADER_BYTES

# net (src/transport/message.h)
T_CHALLENGE, T_HELLO, T_HELLO_ACK = 1, 2, 3
# cluster (src/cluster/protocol.h)
T_REGISTER, T_HEARTBEAT, T_PEER_DEAD, T_ABORT, T_LEAVE, T_SHUTDOWN = 16, 20, 21, 22, 23, 24
# ps (src/ps/protocol.h)
T_PS_PUSH = 65
# collective rendezvous (src/collective/bootstrap.h)
T_RDV_HELLO = 130

ROLES = {"none": 0, "scheduler": 1, "server": 2, "worker": 3}


def header(type_, payload_bytes, sender=0, request_id=0, key=0, version=None, magic=MAGIC):
    version = VERSION if version is None else version
    return HEADER.pack(magic, version, type_, 0, sender, request_id, key, 0, 0, 0, 0,
                       payload_bytes)


def frame(type_, payload=b"", **kw):
    return header(type_, len(payload), **kw) + payload


def wstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<I", len(b)) + b


class Closed(Exception):
    """The peer closed (or reset) the connection."""


def recv_exact(sock, n, deadline):
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no data before the deadline")
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - len(out), 1 << 20))
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as e:
            raise Closed(str(e))
        except socket.timeout:
            raise TimeoutError("no data before the deadline")
        if not chunk:
            raise Closed("EOF")
        out += chunk
    return bytes(out)


def read_frame(sock, deadline, max_payload=1 << 20):
    """(type, header fields tuple, payload) of the next frame; raises Closed/TimeoutError."""
    fields = HEADER.unpack(recv_exact(sock, HEADER_BYTES, deadline))
    plen = fields[11]
    if plen > max_payload:
        raise Closed(f"peer announced {plen} payload bytes")
    return fields[2], fields, recv_exact(sock, plen, deadline)


def learn_version(port, timeout=2.0):
    """Reads the first header a node sends (its challenge) and adopts its
    protocol version; False when it sent none."""
    global VERSION
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            fields = HEADER.unpack(recv_exact(s, HEADER_BYTES, time.monotonic() + timeout))
    except (OSError, Closed, TimeoutError):
        return False
    if fields[0] != MAGIC:
        return False
    VERSION = fields[1]
    return True


def split_frames(data):
    """Frames [(type, raw bytes)] of a recorded byte stream (incomplete tail dropped)."""
    out, pos = [], 0
    while len(data) - pos >= HEADER_BYTES:
        fields = HEADER.unpack_from(data, pos)
        end = pos + HEADER_BYTES + fields[11]
        if fields[0] != MAGIC or end > len(data):
            break
        out.append((fields[2], data[pos:end]))
        pos = end
    return out


def parse_challenge(payload):
    """(format, version, job id or job tag, acceptor nonce). Format 1: {u16
    version, str job id, nonce}; format 2 (mutual handshake): {u16 version,
    SHA-256 job tag, nonce}."""
    version, = struct.unpack_from("<H", payload, 0)
    if len(payload) >= 6:
        n, = struct.unpack_from("<I", payload, 2)
        if n == len(payload) - 38:
            return 1, version, payload[6:6 + n], payload[6 + n:6 + n + 32]
    return 2, version, payload[2:34], payload[34:66]


def proof_v1(secret, nonce, job_id, role, rank):
    msg = nonce + wstr(job_id) + struct.pack("<Bi", role, rank)
    return hmac.new(secret.encode(), msg, hashlib.sha256).digest()


def proof_v2(secret, acceptor_nonce, connector_nonce, job_id, role, rank, version=2):
    """The connector's proof (transport/hello.h); from protocol version 4 it also
    binds the hello's kind (0: a message connection)."""
    msg = (wstr("pushpull v2 connector") + acceptor_nonce + connector_nonce + wstr(job_id) +
           struct.pack("<Bi", role, rank) + (b"\0" if version >= 4 else b""))
    return hmac.new(secret.encode(), msg, hashlib.sha256).digest()


def connector_handshake(sock, deadline, role, rank, proof_mode, secret="", job_id=""):
    """Plays the connector: reads the challenge, answers with a hello whose
    proof is 'right' (needs the secret and the job id), 'wrong' (random) or
    'missing' (zeros, what a node without a secret sends). Returns the bytes
    sent."""
    typ, fields, payload = read_frame(sock, deadline)
    if typ != T_CHALLENGE:
        raise Closed(f"expected a challenge, got type {typ}")
    fmt, version, job, nonce = parse_challenge(payload)
    header_version = fields[1]
    my_nonce = os.urandom(32)
    if proof_mode == "right":
        p = (proof_v1(secret, nonce, job, role, rank) if fmt == 1 else
             proof_v2(secret, nonce, my_nonce, job_id, role, rank, version))
    elif proof_mode == "wrong":
        p = os.urandom(32)
    else:
        p = bytes(32)
    head = struct.pack("<H", version) + (wstr(job) if fmt == 1 else job)
    body = struct.pack("<Bi", role, rank) + wstr("127.0.0.1") + struct.pack("<i", 1)
    tail = p if fmt == 1 else my_nonce + p
    if fmt != 1 and version >= 4:
        tail += b"\0"  # the hello's kind: a message connection
    out = frame(T_HELLO, head + body + tail, version=header_version)
    sock.sendall(out)
    return out


def verdict(sock, seconds):
    """How the acceptor answered a handshake attempt, within `seconds`:
    'accepted' (an accepting ack, or the connection still serves a heartbeat
    afterwards), 'refused: <reason>' (a refusing ack, then closed), 'closed'
    (closed without an ack), or 'open' (neither accepted nor closed)."""
    deadline = time.monotonic() + seconds
    refused = None
    try:
        while True:
            typ, _, payload = read_frame(sock, deadline)
            if typ == T_HELLO_ACK and payload:
                if payload[0] == 1:
                    return "accepted"
                n, = struct.unpack_from("<I", payload, 1) if len(payload) >= 5 else (0,)
                refused = "refused: " + payload[5:5 + min(n, 60)].decode(errors="replace")
    except Closed:
        return refused or "closed"
    except TimeoutError:
        pass
    # Still open: does it take a message as from an authenticated peer?
    try:
        sock.sendall(frame(T_HEARTBEAT))
        read_frame(sock, time.monotonic() + 1.0)
    except Closed:
        return refused or "closed"
    except (TimeoutError, OSError):
        pass
    return refused + " (but left open)" if refused else "open"
