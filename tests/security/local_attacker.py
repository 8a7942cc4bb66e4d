#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The unprivileged local attacker (issue 35): another Unix user on the same
host, running as uid 65534 (`setpriv --reuid=65534 --regid=65534
--clear-groups`), against jobs started without a secret set by hand:

- torchrun-style: the ranks started directly with RANK / WORLD_SIZE /
  MASTER_ADDR / MASTER_PORT (what torchrun, mpirun, srun or a user's own
  script does), no PUSHPULL_JOB_SECRET;
- per-node mode: `pushpull launch --nnodes 1 --node-rank 0 ...`, no
  PUSHPULL_JOB_SECRET.

Both must use the per-user secret file ($HOME/.config/pushpull/secret;
HOME is a temporary home here, laid out like a real one: the home and
~/.config world-traversable, so only pushpull's own modes protect the
secret). The attacker tries to read the secret file and to join every
listening port of the job with a hello carrying an all-zero proof (what a
node without a secret sends), claiming a member's identity: first rank 0's
rendezvous alone (the other ranks start late), then every port of the
running job. Verdicts: the job exits 0 with every rank printing PASS (the
values checked), the file is mode 0600 in a 0700 directory, the attacker
cannot read it, and every join is refused or closed.

Needs root (to drop to another uid) and setpriv; otherwise exits 77 (ctest:
skipped) saying why. Every process it starts is in its own process group,
killed on exit.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pp_procs  # noqa: E402

SKIP = 77
RANKS = 3
NOBODY = 65534

