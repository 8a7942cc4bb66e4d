"""The attacks of the adversary suite, each against one listening port.

Each attack returns (outcome, ok): what the target did, and whether that is
what a secure and live node must do. A stranger (no secret) must never be
accepted; an insider with the secret claiming an identity that is already
connected must be refused; malformed or silent connections must be closed,
silent ones by a pre-authentication deadline while the target still runs.
The job surviving every attack with correct values is checked by the caller.
"""

import os
import socket
import struct
import time

import pp_wire as w

# A silent or half-sent connection must be closed by the target within this
# many seconds (the pre-authentication deadline plus slack for a loaded host).
PREAUTH_LIMIT = 15.0
# How long a malformed frame may take to be answered with a close.
PROMPT_LIMIT = 5.0


class Target:
    def __init__(self, pid, port, label, alive):
        self.pid, self.port, self.label = pid, port, label
        self.alive = alive  # () -> bool: the target process still runs

    def name(self):
        return f"{self.label}:{self.port}"


def connect(t, timeout=3.0, connect_timeout=12.0):
    # The connect itself may wait: the idle flood of another attack can fill
    # the target's accept backlog for its 3 s hold, and a dropped SYN is
    # retried by the kernel after 1, 3 and 7 s. That is the flood's effect,
    # already judged by idle_flood, not a finding of this attack.
    s = socket.create_connection(("127.0.0.1", t.port), timeout=connect_timeout)
    s.settimeout(timeout)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return s


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def wait_closed(sock, t, limit):
    """Seconds until the target closed `sock`, or None when it was still open
    at `limit` or when the target exited first (then it proves nothing)."""
    start = time.monotonic()
    sock.settimeout(0.5)
    while time.monotonic() - start < limit:
        try:
            if not sock.recv(65536):
                return time.monotonic() - start
        except socket.timeout:
            if not t.alive():
                return None
        except OSError:
            return time.monotonic() - start
    return None


def expect_close(sock, t, limit, what):
    took = wait_closed(sock, t, limit)
    if took is not None:
        time.sleep(0.3)  # a close because the whole process died proves nothing
        if not t.alive():
            return f"{what}: closed after {took:.1f}s because the target exited", False
        return f"closed after {took:.1f}s", True
    if not t.alive():
        return f"{what}: target exited before closing it", False
    return f"{what}: still open after {limit:.0f}s", False


def garbage(t, **_):
    with connect(t) as s:
        s.sendall(os.urandom(4096))
        return expect_close(s, t, PROMPT_LIMIT, "garbage")


def huge_length(t, **_):
    # A well-formed hello header announcing 2^62 payload bytes.
    with connect(t) as s:
        s.sendall(w.header(w.T_HELLO, 1 << 62))
        return expect_close(s, t, PROMPT_LIMIT, "huge length")


def huge_length_data(t, **_):
    # A data message (PS push) of 1 GiB before any handshake.
    with connect(t) as s:
        s.sendall(w.header(w.T_PS_PUSH, 1 << 30) + os.urandom(1024))
        return expect_close(s, t, PROMPT_LIMIT, "unauthenticated 1 GiB push")


def truncated_header(t, **_):
    with connect(t) as s:
        s.sendall(w.header(w.T_HELLO, 100)[:30])
        return expect_close(s, t, PREAUTH_LIMIT, "truncated header")


def truncated_payload(t, **_):
    with connect(t) as s:
        s.sendall(w.header(w.T_HELLO, 200) + os.urandom(20))
        return expect_close(s, t, PREAUTH_LIMIT, "truncated hello")


def silent(t, **_):
    with connect(t) as s:
        return expect_close(s, t, PREAUTH_LIMIT, "silent connection")


def control_before_hello(t, **_):
    # Job control messages a stranger would use to stop the job, sent without
    # a handshake: abort, shutdown, peer-dead.
    with connect(t) as s:
        reason = w.wstr("stopped by a stranger")
        s.sendall(
            w.frame(w.T_ABORT, reason, sender=1) + w.frame(w.T_SHUTDOWN, sender=1) +
            w.frame(w.T_PEER_DEAD, struct.pack("<Bi", 3, 0) + w.wstr("127.0.0.1") +
                    struct.pack("<i", 1) + reason, sender=1))
        return expect_close(s, t, PREAUTH_LIMIT, "control before hello")


