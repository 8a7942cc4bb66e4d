#!/usr/bin/env python3
"""Adversary suite: starts a real job with `pushpull launch` and, while it
runs, attacks every listening port of every process of the job (found in
/proc, including short-lived ones such as the collective rendezvous; the
collectives' data streams come in through the mesh ports) with the attacks of attacks.py. Passes when the job exits 0
with correct values (its workers check every round and print PASS), every
attack got the answer a secure node must give, and no process's command line
shows the job secret.

  adversary.py --bin-dir build/bin --job ps|collective --secret explicit|generated

--secret explicit: PUSHPULL_JOB_SECRET is set for the launcher (the adversary
knows it, which models an insider for the duplicate-identity attack), and the
job runs under `prlimit --nofile` low so the flood drives its processes into
their fd limit. generated: no secret given; the launcher must make one.

A TCP proxy between some nodes and their first peer (the scheduler, or for
collectives the rendezvous of rank 0) records a real handshake for the replay
attack. Every process started here is stopped on exit, even on failure.
"""

import argparse
import ctypes
import os
import random
import resource
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attacks  # noqa: E402
import pp_procs  # noqa: E402
import pp_wire  # noqa: E402

FD_LIMIT = 256  # the job's RLIMIT_NOFILE in the explicit-secret runs


def free_port():
    """A port free on 127.0.0.1 now, below the ephemeral range when it can be
    (as the launcher picks its ports): no connect() takes it meanwhile."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = [random.randrange(10000, low) for _ in range(64)] if low > 11000 else []
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")


class CaptureProxy:
    """Forwards 127.0.0.1:port to 127.0.0.1:upstream and records the first
    connection's connector -> acceptor bytes (its handshake)."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.recorded = bytearray()
        self.captured = threading.Event()
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        first = True
        while not self.stopping:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(down, first), daemon=True).start()
            first = False

    def _serve(self, down, record):
        up = None
        deadline = time.monotonic() + 30
        while up is None and time.monotonic() < deadline and not self.stopping:
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream), timeout=1)
            except OSError:
                time.sleep(0.05)
        if up is None:
            down.close()
            return
        threading.Thread(target=self._pipe, args=(up, down, False), daemon=True).start()
        self._pipe(down, up, record)

    def _pipe(self, src, dst, record):
        src.settimeout(None)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record and len(self.recorded) < 65536:
                    self.recorded += data
                    if any(t == pp_wire.T_HELLO for t, _ in pp_wire.split_frames(self.recorded)):
                        self.captured.set()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handshake_frames(self, timeout):
        """The recorded connector's net handshake frames (types below 16)."""
        if not self.captured.wait(timeout):
            return []
        frames = []
        for t, raw in pp_wire.split_frames(bytes(self.recorded)):
            if t >= 16:
                break
            frames.append(raw)
        return frames

    def close(self):
        self.stopping = True
        self.listener.close()