# Run as the attacker (uid 65534): a file of its own in a world-readable
# directory, next to a copy of pp_wire.py.
ATTACKER = r'''
import json, socket, sys, time
import pp_wire
secret_path, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
out = {}
try:
    with open(secret_path) as f:
        out["read secret"] = "READ: " + f.read(8) + "..."
except OSError as e:
    out["read secret"] = "refused: " + e.strerror
for port in ports:
    for rank in (0, 1):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
                s.settimeout(3)
                pp_wire.connector_handshake(s, time.monotonic() + 3, pp_wire.ROLES["worker"],
                                            rank, "missing")
                v = pp_wire.verdict(s, 3)
        except pp_wire.Closed:
            v = "closed"
        except OSError as e:
            v = "closed (%s)" % e
        out["port %d: join as worker %d with a zero proof" % (port, rank)] = v
print(json.dumps(out))
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Proc:
    """A child in its own process group; its output lines collected."""

    def __init__(self, argv, env):
        self.p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def count(self, word):
        return sum(1 for l in list(self.lines) if word in l)

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()


class Suite:
    def __init__(self, bin_dir, python):
        self.bin_dir, self.python = bin_dir, python
        self.failures, self.procs = [], []
        self.tmp = tempfile.mkdtemp(prefix="pp-local-attacker.")
        os.chmod(self.tmp, 0o755)
        # The victim's home, as a real one: traversable by others.
        self.home = os.path.join(self.tmp, "home")
        os.makedirs(os.path.join(self.home, ".config"))
        os.chmod(self.home, 0o755)
        os.chmod(os.path.join(self.home, ".config"), 0o755)
        self.secret = os.path.join(self.home, ".config", "pushpull", "secret")
        # The attacker's files.
        self.adir = os.path.join(self.tmp, "attacker")
        os.makedirs(self.adir)
        shutil.copy(os.path.join(HERE, "pp_wire.py"), self.adir)
        with open(os.path.join(self.adir, "attack.py"), "w") as f:
            f.write(ATTACKER)
        for name in os.listdir(self.adir):
            os.chmod(os.path.join(self.adir, name), 0o644)
        os.chmod(self.adir, 0o755)

    def cleanup(self):
        for p in self.procs:
            p.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def env(self):
        env = dict(os.environ)
        for k in ("PUSHPULL_JOB_SECRET", "PUSHPULL_JOB_SECRET_FILE", "PUSHPULL_SECRET_FILE",
                  "PUSHPULL_ALLOW_INSECURE", "XDG_CONFIG_HOME", "PUSHPULL_JOB_ID"):
            env.pop(k, None)
        env["HOME"] = self.home
        return env

    def check(self, ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            self.failures.append(what)

    def attack(self, job, ports):
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                self.python, "attack.py", self.secret] + [str(p) for p in sorted(ports)]
        r = subprocess.run(argv, cwd=self.adir, capture_output=True, text=True, timeout=120,
                           env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
        if r.returncode != 0:
            self.check(False, f"{job}: the attacker did not run: {r.stderr.strip()[-400:]}")
            return
        for what, verdict in json.loads(r.stdout).items():
            ok = verdict.startswith("refused") or verdict.startswith("closed")
            self.check(ok, f"{job}: {what}: {verdict}")

    def check_file(self, job):
        try:
            st = os.lstat(self.secret)
            dst = os.lstat(os.path.dirname(self.secret))
        except OSError as e:
            self.check(False, f"{job}: no per-user secret file at {self.secret} ({e})")
            return
        self.check(stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600,
                   f"{job}: the secret file is mode {stat.S_IMODE(st.st_mode):04o} (want 0600)")
        self.check(stat.S_IMODE(dst.st_mode) == 0o700,
                   f"{job}: its directory is mode {stat.S_IMODE(dst.st_mode):04o} (want 0700)")

    def job_ports(self, root_pids):
        pids = set()
        for r in root_pids:
            pids |= {r} | set(pp_procs.descendants(r))
        return {port for _, port in pp_procs.listeners(pids)}

    def wait_ready(self, procs, want, limit=60):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if sum(p.count("READY") for p in procs) >= want:
                return True
            if any(p.p.poll() not in (None, 0) for p in procs):
                return False
            time.sleep(0.05)
        return False

    def finish(self, job, procs, want_pass):
        for p in procs:
            try:
                p.p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
        codes = [p.p.returncode for p in procs]
        passed = sum(p.count("PASS") for p in procs)
        self.check(all(c == 0 for c in codes) and passed == want_pass,
                   f"{job}: exit codes {codes}, {passed} of {want_pass} ranks printed PASS")
        if not (all(c == 0 for c in codes) and passed == want_pass):
            for p in procs:
                print("\n".join("    " + l for l in p.lines[-30:]))

    def torchrun_style(self):
        job = "torchrun-style"
        port = free_port()
        worker = os.path.join(self.bin_dir, "adversary_allreduce_worker")
        procs = []
        for r in range(RANKS):
            env = self.env()
            env.update(RANK=str(r), WORLD_SIZE=str(RANKS), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(RANKS), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            procs.append(Proc([worker, "--rounds", "120", "--sleep-ms", "50"], env))
            self.procs.append(procs[-1])
            if r == 0:
                # Rank 0's rendezvous alone first, before any member joined.
                end = time.monotonic() + 30
                while not listening(port) and time.monotonic() < end:
                    time.sleep(0.02)
                self.check(listening(port), f"{job}: rank 0 listens on MASTER_PORT {port}")
                self.attack(job + " (rendezvous alone)", {port})
        self.check(self.wait_ready(procs, RANKS), f"{job}: every rank READY")
        self.check_file(job)
        self.attack(job + " (running)", self.job_ports([p.p.pid for p in procs]))
        self.finish(job, procs, RANKS)

    def per_node(self):
        job = "per-node"
        port = free_port()
        argv = [os.path.join(self.bin_dir, "pushpull"), "launch", "--nnodes", "1",
                "--node-rank", "0", "--nproc-per-node", str(RANKS), "--master-addr",
                "127.0.0.1", "--master-port", str(port), "--host-ip", "127.0.0.1",
                "--timeout", "60", "--",
                os.path.join(self.bin_dir, "adversary_allreduce_worker"), "--rounds", "120",
                "--sleep-ms", "50"]
        launcher = Proc(argv, self.env())
        self.procs.append(launcher)
        self.check(self.wait_ready([launcher], RANKS), f"{job}: every rank READY")
        self.check_file(job)
        self.attack(job + " (running)", self.job_ports([launcher.p.pid]))
        self.finish(job, [launcher], RANKS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--job", choices=["torchrun", "per-node", "all"], default="all")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root to run the attacker as another uid (setpriv)")
        return SKIP
    if shutil.which("setpriv") is None:
        print("SKIP: setpriv (util-linux) is not installed")
        return SKIP
    # The attacker's interpreter must be one uid 65534 can run (not a
    # per-user install under /root).
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    suite = Suite(args.bin_dir, python)
    try:
        if args.job in ("torchrun", "all"):
            suite.torchrun_style()
        if args.job in ("per-node", "all"):
            suite.per_node()
    finally:
        suite.cleanup()
    print(f"{len(suite.failures)} failure(s)")
    return 1 if suite.failures else 0


if __name__ == "__main__":
    sys.exit(main())