def _hello(t, role, rank, proof_mode, secret, job_id=""):
    with connect(t) as s:
        deadline = time.monotonic() + PROMPT_LIMIT
        try:
            w.connector_handshake(s, deadline, w.ROLES[role], rank, proof_mode, secret, job_id)
        except (w.Closed, TimeoutError, OSError) as e:
            return f"closed during handshake ({e})", True
        v = w.verdict(s, PROMPT_LIMIT)
        return v, v.startswith("refused") or v == "closed"


def job_id_leak(t, observed_job_id, **_):
    """What a stranger learns before authenticating: the first bytes the
    target sends must not contain the job id in clear."""
    job_id, waited = observed_job_id(), 0
    while not job_id and waited < 50:  # the job's processes may not be up yet
        time.sleep(0.1)
        job_id, waited = observed_job_id(), waited + 1
    if not job_id:
        return "skipped: job id unknown", True
    with connect(t) as s:
        got = b""
        s.settimeout(1.0)
        try:
            while len(got) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except (socket.timeout, OSError):
            pass
    if job_id.encode() in got:
        return "the job id is sent in clear before authentication", False
    return f"{len(got)} bytes before authentication, no job id", True


def wrong_proof(t, **_):
    return _hello(t, "worker", 9, "wrong", "")


def missing_proof(t, **_):
    return _hello(t, "worker", 9, "missing", "")


def duplicate_stranger(t, **_):
    # Claims worker 0, which exists, without the secret.
    return _hello(t, "worker", 0, "missing", "")


def duplicate_insider(t, secret, job_id, connected_member, **_):
    """Knows the secret and the job id (an insider's bug) and, once the job
    runs, claims the identity of a member that is connected to the target."""
    if not secret:
        return "skipped: secret unknown to the adversary", True
    member = connected_member(t)
    if member is None:
        return "skipped: no member connected to this port once the job ran", True
    role, rank = member
    out, ok = _hello(t, role, rank, "right", secret, job_id)
    out = f"as {role} {rank}: {out}"
    if "authentication failed" in out or "out of date" in out:
        # The target found the proof wrong: this suite computes it out of
        # step with transport/hello.cpp, and the duplicate check went untested.
        return out + " (the suite's proof is out of date)", False
    return out, ok


def replay(t, capture, **_):
    """Sends a real node's recorded handshake frames verbatim."""
    frames = capture.handshake_frames(timeout=20.0)
    if not frames:
        return "skipped: no handshake captured", True
    with connect(t) as s:
        try:
            # Let the acceptor speak first if it does (its challenge), then replay.
            s.settimeout(0.3)
            try:
                s.recv(65536)
            except socket.timeout:
                pass
            s.sendall(b"".join(frames))
        except OSError as e:
            return f"closed during replay ({e})", True
        v = w.verdict(s, PROMPT_LIMIT)
        return v, v.startswith("refused") or v == "closed"


def idle_flood(t, count=1000, hold=3.0, **_):
    """Opens `count` connections and holds them; the target must stay alive
    and, once they are gone, accept and answer a new connection."""
    socks, failed = [], 0
    cpu_before = cpu_seconds(t.pid)
    for _ in range(count):
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", t.port))
            socks.append(s)
        except OSError:
            failed += 1
    time.sleep(hold)
    busy = cpu_seconds(t.pid) - cpu_before
    closed = 0
    for s in socks:
        try:
            if s.recv(1, socket.MSG_PEEK) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    if not t.alive():
        return f"{len(socks)} opened, target died", False
    # Still serving: a fresh connection gets the handshake's first answer.
    try:
        with connect(t) as s:
            s.sendall(os.urandom(64))
            took = wait_closed(s, t, PROMPT_LIMIT)
            served = took is not None
    except ConnectionRefusedError:
        return f"{len(socks)} opened; the listener has closed since (its phase ended)", True
    except OSError:
        served = False
    spinning = busy > 0.6 * hold
    return (f"{len(socks)} opened ({failed} failed), {closed} closed by the target, "
            f"target used {busy:.1f} s CPU in {hold:.0f} s{' (spinning)' if spinning else ''}; "
            f"afterwards {'serving' if served else 'NOT serving'}"), served and not spinning


STRANGER = [garbage, huge_length, huge_length_data, truncated_header, truncated_payload, silent,
            control_before_hello, job_id_leak, wrong_proof, missing_proof, duplicate_stranger, replay]
INSIDER = [duplicate_insider]
