#!/usr/bin/python3
"""Short runs of `pushpull bench scaling` and `pushpull bench ps --netns`.

    scaling_netns_test.py BIN_DIR

Needs root and network namespaces (skips with exit status 77 otherwise,
saying why). Checks: the CSV has the documented columns and one row per
configuration with a plausible efficiency; every server host carries its
share of the bytes (with --placement hybrid: BytePS's split); the benchmark leaves no namespace
behind, neither after a normal run nor when it is killed (SIGTERM, SIGKILL)
in the middle of one.
"""

import csv
import io
import os
import re
import signal
import subprocess
import sys
import time

SKIP = 77


def namespaces_of(pid):
    out = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f'ppb{pid}')]


def wait_gone(pid, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not namespaces_of(pid):
            return True
        time.sleep(0.2)
    return False


def check_scaling_csv(pushpull):
    cmd = [pushpull, 'bench', 'scaling', '--netns', '2', '-n', '1,2', '-s', '1,2',
           '--rate', '500mbit', '--compute-ms', '60', '--grad-mb', '0.5', '--layers', '4',
           '--steps', '2', '--warmup', '1', '--timeout', '60', '--format', 'csv']
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=500)
    if p.returncode != 0:
        sys.exit(f'bench scaling failed ({p.returncode}):\n{err[-3000:]}')
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows, f'no rows in:\n{out}\n{err[-2000:]}'
    assert list(rows[0].keys()) == ['impl', 'workers', 'servers', 'placement', 'step_ms',
                                    'steps_per_s', 'efficiency'], rows[0].keys()
    got = {(r['impl'], int(r['workers']), int(r['servers']), r['placement']) for r in rows}
    want = {('pushpull_ring', n, 0, 'none') for n in (1, 2)}
    want |= {('pushpull_ps', n, s, 'dedicated') for n in (1, 2) for s in (1, 2)}
    want |= {('pushpull_ps', n, n, 'colocated') for n in (1, 2)}
    failures = [line for line in err.splitlines() if 'failed' in line or 'rror' in line]
    assert want <= got, f'missing rows {want - got} in:\n{out}\n' + '\n'.join(failures[-20:])
    for r in rows:
        eff = float(r['efficiency'])
        # Sleeps make a step at least --compute-ms long: efficiency can only
        # exceed 1 by the baseline's own noise (2 steps on a loaded machine).
        assert 0.05 < eff < 1.3, r
        assert float(r['step_ms']) >= 55, r
        assert abs(float(r['steps_per_s']) - int(r['workers']) * 1e3 / float(r['step_ms'])) < 0.01 * float(r['steps_per_s']), r
    assert not namespaces_of(p.pid), f'namespaces left behind: {namespaces_of(p.pid)}'
    print(f'bench scaling: {len(rows)} rows, e.g. {rows[-1]}')


def check_ps_netns(pushpull):
    cmd = [pushpull, 'bench', 'ps', '--netns', '2', '-n', '2', '-s', '1,2', '--rate', '1gbit',
           '--sizes', '4M', '--iters', '2', '--format', 'csv']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    if p.returncode != 0:
        sys.exit(f'bench ps --netns failed ({p.returncode}):\n{p.stderr[-3000:]}')
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    impls = {r['impl'] for r in rows}
    assert {'pushpull_1s', 'pushpull_2s', 'pushpull_ring'} <= impls, p.stdout
    for r in rows:
        assert float(r['median_us']) > 0, r
    print(f'bench ps --netns: {sorted(impls)}')
    # The bytes must cross the shaped links: every server host's interface
    # carries about its share. (Namespaces of one kernel can share /dev/shm;
    # when the PS took that shortcut its servers' links carried 0.1 MB.)
    cmd = [pushpull, 'bench', 'ps', '--netns', '2', '-n', '2', '-s', '2', '--rate', '1gbit',
           '--sizes', '4M', '--iters', '2']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r'per server host ([0-9.]+)\.\.([0-9.]+) MB in\+out per iteration '
                  r'\(even share: ([0-9.]+)\)', p.stdout)
    assert m, f'no per-server bytes in:\n{p.stdout}'
    low, share = float(m.group(1)), float(m.group(3))
    assert low >= 0.8 * share, f'a server host carried {low} MB, its share is {share}:\n{p.stdout}'
    print(f'bench ps --netns: {m.group(0)}')
    # Mixed placement: 3 worker hosts serving too and 1 spare host. The
    # workers find the two kinds of server host in their address book and
    # give the spare host BytePS's share (0.4 of the value here; equal
    # shares would give it 0.25, 0.625x the split's bytes).
    cmd = [pushpull, 'bench', 'ps', '--netns', '3', '-s', '1', '--placement', 'hybrid',
           '--rate', '1gbit', '--sizes', '4M', '--iters', '2']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r'per spare host ([0-9.]+)\.\.([0-9.]+) MB in\+out per iteration '
                  r'\(BytePS\'s split: ([0-9.]+)\)', p.stdout)
    assert m, f'no spare-host bytes in:\n{p.stdout}\n{p.stderr[-2000:]}'
    low, high, share = float(m.group(1)), float(m.group(2)), float(m.group(3))
    assert 0.8 * share <= low and high <= 1.25 * share, \
        f'the spare host carried {low}..{high} MB, BytePS\'s split is {share}:\n{p.stdout}'
    print(f'bench ps --netns --placement hybrid: {m.group(0)}')


def check_killed(pushpull, sig):
    # A long run, killed once its namespaces exist: the guardian removes them.
    cmd = [pushpull, 'bench', 'scaling', '--netns', '2', '-n', '2', '--configs', 'ring',
           '--compute-ms', '200', '--grad-mb', '0.5', '--layers', '4', '--steps', '1000']
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not namespaces_of(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert namespaces_of(p.pid), 'the benchmark never made its namespaces'
    time.sleep(4)  # into the runs (iperf3 takes 2 s)
    p.send_signal(sig)
    p.wait(timeout=30)
    assert wait_gone(p.pid), f'{signal.Signals(sig).name}: namespaces left: {namespaces_of(p.pid)}'
    print(f'{signal.Signals(sig).name}: namespaces removed')


def main():
    pushpull = os.path.join(sys.argv[1], 'pushpull')
    if os.geteuid() != 0:
        print('SKIP: needs root to make network namespaces')
        return SKIP
    probe = f'pptest{os.getpid()}'
    if subprocess.run(['ip', 'netns', 'add', probe], capture_output=True).returncode != 0:
        print('SKIP: cannot create a network namespace (ip netns add failed)')
        return SKIP
    subprocess.run(['ip', 'netns', 'del', probe], capture_output=True)
    if subprocess.run(['tc', '-V'], capture_output=True).returncode != 0:
        print('SKIP: tc (iproute2) missing')
        return SKIP
    check_scaling_csv(pushpull)
    check_ps_netns(pushpull)
    check_killed(pushpull, signal.SIGTERM)
    check_killed(pushpull, signal.SIGKILL)
    return 0


if __name__ == '__main__':
    sys.exit(main())
