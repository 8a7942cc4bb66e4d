#!/usr/bin/python3
"""One timeline file for a job (docs/timeline.md, "One file for the job").

`pushpull launch -n 2 -s 1 --timeline-filename F kvstore_basics --kvstore dist_sync`
(3 processes): the per-process files F.worker0.json, F.worker1.json,
F.server0.json stay, each with its pushpull_clock_offset (measured against the
launcher's clock service), and the launcher merges them into F: one valid
Chrome trace (a JSON array) holding every process's events, pids kept apart,
times shifted by each file's offset. On one host every clock is the same
CLOCK_MONOTONIC, so each measured offset is the alignment error itself: it
must stay within half its round trip (the method's bound) and under 1 ms."""

import glob
import json
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1]


def main():
    if not os.path.exists(os.path.join(BIN, 'kvstore_basics')):
        print('SKIP: kvstore_basics not built (PUSHPULL_BUILD_EXAMPLES=OFF)')
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, 'job.json')
        env = {k: v for k, v in os.environ.items() if k not in ('PUSHPULL_TIMELINE', 'HOROVOD_TIMELINE')}
        job = subprocess.run([os.path.join(BIN, 'pushpull'), 'launch', '-n', '2', '-s', '1',
                              '--timeout', '60', '--timeline-filename', base,
                              os.path.join(BIN, 'kvstore_basics'), '--kvstore', 'dist_sync'],
                             env=env, capture_output=True, text=True, timeout=120)
        assert job.returncode == 0, job.stdout + job.stderr
        assert 'timeline: merged 3 files' in job.stderr + job.stdout, job.stderr[-2000:]
        parts = sorted(glob.glob(os.path.join(tmp, 'job.*.json')))
        assert [os.path.basename(p) for p in parts] == [
            'job.server0.json', 'job.worker0.json', 'job.worker1.json'], parts
        with open(base) as f:
            merged = json.load(f)
        assert isinstance(merged, list) and merged, 'not a Chrome trace array'
        assert not [e for e in merged if e.get('name') == 'pushpull_clock_offset']
        total = 0
        nodes = {}
        for path in parts:
            with open(path) as f:
                events = json.load(f)
            off = [e for e in events if e.get('name') == 'pushpull_clock_offset']
            assert len(off) == 1, (path, off)
            a = off[0]['args']
            # One host: the true offset is 0, so the measured one is the error.
            assert abs(a['offset_us']) <= a['rtt_us'] / 2 + 1 and abs(a['offset_us']) < 1000, (path, a)
            print('%s: offset %.1f us, round trip %.1f us, %d samples' % (
                os.path.basename(path), a['offset_us'], a['rtt_us'], a['samples']))
            total += len(events) - 1
            for e in events:
                if e.get('name') == 'process_name':
                    nodes[e['args']['name']] = nodes.get(e['args']['name'], 0) + 1
        assert len(merged) == total, (len(merged), total)
        names = {e['args']['name'] for e in merged if e.get('name') == 'process_name'}
        assert {'worker 0', 'worker 1', 'server 0'} <= names, names
        # Every node's lane has its own pid in the merged file, and each has events.
        pid_of = {e['args']['name']: e['pid'] for e in merged if e.get('name') == 'process_name'}
        assert len(set(pid_of.values())) == len(pid_of), pid_of
        for node in ('worker 0', 'worker 1', 'server 0'):
            n = sum(1 for e in merged if e.get('pid') == pid_of[node] and 'ts' in e)
            assert n > 0, (node, 'has no events')
            print('%s: %d events' % (node, n))
    print('timeline_merged_job: ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
