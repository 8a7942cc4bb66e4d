#!/usr/bin/python3
"""scripts/timeline-merge.py: per-process files (one cut short, as a killed
process leaves it) merge into one JSON trace with distinct process ids."""

import json
import os
import subprocess
import sys
import tempfile

SOURCE = sys.argv[1]
MERGE = os.path.join(SOURCE, 'scripts', 'timeline-merge.py')


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, 'job.worker0.json'), 'w') as f:
            f.write('[\n{"name":"process_name","ph":"M","pid":1,"args":{"name":"worker 0"}},\n'
                    '{"name":"ALLREDUCE","ph":"X","ts":1,"dur":2,"pid":1,"tid":1}\n]\n')
        with open(os.path.join(tmp, 'job.server0.json'), 'w') as f:  # cut short
            f.write('[\n{"name":"process_name","ph":"M","pid":1,"args":{"name":"server 0"}},\n'
                    '{"name":"SUM","ph":"X","ts":1,"dur":2,"pid":1,"tid":1},\n{"name":"UPD')
        base = os.path.join(tmp, 'job.json')
        out = subprocess.run([sys.executable, MERGE, base], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        with open(base) as f:
            events = json.load(f)
        names = sorted(e['name'] for e in events if e['ph'] == 'X')
        assert names == ['ALLREDUCE', 'SUM'], names
        pids = {e['args']['name']: e['pid'] for e in events if e['name'] == 'process_name'}
        assert len(set(pids.values())) == 2, pids
        again = subprocess.run([sys.executable, MERGE, base], capture_output=True, text=True,
                               timeout=60)  # the merged file itself is not an input
        assert again.returncode == 0 and '2 files' in again.stdout, again.stdout
    print('timeline_merge_test: ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
