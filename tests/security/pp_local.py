# SPDX-License-Identifier: Apache-2.0
"""Helpers of the local-user adversary tests (shm_squatter.py,
planted_links.py): jobs started with `pushpull launch` in their own process
group, an attacker run as another uid (setpriv), verdict lines, cleanup by
PID. Standard library only.
"""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

SKIP = 77
NOBODY = 65534
# Variables that would give a job a secret by hand (the tests start jobs
# without one: the launcher makes a fresh one) or move the per-user files.
SECRET_VARS = ("PUSHPULL_JOB_SECRET", "PUSHPULL_JOB_SECRET_FILE", "PUSHPULL_ALLOW_INSECURE",
               "PUSHPULL_JOB_ID", "PUSHPULL_TIMELINE", "HOROVOD_TIMELINE", "PUSHPULL_METRICS",
               "PUSHPULL_CHECKPOINT_KEY_FILE")


def skip_reason():
    """Why the attacker cannot run as another uid here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root to run the attacker as another uid (setpriv)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    return None


def attacker_python():
    """An interpreter uid 65534 can run (not a per-user install under /root)."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def as_nobody(argv):
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] + argv


def job_env(extra=None):
    env = dict(os.environ)
    for k in SECRET_VARS:
        env.pop(k, None)
    env.update(extra or {})
    return env


class Proc:
    """A child in its own process group, its output lines collected; killed
    (the whole group, by its PID) on kill()."""

    def __init__(self, argv, env=None, cwd=None, stdin=None):
        self.argv = argv
        self.p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def count(self, word):
        return sum(1 for line in list(self.lines) if word in line)

    def wait_for(self, word, limit):
        """Until a line contains `word` (True), the process ends or `limit`
        seconds pass (False)."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if self.count(word):
                return True
            if self.p.poll() is not None:
                self.t.join(1)
                return self.count(word) > 0
            time.sleep(0.01)
        return False

    def finish(self, limit):
        """Waits at most `limit` seconds, then kills; returns the exit code."""
        try:
            self.p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.kill()
        self.t.join(2)
        return self.p.returncode

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def tail(self, n=30):
        return "\n".join("    " + line for line in self.lines[-n:])


class Verdicts:
    def __init__(self):
        self.failures = []

    def check(self, ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            self.failures.append(what)
        return ok

    def summary(self):
        print(f"{len(self.failures)} failure(s)", flush=True)
        return 1 if self.failures else 0