def set_pdeathsig():
    # The launcher dies with this script (its children die with it in turn).
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Job:
    def __init__(self, args, workdir):
        self.args = args
        bin_dir = args.bin_dir
        self.secret = secrets.token_hex(16) if args.secret == "explicit" else ""
        env = dict(os.environ)
        env.pop("PUSHPULL_JOB_SECRET", None)
        env.pop("PUSHPULL_ALLOW_INSECURE", None)
        self.job_id = ""
        if self.secret:
            # The insider attack knows both (the proof binds the job id).
            env["PUSHPULL_JOB_SECRET"] = self.secret
            self.job_id = "pp-adversary-" + secrets.token_hex(4)
            env["PUSHPULL_JOB_ID"] = self.job_id
        else:
            env.pop("PUSHPULL_JOB_ID", None)
        real_port = free_port()
        self.first_port = real_port  # the scheduler's, or rank 0's rendezvous
        self.proxy = CaptureProxy(real_port)
        rounds = str(args.rounds)
        cmd = [os.path.join(bin_dir, "pushpull"), "launch", "--timeout", "60", "--port",
               str(real_port)]
        if args.job == "ps":
            self.workers = 2
            # Every node reaches the scheduler through the recording proxy.
            cmd += ["-n", "2", "-s", "2", "--env", f"DMLC_PS_ROOT_PORT={self.proxy.port}",
                    "--env", f"PUSHPULL_ROOT_PORT={self.proxy.port}", "--",
                    os.path.join(bin_dir, "adversary_ps_worker"), "--rounds", rounds,
                    "--sleep-ms", "100"]
        else:
            self.workers = 3
            # Ranks 1 and 2 start 3 s late (rank 0's rendezvous is attacked
            # alone meanwhile) and reach it through the recording proxy.
            script = ('if [ "$RANK" != 0 ]; then sleep 3; export MASTER_PORT={p} '
                      'PUSHPULL_MASTER_PORT={p}; fi; exec "$@"').format(p=self.proxy.port)
            cmd += ["-n", "3", "-s", "0", "--", "sh", "-c", script, "sh",
                    os.path.join(bin_dir, "adversary_allreduce_worker"), "--rounds", rounds,
                    "--sleep-ms", "100"]
        if args.secret == "explicit":
            cmd = ["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}"] + cmd
        self.out_path = os.path.join(workdir, "job.out")
        self.out = open(self.out_path, "wb")
        print("+", " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=set_pdeathsig)

    def pids(self):
        return pp_procs.descendants(self.proc.pid) if self.proc.poll() is None else []

    def stop(self):
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.proxy.close()
        self.out.close()

    def output(self):
        with open(self.out_path, "rb") as f:
            return f.read().decode(errors="replace")


class Adversary:
    """Watches the job's processes and attacks each new listening port."""

    def __init__(self, job, skip):
        self.job = job
        self.skip = set(skip)
        self.results = []  # (target, attack, outcome, ok)
        self.lock = threading.Lock()
        self.seen = set()
        self.threads = []
        self.flood_queue = []
        self.cmdline_leak = []
        self.secret_seen = job.secret
        self.version_known = False
        self.job_id_seen = job.job_id

    def alive_fn(self, pid):
        return lambda: os.path.exists(f"/proc/{pid}") and self.job.proc.poll() is None

    def record(self, target, attack, outcome, ok):
        with self.lock:
            self.results.append((target.name(), attack, outcome, ok))

    def run_attack(self, fn, target):
        try:
            outcome, ok = fn(target, secret=self.job.secret, job_id=self.job.job_id,
                             capture=self.job.proxy, observed_job_id=lambda: self.job_id_seen,
                             connected_member=self.connected_member)
        except ConnectionRefusedError:
            outcome, ok = "port already gone (listener closed)", True
        except Exception as e:  # an attack that breaks is a finding, not a crash
            outcome, ok = f"attack error {type(e).__name__}: {e}", False
        self.record(target, fn.__name__, outcome, ok)

    def connected_member(self, target, wait=30.0):
        """(role, rank) of a job process connected to the target, once every
        worker is past its first round (all connections made); None if none."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and self.job.proc.poll() is None:
            if self.job.output().count("READY") >= self.job.workers:
                break
            time.sleep(0.2)
        pids = [p for p in self.job.pids() if p != target.pid]
        connected = pp_procs.connected_to(target.port, pids)
        if target.port == self.job.first_port:
            # The nodes reach this port through the recording proxy.
            connected += pp_procs.connected_to(self.job.proxy.port, pids)
        members = [pp_procs.identity(p, self.job.proc.pid) for p in connected]
        # A worker if there is one (the identity most likely to be claimed).
        members.sort(key=lambda m: (m[0] != "worker", m))
        return members[0] if members else None

    def check_secret_exposure(self, pids):
        for pid in pids:
            env = pp_procs.environ(pid)
            if not self.secret_seen:
                self.secret_seen = env.get("PUSHPULL_JOB_SECRET", "")
            if not self.job_id_seen and pid != self.job.proc.pid:
                self.job_id_seen = env.get("PUSHPULL_JOB_ID", "")
        if self.secret_seen:
            for pid in pids:
                if self.secret_seen in pp_procs.cmdline(pid):
                    self.cmdline_leak.append(pp_procs.label(pid, self.job.proc.pid))

    def watch(self):
        """Polls /proc every 20 ms until the job ends; attacks new listeners."""
        flooder = threading.Thread(target=self.flood_loop, daemon=True)
        flooder.start()
        checked_at = 0.0
        while self.job.proc.poll() is None:
            pids = self.job.pids()
            for pid, port in sorted(pp_procs.listeners(pids)):
                # By port: a child between fork and exec still holds its
                # parent's listening socket; that is one target, not two.
                if port in self.seen:
                    continue
                self.seen.add(port)
                name = pp_procs.label(pid, self.job.proc.pid)
                if port == self.job.first_port:
                    name += " (rendezvous)" if self.job.args.job == "collective" else " (scheduler)"
                t = attacks.Target(pid, port, name, self.alive_fn(pid))
                if not self.version_known:
                    self.version_known = pp_wire.learn_version(port)
                print(f"adversary: attacking {t.name()} (protocol version {pp_wire.VERSION})",
                      flush=True)
                for fn in attacks.STRANGER + attacks.INSIDER:
                    if fn.__name__ in self.skip:
                        continue
                    th = threading.Thread(target=self.run_attack, args=(fn, t), daemon=True)
                    th.start()
                    self.threads.append(th)
                with self.lock:
                    self.flood_queue.append(t)
            if time.monotonic() - checked_at > 1.0:
                self.check_secret_exposure(pids)
                checked_at = time.monotonic()
            time.sleep(0.02)

    def flood_loop(self):
        # One flood at a time (each holds 1000 of this script's fds), after
        # the first attacks had a head start.
        time.sleep(2)
        while self.job.proc.poll() is None:
            with self.lock:
                t = self.flood_queue.pop(0) if self.flood_queue else None
            if t is None or "idle_flood" in self.skip:
                time.sleep(0.1)
                continue
            self.run_attack(attacks.idle_flood, t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--job", choices=["ps", "collective"], required=True)
    ap.add_argument("--secret", choices=["explicit", "generated"], required=True)
    ap.add_argument("--rounds", type=int, default=220)
    ap.add_argument("--skip", action="append", default=[],
                    help="leave out an attack (by function name), to see the others' outcomes")
    ap.add_argument("--timeout", type=float, default=150.0, help="whole-job deadline (s)")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))

    failures = []
    with tempfile.TemporaryDirectory(prefix="pp-adversary-") as workdir:
        job = Job(args, workdir)
        adv = Adversary(job, args.skip)
        try:
            watcher = threading.Thread(target=adv.watch, daemon=True)
            watcher.start()
            try:
                rc = job.proc.wait(args.timeout)
            except subprocess.TimeoutExpired:
                rc = None
                failures.append(f"job still running after {args.timeout:.0f} s")
            watcher.join(5)
            for th in adv.threads:
                th.join(attacks.PREAUTH_LIMIT + 5)
        finally:
            job.stop()
        out = job.output()

    print("---- job output (tail) ----")
    print("\n".join(out.splitlines()[-40:]))
    print("---- attacks ----")
    for target, attack, outcome, ok in sorted(adv.results):
        print(f"{'ok  ' if ok else 'FAIL'} {target:<30} {attack:<22} {outcome}")
        if not ok:
            failures.append(f"{attack} against {target}: {outcome}")
    if rc is not None and rc != 0:
        failures.append(f"job exited with {rc}")
    passes = out.count("PASS rounds=")
    if passes != job.workers:
        failures.append(f"{passes} of {job.workers} workers printed PASS")
    if not adv.seen:
        failures.append("no listening port of the job was found")
    if not adv.secret_seen:
        failures.append("the job ran without a secret (PUSHPULL_JOB_SECRET unset in its processes)")
    if adv.cmdline_leak:
        failures.append("the secret is visible in the command line of " +
                        ", ".join(sorted(set(adv.cmdline_leak))))
    if adv.secret_seen and adv.secret_seen in out:
        failures.append("the secret appears in the job's output")
    print("---- summary ----")
    emfile = out.count("Too many open files")
    print(f"job={args.job} secret={args.secret} exit={rc} targets={len(adv.seen)} "
          f"attacks={len(adv.results)} emfile_log_lines={emfile}")
    for f in failures:
        print("FAILED:", f)
    print("RESULT:", "PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
