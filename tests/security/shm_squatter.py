#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""/dev/shm squatting driven by inotify, by another local user (issue 35).

An attacker running as uid 65534 (`setpriv`) watches /dev/shm with inotify
(libc's inotify_init1 / inotify_add_watch through ctypes). As soon as a
name of a job appears (pushpull-coll-*, pushpull-probe-*, pushpull-net-*;
other jobs' names on this host included) it

- stats it (mode and owner: the job's segments must be 0600 and the job's
  user's) and tries to open it for reading and for writing, to read its
  bytes, to unlink it and to swap a file of its own for it (renameat2's
  RENAME_EXCHANGE: a name the job unlinked meanwhile is not "replaced");
- pre-creates the names it can guess from it: the same prefix with the last
  hex digits changed and with fresh random digits (another rank's segment),
  the name with suffixes (".0", "-1", ...), as world-writable files of its
  own, and as symbolic links to a file of its own (a job that followed one
  would write into the attacker's file).

Jobs, started by `pushpull launch` with no secret set by hand (the launcher
makes one), while the attacker watches:
  collective  3 ranks, -s 0, one host: the ranks' probes and shared-memory
              segments (pushpull-probe-*, pushpull-coll-*);
  ps          2 workers, 1 server, one host: the PS's same-host segments
              (pushpull-net-*).

Verdicts: each job exits 0 with every rank printing PASS (values checked);
the attacker saw the job's names (else the test proves nothing), every name
it saw was 0600 and not its own, it opened, read, unlinked and replaced
none, and its own files are unchanged (nothing was written into them).
Needs root and setpriv, else exits 77 (skipped). The attacker and the jobs
run in their own process groups, killed by PID at the end; every name the
attacker made is removed, even on failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pp_local  # noqa: E402

ATTACKER = r'''
import ctypes, errno, json, os, random, select, struct, sys, time
shm, bait, made_log, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
IN_CREATE, IN_MOVED_TO, IN_ISDIR, IN_NONBLOCK = 0x100, 0x80, 0x40000000, 0o4000
JOB = ("pushpull-coll-", "pushpull-probe-", "pushpull-net-")
libc = ctypes.CDLL("libc.so.6", use_errno=True)
fd = libc.inotify_init1(IN_NONBLOCK)
if fd < 0 or libc.inotify_add_watch(fd, shm.encode(), IN_CREATE | IN_MOVED_TO) < 0:
    print(json.dumps({"error": "inotify: " + os.strerror(ctypes.get_errno())}), flush=True)
    sys.exit(2)
made = set()
log = open(made_log, "a")
def plant(name, link):
    if "/" in name or name in made:
        return
    path = os.path.join(shm, name)
    log.write(path + "\n"); log.flush()  # logged first: removed even if this dies
    try:
        if link:
            os.symlink(bait, path)
        else:
            f = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            os.fchmod(f, 0o666)
            os.ftruncate(f, 1 << 20)
            os.close(f)
        made.add(name)
    except OSError:
        pass
def guesses(name):
    head, _, tail = name.rpartition("-")
    hexd = "0123456789abcdef"
    out = []
    if tail and all(c in hexd for c in tail):
        for i in range(1, 5):  # the last digits changed: a neighbour's name
            for d in random.sample(hexd, 3):
                out.append(head + "-" + tail[:-i] + d + tail[len(tail) - i + 1:])
        for _ in range(6):      # fresh digits: another rank's name
            out.append(head + "-" + "".join(random.choice(hexd) for _ in tail))
    out += [name + s for s in (".0", ".1", "-0", "-1", "-2", ".tmp")]
    return out
seen, attempts = {}, []
print("WATCHING", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:  # until the test closes stdin, at most `seconds`
    r, _, _ = select.select([fd, sys.stdin], [], [], 0.2)
    if sys.stdin in r and not os.read(sys.stdin.fileno(), 64):
        break
    if fd not in r:
        continue
    try:
        buf = os.read(fd, 65536)
    except BlockingIOError:
        continue
    at = 0
    while at + 16 <= len(buf):
        _, mask, _, n = struct.unpack_from("iIII", buf, at)
        name = buf[at + 16:at + 16 + n].rstrip(b"\0").decode(errors="replace")
        at += 16 + n
        # The job's names (other tests' directories and planted files under
        # other prefixes, e.g. pushpull-shmtest-*, are not the job's).
        if mask & IN_ISDIR or not name.startswith(JOB) or name in made or name in seen:
            continue
        path = os.path.join(shm, name)
        rec = {}
        try:
            st = os.lstat(path)
            rec["mode"], rec["uid"] = oct(st.st_mode & 0o7777), st.st_uid
        except OSError as e:
            rec["stat"] = "gone: " + e.strerror
        for what, flags in (("read", os.O_RDONLY), ("write", os.O_RDWR)):
            try:
                g = os.open(path, flags | os.O_NOFOLLOW)
                data = os.read(g, 4096) if what == "read" else b""
                os.close(g)
                attempts.append("OPENED for %s %s (%d bytes read)" % (what, name, len(data)))
            except OSError as e:
                rec["open " + what] = errno.errorcode.get(e.errno, str(e.errno))
        try:
            os.unlink(path)
            attempts.append("UNLINKED " + name)
        except OSError as e:
            rec["unlink"] = errno.errorcode.get(e.errno, str(e.errno))
        mine = os.path.join(shm, "pp-squat-%d-%d" % (os.getpid(), len(seen)))
        log.write(mine + "\n" + path + "\n"); log.flush()
        try:
            if "stat" in rec:  # gone already: there is nothing left to replace
                raise OSError(errno.ENOENT, "gone")
            with open(mine, "w") as f:
                f.write("squatter")
            # RENAME_EXCHANGE swaps only a name that is still there: a name
            # the job unlinked meanwhile (ENOENT) was not replaced.
            if libc.renameat2(-100, mine.encode(), -100, path.encode(), 2) != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))
            attempts.append("REPLACED " + name)
        except OSError as e:
            rec["replace"] = errno.errorcode.get(e.errno, str(e.errno))
            try:
                os.unlink(mine)
            except OSError:
                pass
        seen[name] = rec
        for i, g in enumerate(guesses(name)):
            plant(g, link=(i % 3 == 2))
print(json.dumps({"seen": seen, "attempts": attempts, "made": sorted(made)}), flush=True)
'''


class Suite(pp_local.Verdicts):
    def __init__(self, bin_dir):
        super().__init__()
        self.bin_dir = bin_dir
        self.tmp = tempfile.mkdtemp(prefix="pp-shm-squatter.")
        os.chmod(self.tmp, 0o755)
        self.adir = os.path.join(self.tmp, "attacker")
        os.makedirs(self.adir)
        with open(os.path.join(self.adir, "attack.py"), "w") as f:
            f.write(ATTACKER)
        self.bait = os.path.join(self.adir, "bait")  # the attacker's own file
        with open(self.bait, "w") as f:
            f.write("the attacker's bait\n")
        self.made_log = os.path.join(self.adir, "made.log")
        open(self.made_log, "w").close()
        for name in ("attack.py", "bait", "made.log"):
            os.chmod(os.path.join(self.adir, name), 0o644)
        os.chown(self.bait, pp_local.NOBODY, pp_local.NOBODY)
        os.chown(self.made_log, pp_local.NOBODY, pp_local.NOBODY)
        os.chmod(self.adir, 0o755)
        self.procs = []

    def cleanup(self):
        for p in self.procs:
            p.kill()
        try:
            with open(self.made_log) as f:
                for path in f.read().split():
                    if path.startswith("/dev/shm/") and os.path.lexists(path):
                        st = os.lstat(path)
                        if st.st_uid == pp_local.NOBODY:  # the attacker's, never the job's
                            os.unlink(path)
        except OSError as e:
            print(f"cleanup: {e}")
        for root, dirs, files in os.walk(self.tmp, topdown=False):
            for n in files:
                os.unlink(os.path.join(root, n))
            for n in dirs:
                os.rmdir(os.path.join(root, n))
        os.rmdir(self.tmp)

    def run(self, job, argv, ranks):
        # A name the job unlinks before the attacker gets to it proves
        # nothing: at most 3 jobs until the attacker caught a live one.
        for attempt in range(3):
            attacker = pp_local.Proc(
                pp_local.as_nobody([pp_local.attacker_python(), "attack.py", "/dev/shm",
                                    self.bait, self.made_log, "30"]),
                env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}, cwd=self.adir,
                stdin=subprocess.PIPE)
            self.procs.append(attacker)
            if not self.check(attacker.wait_for("WATCHING", 20),
                              f"{job}: the attacker watches /dev/shm with inotify"):
                print(attacker.tail())
                return
            launcher = pp_local.Proc([os.path.join(self.bin_dir, "pushpull"), "launch"] + argv,
                                     env=pp_local.job_env())
            self.procs.append(launcher)
            code = launcher.finish(90)
            passed = launcher.count("PASS")
            if not self.check(code == 0 and passed == ranks,
                              f"{job}: exit code {code}, {passed} of {ranks} ranks printed PASS"):
                print(launcher.tail())
            time.sleep(0.3)  # the last events reach the attacker
            attacker.p.stdin.close()  # the attacker reports and ends
            attacker.finish(15)
            if self.judge(job, attacker, last=attempt == 2):
                return

    def judge(self, job, attacker, last):
        """False when the attacker caught no live name and this is not the
        last attempt (nothing judged)."""
        report = None
        for line in reversed(attacker.lines):
            if line.startswith("{"):
                report = json.loads(line)
                break
        if not self.check(report is not None and "error" not in report,
                          f"{job}: the attacker reported"):
            print(attacker.tail())
            return
        seen = report["seen"]
        live = [n for n, rec in seen.items() if "mode" in rec]
        if not live and not last:
            print(f"      {job}: every name was gone before the attacker got to it; again")
            return False
        prefixes = sorted({n.rsplit("-", 1)[0] for n in seen})
        self.check(len(seen) > 0, f"{job}: the attacker saw {len(seen)} of the job's names "
                   f"appear ({', '.join(prefixes) or 'none'}) and planted "
                   f"{len(report['made'])} guesses")
        gone = sorted(set(seen) - set(live))
        self.check(len(live) > 0, f"{job}: {len(live)} of them still there when the attacker "
                   f"acted (the others were gone already: {gone or 'none'})")
        for name in sorted(live):
            rec = seen[name]
            self.check(rec["mode"] == "0o600" and rec["uid"] != pp_local.NOBODY,
                       f"{job}: {name}: mode {rec['mode']}, uid {rec['uid']} (want 0600, the "
                       "job's user)")
            refused = [k for k in ("open read", "open write", "unlink", "replace") if k in rec]
            self.check(len(refused) == 4,
                       f"{job}: {name}: refused to the attacker: "
                       + ", ".join(f"{k} {rec[k]}" for k in refused))
        self.check(any(seen[n].get("open read") == "EACCES" for n in live),
                   f"{job}: at least one live name refused the attacker's open (EACCES)")
        self.check(not report["attempts"], f"{job}: the attacker opened, read, unlinked or "
                   f"replaced nothing: {report['attempts'] or 'none'}")
        with open(self.bait) as f:
            self.check(f.read() == "the attacker's bait\n",
                       f"{job}: nothing was written through the attacker's symlinks")
        changed = []
        for name in report["made"]:
            path = os.path.join("/dev/shm", name)
            try:
                st = os.lstat(path)
            except OSError:
                changed.append(name + " (gone)")
                continue
            if st.st_uid != pp_local.NOBODY or (os.path.isfile(path) and not os.path.islink(path)
                                                and st.st_size != 1 << 20):
                changed.append(name)
            elif not os.path.islink(path):
                with open(path, "rb") as f:
                    if f.read(4096).strip(b"\0"):
                        changed.append(name + " (written)")
        self.check(not changed, f"{job}: the attacker's planted files are untouched: "
                   f"{changed or 'all'}")
        return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--job", choices=["collective", "ps", "all"], default="all")
    args = ap.parse_args()
    why = pp_local.skip_reason()
    if why:
        print("SKIP: " + why)
        return pp_local.SKIP
    suite = Suite(args.bin_dir)
    try:
        worker = os.path.join(args.bin_dir, "adversary_allreduce_worker")
        if args.job in ("collective", "all"):
            suite.run("collective", ["-n", "3", "-s", "0", "--timeout", "60", "--", worker,
                                     "--rounds", "8", "--sleep-ms", "20"], 3)
        worker = os.path.join(args.bin_dir, "adversary_ps_worker")
        if args.job in ("ps", "all"):
            suite.run("ps", ["-n", "2", "-s", "1", "--timeout", "60", "--", worker, "--rounds",
                             "8", "--sleep-ms", "20"], 2)
    finally:
        suite.cleanup()
    return suite.summary()


if __name__ == "__main__":
    sys.exit(main())
