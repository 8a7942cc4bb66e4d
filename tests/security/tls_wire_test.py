#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""TLS on the wire, end to end: a `--tls` job leaves nothing in clear.

Two network-namespace hosts on a bridge (tests/launch/netns_hosts.py), every
frame of every namespace captured with raw AF_PACKET sockets while jobs run
across the hosts with the launcher's per-node mode (`pushpull launch
--nnodes 2 --node-rank i --nproc-per-node 1`, `ip netns exec`, the same
PUSHPULL_JOB_SECRET and PUSHPULL_JOB_ID on both nodes):

- a parameter-server job (dist_sync, 2 workers, a server per node, node 0's
  launcher hosting the scheduler), plain and with PUSHPULL_TLS=1;
- a collectives job (dist_sync_allreduce, 2 workers), plain and with
  `pushpull launch --tls`.

The workers (tls_wire_worker) push a 1 MiB tensor whose bytes repeat the
text MARKER and check the sum they pull. Verdicts: every job exits 0 with
both workers' values right; in a plain run the captured TCP payloads hold
the marker (the capture works: the test is not vacuous); in a TLS run they
hold neither the marker, nor the job id, nor the secret, and every TCP
connection, seen from its SYN, carries nothing but TLS records in both
directions, the first a handshake record (0x16 0x03 0x01/0x03): no
connection of the job (scheduler, heartbeats, PS data, collectives
rendezvous and data streams) stayed in clear. Same-host connections travel
over the hosts' lo and are captured there.

    tls_wire_test.py --bin-dir build/bin

Needs root and `ip netns`; exits 77 (ctest: skipped) saying why otherwise.
Namespaces, hosts files and processes (by PID: the launchers' process
groups, then anything left in the test's namespaces) are removed at the
end, also on failure or SIGTERM/SIGINT/SIGHUP.
"""

import argparse
import hashlib
import os
import shutil
import signal
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'launch'))
import netns_hosts  # noqa: E402
import wire_capture  # noqa: E402

MARKER = b'pushpull/tls-wire/marker:7f3a9c!'  # tls_wire_worker.cpp's kMarker
TLS_TYPES = {0x14, 0x15, 0x16, 0x17}  # change_cipher_spec, alert, handshake, data
JOB_TIMEOUT = 40
VERBOSE = False


def tls_problem(data):
    """None when `data` is a sequence of TLS records, the first a handshake
    record; else what is wrong."""
    if data[:1] != b'\x16' or data[1:3] not in (b'\x03\x01', b'\x03\x03'):
        return f'starts {data[:16].hex()} {data[:16]!r}, not a TLS handshake record'
    at = 0
    while at < len(data):
        if len(data) - at < 5:
            return f'{len(data) - at} bytes after the last record at {at}'
        kind, major, minor, length = struct.unpack('!BBBH', data[at:at + 5])
        if kind not in TLS_TYPES or major != 3 or minor not in (1, 3) or length > 16384 + 256:
            return f'no TLS record at offset {at}: {data[at:at + 16].hex()} {data[at:at+16]!r}'
        at += 5 + length
    return None


def ns_inodes(cluster):
    """The inodes of the test's network namespaces (a process in one shows
    the same inode at /proc/PID/ns/net, also after `ip netns del`)."""
    inodes = set()
    for ns in cluster.namespaces:
        try:
            inodes.add(os.stat(f'/run/netns/{ns}').st_ino)
        except OSError:
            pass
    return inodes


def kill_leftovers(inodes):
    """SIGKILL every process still in one of those namespaces (started by the
    test: nothing else runs there), by PID; returns their PIDs."""
    killed = []
    for d in os.listdir('/proc'):
        if d.isdigit() and int(d) != os.getpid():
            try:
                if os.stat(f'/proc/{d}/ns/net').st_ino in inodes:
                    os.kill(int(d), signal.SIGKILL)
                    killed.append(int(d))
            except OSError:
                pass
    return killed


def run_job(cluster, bin_dir, tmp, name, ps, tls, port, secret, job_id):
    """Runs the job on hosts a and b under a capture; returns the capture."""
    env = {'PATH': f'{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME': tmp,
           'PUSHPULL_JOB_SECRET': secret, 'PUSHPULL_JOB_ID': job_id,
           'PUSHPULL_LOG_LEVEL': 'warning', 'PUSHPULL_TIMEOUT': '20'}
    flags = []
    if tls == 'env':
        env['PUSHPULL_TLS'] = '1'
    elif tls == 'flag':
        flags = ['--tls']
    log = f'{tmp}/{name}.log'
    cap = wire_capture.Capture(cluster.namespaces).start()
    procs = []
    try:
        for rank, host in enumerate(('a', 'b')):
            argv = [f'{bin_dir}/pushpull', 'launch', *flags, '--nnodes', '2', '--node-rank',
                    str(rank), '--nproc-per-node', '1', *(['-s', '1'] if ps else []),
                    '--master-addr', 'a', '--master-port', str(port), '--',
                    f'{bin_dir}/tls_wire_worker', '--kvstore',
                    'dist_sync' if ps else 'dist_sync_allreduce']
            procs.append(cluster.start(host, argv, log, env=env))
        deadline = time.monotonic() + JOB_TIMEOUT
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        codes = [p.poll() for p in procs]
        time.sleep(0.3)  # the last FINs and ACKs
    finally:
        cap.stop()
    out = open(log, errors='replace').read()
    assert codes == [0, 0], f'{name}: exit codes {codes} (None: still running)\n{out}'
    assert out.count('PASS rank') == 2, f'{name}: not both workers passed\n{out}'
    return cap


def count(haystacks, needle):
    return sum(h.count(needle) for h in haystacks)


def check_run(name, cap, tls, needles, hub):
    conns, other = wire_capture.connections(cap.frames)
    frames = [f for _, _, f in cap.frames]
    streams = [s for c in conns for s in (c.client, c.server) if s.data]
    payload = sum(len(s.data) for s in streams)
    across = sum(1 for c in conns if c.client.flow[0] != c.client.flow[2])
    per_ns = {}
    for ns, _, f in cap.frames:
        per_ns[ns] = per_ns.get(ns, 0) + len(f)
    if VERBOSE:
        for c in conns:
            print(f'  {name}: {c.name()}: {len(c.client.data)} / {len(c.server.data)} bytes, '
                  f'first {c.client.data[:6].hex()} / {c.server.data[:6].hex()}')
    assert cap.drops == 0, f'{name}: the capture dropped {cap.drops} frames'
    assert conns, f'{name}: no TCP connection captured'
    assert across > 0, f'{name}: no connection between the hosts captured'
    # Occurrences in the assembled streams (also split over segments) plus
    # in the raw frames (every capture point, any protocol).
    seen = {what: count(frames, n) + count((s.data for s in streams), n)
            for what, n in needles.items()}
    empty = sum(1 for c in conns if not c.client.data and not c.server.data)
    line = (f'{name}: {len(conns)} connections ({across} between hosts, '
            f'{len(conns) - across} on a host\'s lo; {empty} without a byte of payload), '
            f'{len(cap.frames)} frames, '
            f'{sum(per_ns.values())} bytes captured ({per_ns.get(hub, 0)} on the '
            f'bridge), {payload} bytes of TCP payload, non-TCP frames: '
            f'{", ".join(f"{k} {n}" for k, n in sorted(other.items())) or "none"}; '
            + ', '.join(f'{w} seen {k}x' for w, k in seen.items())
            + ' (streams + frames)')
    if not tls:
        # Not vacuous: the capture sees the tensor and the hellos, and the
        # record check below rejects the plain streams.
        assert seen['pattern'] > 0, f'{name}: the pattern is not in the plain capture: {line}'
        assert seen['job tag'] > 0, f'{name}: no hello in the plain capture: {line}'
        plain = [c for c in conns if c.client.data and tls_problem(c.client.data)]
        assert len(plain) == sum(1 for c in conns if c.client.data), f'{name}: TLS-like stream'
        print(f'{line}; {len(plain)} connections in clear')
        return
    leaks = {w: k for w, k in seen.items() if k}
    # Nothing but TCP carries data: the rest is the kernel's address
    # resolution and multicast membership (ARP, ICMPv6 ND/MLD, IGMP).
    leaks.update({k: n for k, n in other.items() if k not in ('arp', 'icmpv6', 'igmp')})
    assert not leaks, f'{name}: in clear under TLS: {leaks}; {line}'
    bad = []
    for c in conns:
        if not c.client.opened:
            bad.append(f'{c.name()}: its SYN was not captured (opened before the capture?)')
            continue
        for side, s in (('client', c.client), ('server', c.server)):
            if s.gaps:
                bad.append(f'{c.name()} {side}: {s.gaps} gaps in the captured stream')
            elif s.data and (why := tls_problem(s.data)):
                bad.append(f'{c.name()} {side} ({len(s.data)} bytes): {why}')
    assert not bad, f'{name}: connections not (only) TLS:\n  ' + '\n  '.join(bad)
    handshakes = sum(1 for c in conns if c.client.data)
    print(f'{line}; every connection with payload TLS from its first byte, both ways '
          f'({handshakes} handshakes)')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--bin-dir', required=True)
    ap.add_argument('-v', '--verbose', action='store_true', help='list every connection')
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin_dir)
    global VERBOSE
    VERBOSE = args.verbose
    netns_hosts.need_root_and_netns('the TLS wire test')
    netns_hosts.need_programs(bin_dir, ['pushpull', 'tls_wire_worker'], 'the TLS wire test')
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix='pp-tls-wire-')
    state = {}

    def cleanup():
        if 'cluster' in state:
            inodes = ns_inodes(state['cluster'])
            state.pop('cluster').close()  # the launchers' process groups, the namespaces
            kill_leftovers(inodes)
        shutil.rmtree(tmp, ignore_errors=True)
    netns_hosts.cleanup_on_signals(cleanup)
    try:
        cluster = state['cluster'] = netns_hosts.Cluster('tw', [('a', 'eth0'), ('b', 'eth0')])
        tag = os.urandom(6).hex()
        secret = f'tls-wire-secret-{os.urandom(12).hex()}'
        runs = [('ps plain', True, None), ('ps PUSHPULL_TLS=1', True, 'env'),
                ('collectives plain', False, None), ('collectives --tls', False, 'flag')]
        for i, (name, ps, tls) in enumerate(runs):
            job_id = f'tlswire{i}-{tag}'
            cap = run_job(cluster, bin_dir, tmp, name.replace(' ', '_').replace('=', ''), ps,
                          tls, 29400 + 10 * i, secret, job_id)
            # The handshake's job tag (src/transport/hello.cpp) travels in a plain
            # job's hellos: its absence under TLS means the hellos are hidden.
            tag_bytes = hashlib.sha256(b'pushpull job id\n' + job_id.encode()).digest()
            needles = {'pattern': MARKER, 'job tag': tag_bytes, 'job id': job_id.encode(),
                       'secret': secret.encode()}
            check_run(name, cap, tls, needles, cluster.hub)
            left = kill_leftovers(ns_inodes(cluster))
            assert not left, f'{name}: processes left in the namespaces: {left}'
    finally:
        cleanup()
    print(f'TLS wire test passed in {time.monotonic() - t0:.1f} s')


if __name__ == '__main__':
    main()
