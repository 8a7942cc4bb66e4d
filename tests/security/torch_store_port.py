#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""MASTER_PORT, the port `pushpull launch` hands a torch.distributed store
(issue 35; src/launch/rendezvous_ports.h, docs/security.md "Ports are bound
once and held until used").

torch's TCPStore binds MASTER_PORT itself and cannot adopt a socket (torch
1.13 has no such option), so the launcher holds the port with a shared
reservation (bound with SO_REUSEADDR, not listening) from its choice until
the job ends. For a `-s 1` and a `-s 0` job, each worker, before it does
anything else:

- binds MASTER_PORT without SO_REUSEADDR, as any other program would: this
  must fail with EADDRINUSE (the port is held, before and after torch's
  store listens), on 0.0.0.0, MASTER_ADDR, [::] and [::1] (IPv6 only);
- then meets the others through a real torch TCPStore on MASTER_ADDR /
  MASTER_PORT (rank 0 hosts it beside the reservation; with no torch
  importable, a listener with SO_REUSEADDR stands in and the test says so),
  and runs the job's pushpull worker (PS or allreduce, values checked).

Verdicts: each job exits 0, both workers print PASS, each says the port was
held, and MASTER_PORT differs from the scheduler's and the rendezvous port.
Runs as any user; every process in its own process group, killed by PID.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pp_local  # noqa: E402

CHECK = r'''
import datetime, errno, os, socket, sys
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
# pushpull's own ports: the scheduler's (-s > 0), rank 0's rendezvous (-s 0).
others = {os.environ.get("PUSHPULL_ROOT_PORT" if sys.argv[1] != "0" else "PUSHPULL_MASTER_PORT")}
print("rank %d: MASTER_PORT %d, pushpull's port(s) %s" % (rank, port, sorted(others - {None})))
if str(port) in others:
    print("FAIL: MASTER_PORT is pushpull's own port"); sys.exit(1)
for fam, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET, addr), (socket.AF_INET6, "::"),
                  (socket.AF_INET6, "::1")):
    s = socket.socket(fam, socket.SOCK_STREAM)
    if host == "::1":  # IPv6 only: not kept off by a reservation on 0.0.0.0 alone
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        s.bind((host, port))
        print("FAIL: bound MASTER_PORT %d on %s without SO_REUSEADDR: not held" % (port, host))
        sys.exit(1)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            print("FAIL: bind %s:%d: %s" % (host, port, e)); sys.exit(1)
    finally:
        s.close()
print("rank %d: HELD (EADDRINUSE without SO_REUSEADDR)" % rank, flush=True)
try:
    import torch.distributed as dist
except ImportError:
    dist = None
if dist is not None:
    store = dist.TCPStore(addr, port, world, rank == 0, datetime.timedelta(seconds=30))
    store.set("rank%d" % rank, "here")
    store.wait(["rank%d" % r for r in range(world)], datetime.timedelta(seconds=30))
    if rank == 0:  # the store's host leaves last (every wait has a deadline)
        store.wait(["done%d" % r for r in range(1, world)], datetime.timedelta(seconds=30))
    else:
        store.set("done%d" % rank, "1")
    print("rank %d: TORCH STORE on MASTER_PORT %d" % (rank, port), flush=True)
else:
    print("rank %d: no torch: a SO_REUSEADDR listener stands in" % rank, flush=True)
    if rank == 0:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", port))
        s.listen()
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    v = pp_local.Verdicts()
    python = pp_local.attacker_python()
    tmp = tempfile.mkdtemp(prefix="pp-torch-store.")
    script = os.path.join(tmp, "check.py")
    with open(script, "w") as f:
        f.write(CHECK)
    procs = []
    try:
        for servers, worker in (("1", "adversary_ps_worker"), ("0", "adversary_allreduce_worker")):
            job = f"-s {servers}"
            cmd = (f"{python} {script} {servers} && exec {os.path.join(args.bin_dir, worker)} "
                   "--rounds 3 --sleep-ms 1")
            p = pp_local.Proc([os.path.join(args.bin_dir, "pushpull"), "launch", "-n", "2", "-s",
                               servers, "--timeout", "60", "--", "sh", "-c", cmd],
                              env=pp_local.job_env())
            procs.append(p)
            code = p.finish(120)
            ok = v.check(code == 0 and p.count("PASS") == 2,
                         f"{job}: exit code {code}, {p.count('PASS')} of 2 workers PASS")
            ok &= v.check(p.count("HELD") == 2, f"{job}: MASTER_PORT held on both workers' "
                          "checks (EADDRINUSE for a bind without SO_REUSEADDR)")
            torch = p.count("TORCH STORE") == 2
            ok &= v.check(torch or p.count("no torch") == 2,
                          f"{job}: " + ("a torch TCPStore served on MASTER_PORT beside the "
                                        "reservation" if torch else
                                        "torch not importable: a SO_REUSEADDR listener stood in"))
            if not ok:
                print(p.tail(40))
    finally:
        for p in procs:
            p.kill()
        os.unlink(script)
        os.rmdir(tmp)
    return v.summary()


if __name__ == "__main__":
    sys.exit(main())
