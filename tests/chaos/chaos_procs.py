"""The processes of a chaos trial's job (chaos.py, survive.py): the /proc
tracker that records every descendant of the launcher, the launcher's output
line by line, the core size limit of the job, and the end of a trial (what
is left stopped by pid, orphans counted).
"""

import os
import resource
import signal
import subprocess
import threading
import time

CORE_LIMIT = 64 << 20  # enough to tell that a process dumped core, small enough for the disk


# ----------------------------------------------------------------------------
# /proc: the job's process tree


def proc_table():
    """{pid: (ppid, state, starttime)} of every process now."""
    table = {}
    for d in os.listdir('/proc'):
        if not d.isdigit():
            continue
        try:
            with open(f'/proc/{d}/stat') as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(')') + 2:].split()
        table[int(d)] = (int(fields[1]), fields[0], int(fields[19]))
    return table


def proc_state(pid, start):
    """'gone', 'zombie' or 'alive' for the process (pid, starttime)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            stat = f.read()
    except OSError:
        return 'gone'
    fields = stat[stat.rfind(')') + 2:].split()
    if int(fields[19]) != start:
        return 'gone'  # the pid was reused
    return 'zombie' if fields[0] in ('Z', 'X') else 'alive'


def read_role(pid):
    """(role, rank) from the process's environment, as the launcher set it."""
    try:
        with open(f'/proc/{pid}/environ', 'rb') as f:
            env = dict(kv.split(b'=', 1) for kv in f.read().split(b'\0') if b'=' in kv)
    except OSError:
        return None
    role, rank = env.get(b'PUSHPULL_ROLE'), env.get(b'PUSHPULL_RANK')
    if role is None or rank is None:
        return None  # not exec'd yet: still the launcher's environment
    return role.decode(), int(rank)


class Tracker(threading.Thread):
    """Records every descendant of the launcher (pid, starttime, role) until
    stopped, so that none can escape the end-of-trial check."""

    def __init__(self, root):
        super().__init__(daemon=True)
        self.root = root
        self.procs = {}  # pid -> {'start', 'role', 'ppid'}
        self.lock = threading.Lock()
        self.halt = threading.Event()

    def scan(self):
        table = proc_table()
        children = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo, seen = list(children.get(self.root, [])), set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo.extend(children.get(pid, []))
            with self.lock:
                p = self.procs.get(pid)
                if p is None or p['start'] != table[pid][2]:
                    p = self.procs[pid] = {'start': table[pid][2], 'role': None,
                                           'ppid': table[pid][0]}
            if p['role'] is None:
                p['role'] = read_role(pid)
        now = time.monotonic()
        with self.lock:
            for pid, p in self.procs.items():
                if 'gone' not in p and (pid not in table or table[pid][2] != p['start'] or
                                        table[pid][1] in ('Z', 'X')):
                    p['gone'] = now  # exited (a zombie has exited too)

    def run(self):
        while not self.halt.is_set():
            self.scan()
            self.halt.wait(0.05)

    def find(self, role, rank):
        with self.lock:
            for pid, p in self.procs.items():
                if p['role'] == (role, rank) and p['ppid'] == self.root and \
                        proc_state(pid, p['start']) == 'alive':
                    return pid
        return None

    def last_gone(self, role):
        """When the last process of `role` exited, or None if one has not."""
        with self.lock:
            times = [p.get('gone') for p in self.procs.values() if p['role'] and
                     p['role'][0] == role]
        return max(times) if times and None not in times else None

    def alive(self, exclude=(), nodes_only=False):
        """Recorded processes still alive; nodes_only: only those the launcher
        started as a role (not its own helpers, such as a guardian process)."""
        with self.lock:
            items = list(self.procs.items())
        return [(pid, p) for pid, p in items
                if pid not in exclude and (p['role'] or not nodes_only) and
                proc_state(pid, p['start']) == 'alive']


class Output:
    """The launcher's stdout and stderr, line by line with arrival times."""

    def __init__(self, proc):
        self.lines = []  # (time, stream, text)
        self.cond = threading.Condition()
        self.threads = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                        for s, n in ((proc.stdout, 'out'), (proc.stderr, 'err'))]
        for t in self.threads:
            t.start()

    def _read(self, stream, name):
        for raw in iter(stream.readline, b''):
            with self.cond:
                text = raw.decode(errors='replace').rstrip('\n')
                self.lines.append((time.monotonic(), name, text))
                self.cond.notify_all()
        stream.close()

    def wait_for(self, predicate, deadline):
        with self.cond:
            while not predicate(self.lines):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.1))
            return True

    def join(self, timeout):
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))

    def snapshot(self):
        with self.cond:
            return list(self.lines)


def set_core_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    limit = CORE_LIMIT if hard == resource.RLIM_INFINITY else min(CORE_LIMIT, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (limit, max(hard, limit)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (limit, hard))


def kill_quietly(pid, sig):
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def wait_gone(tracker, until, exclude=(), nodes_only=False):
    """Waits until no recorded process but `exclude` is alive; the time then or None."""
    while time.monotonic() < until:
        tracker.scan()
        if not tracker.alive(exclude, nodes_only):
            return time.monotonic()
        time.sleep(0.05)
    return None


def stop_job(t, proc, tracker):
    """Ends whatever is left (a hung launcher, orphans), by pid, and counts
    orphans: processes of the job alive once the launcher is gone. Returns
    when it had to stop the launcher itself, or None."""
    forced_at = None
    if proc.poll() is None:
        forced_at = time.monotonic()
        kill_quietly(proc.pid, signal.SIGCONT)
        kill_quietly(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            kill_quietly(proc.pid, signal.SIGKILL)
            proc.wait()
    t.exit_code = proc.returncode
    # The launcher's children die with it (or are stopped by it); give their
    # exits a moment to show in /proc.
    wait_gone(tracker, time.monotonic() + 2.0)
    tracker.halt.set()
    tracker.join()
    left = tracker.alive()
    for pid, p in left:
        kill_quietly(pid, signal.SIGKILL)
        kill_quietly(pid, signal.SIGCONT)
    if left:
        t.orphans = len(left)
        t.reasons.append('orphans: ' + ', '.join(
            f'{p["role"][0]} {p["role"][1]} (pid {pid})' if p['role'] else f'pid {pid}'
            for pid, p in left))
    return forced_at

