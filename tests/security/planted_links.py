#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Symbolic links and files planted at a job's timeline, metrics and
checkpoint names (issue 35; src/base/private_file.h, docs/security.md).

The job writes into a shared sticky directory S (made here, mode 1777, like
/tmp): `PUSHPULL_TIMELINE=S/tl`, `PUSHPULL_METRICS=S/m`, `--checkpoint-dir
S/ckpt --checkpoint-every 1`, a PS job of 2 workers and 1 server started by
`pushpull launch` with no secret set by hand. Victim files (a file and a
file named like a checkpoint, in a directory of the job's user) are hashed
before and after, and the victim directory listed.

Before start, another user (uid 65534, `setpriv`) plants in S
  - symlinks to the victim at tl.worker0.json, tl.server0.json and
    m.worker0.jsonl;
  - a file of its own (mode 0666) at m.server0.jsonl;
and the job's own user plants symlinks to the victim at tl.worker1.json and
m.worker1.jsonl. While the job runs, the attacker tries to create entries
in S/ckpt and the job's user plants symlinks to the victim checkpoint at
the next rounds' names (S/ckpt/round-N/server-0.ppckpt) as they come.

Verdicts: the job exits 0 with both workers printing PASS; every planted
streaming name is refused with an error naming it (the timeline and metrics
are then not recorded for that process) and left as it was; the symlinks at
checkpoint names are replaced by the checkpoint (a regular file, 0600), not
followed; S/ckpt is 0700 and the attacker could create nothing in it; the
victim files are unchanged and nothing new appeared next to them.

Then the checkpoint directory itself: planted by the attacker as a symlink
to the victim directory, as a directory of its own, or behind a symlink of
its own on the way (S/link/ckpt): the launcher refuses each before starting
anything (exit code 2, naming the path), and the victim directory is
unchanged.

Needs root and setpriv (exit 77 otherwise). Every process runs in its own
process group, killed by PID at the end; S and the victim directory are
removed, even on failure.
"""
import argparse
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pp_local  # noqa: E402

# Run as uid 65534: `plant S VICTIM` before the job, `squat S` while it runs.
ATTACKER = r'''
import errno, os, sys, time
mode, shared = sys.argv[1], sys.argv[2]
if mode == "plant":
    victim = sys.argv[3]
    for name in ("tl.worker0.json", "tl.server0.json", "m.worker0.jsonl"):
        os.symlink(victim, os.path.join(shared, name))
    with open(os.path.join(shared, "m.server0.jsonl"), "w") as f:
        f.write("the attacker's own file\n")
    os.chmod(os.path.join(shared, "m.server0.jsonl"), 0o666)
    os.symlink(os.path.dirname(victim), os.path.join(shared, "ckpt-link"))
    os.mkdir(os.path.join(shared, "ckpt-theirs"))
    os.chmod(os.path.join(shared, "ckpt-theirs"), 0o777)
    os.symlink(os.path.dirname(victim), os.path.join(shared, "link"))
    print("PLANTED", flush=True)
else:
    made, refused = [], set()
    end = time.monotonic() + float(sys.argv[3])
    print("SQUATTING", flush=True)
    while time.monotonic() < end:
        for n in range(1, 40):
            p = os.path.join(shared, "ckpt", "round-%010d" % n)
            try:
                os.symlink("/", p)
                made.append(p)
            except OSError as e:
                refused.add(errno.errorcode.get(e.errno, str(e.errno)))
        time.sleep(0.02)
    print("MADE %s REFUSED %s" % (made, sorted(refused)), flush=True)
'''


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Suite(pp_local.Verdicts):
    def __init__(self, bin_dir):
        super().__init__()
        self.bin_dir = bin_dir
        self.tmp = tempfile.mkdtemp(prefix="pp-planted.")
        os.chmod(self.tmp, 0o755)
        self.shared = os.path.join(self.tmp, "shared")  # like /tmp
        os.mkdir(self.shared)
        os.chmod(self.shared, 0o1777)
        self.victim_dir = os.path.join(self.tmp, "victim")  # the job's user's
        os.mkdir(self.victim_dir)
        self.victim = os.path.join(self.victim_dir, "victim.json")
        self.victim_ckpt = os.path.join(self.victim_dir, "server-0.ppckpt")
        for path in (self.victim, self.victim_ckpt):
            with open(path, "wb") as f:
                f.write(os.urandom(64))
        self.hashes = {p: digest(p) for p in (self.victim, self.victim_ckpt)}
        self.adir = os.path.join(self.tmp, "attacker")
        os.mkdir(self.adir)
        with open(os.path.join(self.adir, "attack.py"), "w") as f:
            f.write(ATTACKER)
        os.chmod(os.path.join(self.adir, "attack.py"), 0o644)
        os.chmod(self.adir, 0o755)
        self.procs = []

    def cleanup(self):
        for p in self.procs:
            p.kill()
        subprocess.run(["rm", "-rf", "--one-file-system", self.tmp], check=False)

    def attacker(self, *args):
        p = pp_local.Proc(pp_local.as_nobody([pp_local.attacker_python(), "attack.py"] +
                                             list(args)),
                          env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
                          cwd=self.adir)
        self.procs.append(p)
        return p

    def victims_unchanged(self, when):
        for path, h in self.hashes.items():
            self.check(digest(path) == h, f"{when}: victim {os.path.basename(path)} unchanged")
        listing = sorted(os.listdir(self.victim_dir))
        self.check(listing == ["server-0.ppckpt", "victim.json"],
                   f"{when}: nothing new in the victim directory: {listing}")

    def launch(self, argv, env=None):
        p = pp_local.Proc([os.path.join(self.bin_dir, "pushpull"), "launch"] + argv,
                          env=pp_local.job_env(env))
        self.procs.append(p)
        return p

    def plant_same_user_links(self, stop):
        """While the job runs: symlinks to the victim checkpoint at the next
        rounds' file names, planted by the job's own user."""
        ckpt, planted = os.path.join(self.shared, "ckpt"), set()
        while not stop.is_set():
            # The last round the job wrote (a regular file, not one planted).
            written = [int(os.path.basename(os.path.dirname(f))[6:])
                       for f in glob.glob(os.path.join(ckpt, "round-*", "server-0.ppckpt"))
                       if not os.path.islink(f)]
            if os.path.isdir(ckpt):
                last = max(written, default=0)
                for n in range(last + 1, last + 3):
                    d = os.path.join(ckpt, "round-%010d" % n)
                    try:
                        os.makedirs(d, mode=0o700, exist_ok=True)
                        os.symlink(self.victim_ckpt, os.path.join(d, "server-0.ppckpt"))
                        planted.add(os.path.join(d, "server-0.ppckpt"))
                    except OSError:
                        pass
            time.sleep(0.01)
        self.same_user_planted = planted

    def live_job(self):
        job = "live job"
        s = self.shared
        planter = self.attacker("plant", s, self.victim)
        self.check(planter.finish(30) == 0 and planter.count("PLANTED"),
                   "the attacker planted its links and file before the job")
        for name in ("tl.worker1.json", "m.worker1.jsonl"):
            os.symlink(self.victim, os.path.join(s, name))
        env = {"PUSHPULL_TIMELINE": os.path.join(s, "tl"), "PUSHPULL_METRICS":
               os.path.join(s, "m"), "PUSHPULL_METRICS_INTERVAL_MS": "50"}
        squatter = self.attacker("squat", s, "4")
        launcher = self.launch(["-n", "2", "-s", "1", "--timeout", "60", "--checkpoint-dir",
                                os.path.join(s, "ckpt"), "--checkpoint-every", "1", "--",
                                os.path.join(self.bin_dir, "adversary_ps_worker"), "--rounds",
                                "30", "--sleep-ms", "40"], env)
        stop = threading.Event()
        planting = threading.Thread(target=self.plant_same_user_links, args=(stop,))
        planting.start()
        code = launcher.finish(90)
        stop.set()
        planting.join()
        squatter.finish(20)
        out = "\n".join(launcher.lines)
        if not self.check(code == 0 and launcher.count("PASS") == 2,
                          f"{job}: exit code {code}, {launcher.count('PASS')} of 2 PASS"):
            print(launcher.tail(40))
        for name, why in (("tl.worker0.json", "symbolic link"),
                          ("tl.server0.json", "symbolic link"),
                          ("m.worker0.jsonl", "symbolic link"),
                          ("m.server0.jsonl", f"owned by uid {pp_local.NOBODY}"),
                          ("tl.worker1.json", "symbolic link"),
                          ("m.worker1.jsonl", "symbolic link")):
            path = os.path.join(s, name)
            said = any(f"refusing to write '{path}': it is" in line and why in line
                       for line in launcher.lines)
            self.check(said, f"{job}: {name} refused with an error naming it ({why})")
            self.check(os.path.islink(path) or os.lstat(path).st_uid == pp_local.NOBODY,
                       f"{job}: {name} left as planted")
        with open(os.path.join(s, "m.server0.jsonl")) as f:
            self.check(f.read() == "the attacker's own file\n",
                       f"{job}: the attacker's file was not written")
        ckpt = os.path.join(s, "ckpt")
        st = os.lstat(ckpt)
        self.check(st.st_uid == 0 and (st.st_mode & 0o777) == 0o700,
                   f"{job}: the checkpoint directory is the job's, mode {st.st_mode & 0o777:o}")
        self.check(squatter.count("MADE []") == 1,
                   f"{job}: the attacker could create nothing in it: "
                   f"{[l for l in squatter.lines if l.startswith('MADE')]}")
        planted = sorted(getattr(self, "same_user_planted", set()))
        replaced = [p for p in planted if os.path.isfile(p) and not os.path.islink(p)
                    and (os.lstat(p).st_mode & 0o777) == 0o600]
        self.check(planted and len(replaced) >= 1 and "not written" not in out,
                   f"{job}: the job's user's symlinks at {len(planted)} checkpoint names: "
                   f"{len(replaced)} replaced by the checkpoint (the rest: rounds after the "
                   "last), none followed")
        self.victims_unchanged(job)

    def refused_dirs(self):
        s = self.shared
        worker = os.path.join(self.bin_dir, "adversary_ps_worker")
        for d, why in (("ckpt-link", "symbolic link owned by uid 65534"),
                       ("ckpt-theirs", "owned by uid 65534"),
                       ("link/ckpt", "symbolic link owned by uid 65534")):
            path = os.path.join(s, d)
            p = self.launch(["-n", "1", "-s", "1", "--timeout", "30", "--checkpoint-dir", path,
                             "--checkpoint-every", "1", "--", worker, "--rounds", "2"])
            code = p.finish(30)
            out = "\n".join(p.lines)
            if not self.check(code == 2 and why in out and "--checkpoint-dir" in out,
                              f"--checkpoint-dir {d} (planted): refused before the start, exit "
                              f"code {code} ({why})"):
                print(p.tail())
        self.victims_unchanged("planted checkpoint directories")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    why = pp_local.skip_reason()
    if why:
        print("SKIP: " + why)
        return pp_local.SKIP
    suite = Suite(args.bin_dir)
    try:
        suite.live_job()
        suite.refused_dirs()
    finally:
        suite.cleanup()
    return suite.summary()


if __name__ == "__main__":
    sys.exit(main())
