#!/usr/bin/python3
"""A short run of `pushpull bench startup` (docs/scaling.md "Start-up").

    startup_test.py BIN_DIR

Checks: 4 and 8 ranks, one repeat, both engines: the CSV has the documented
columns, one row per engine and rank count with a finite creation time (the
probes checked the pushpulled value, or the run would have failed) and one
fit row per engine with a finite exponent; a run whose probes all fail (an
invalid variable every rank refuses) is reported as 0 runs, its row NaN, the
benchmark itself still ending well. Every process it starts is killed by its
process group (its own session) if it overruns.
"""

import csv
import io
import math
import os
import signal
import subprocess
import sys


def run(cmd, env=None, timeout=150):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the session this test made for it
        p.communicate()
        raise SystemExit(f'FAIL: {cmd} did not finish within {timeout} s')
    return p.returncode, out, err


def rows(out):
    return list(csv.DictReader(io.StringIO(out)))


def main():
    pushpull = os.path.join(sys.argv[1], 'pushpull')
    cmd = [pushpull, 'bench', 'startup', '--ranks', '4,8', '--repeats', '1', '--engines',
           'ps,collective', '--timeout', '60', '--format', 'csv']
    code, out, err = run(cmd)
    if code != 0:
        raise SystemExit(f'FAIL: exit {code}\n{err}')
    table = rows(out)
    assert table and list(table[0].keys()) == [
        'kind', 'engine', 'ranks', 'create_s', 'pushpull_s', 'job_s', 'runs'], out
    for engine in ('ps', 'collective'):
        got = {int(r['ranks']): r for r in table if r['kind'] == 'row' and r['engine'] == engine}
        assert sorted(got) == [4, 8], (engine, out)
        for n, r in got.items():
            create, job = float(r['create_s']), float(r['job_s'])
            assert r['runs'] == '1', (engine, n, r)
            assert math.isfinite(create) and 0 < create <= job, (engine, n, r)
        fit = [r for r in table if r['kind'] == 'fit' and r['engine'] == engine]
        assert len(fit) == 1 and math.isfinite(float(fit[0]['create_s'])), (engine, out)

    # Every probe refuses its environment: the run fails, the row says so.
    env = dict(os.environ, PUSHPULL_FLIGHT_RECORDER_SIZE='-1')
    code, out, err = run(cmd[:4] + ['4'] + cmd[5:6] + ['1', '--engines', 'ps', '--timeout',
                                                       '30', '--format', 'csv'], env=env)
    if code != 0:
        raise SystemExit(f'FAIL: a failing run made the benchmark exit {code}\n{err}')
    table = rows(out)
    row = [r for r in table if r['kind'] == 'row']
    assert len(row) == 1 and row[0]['runs'] == '0' and row[0]['create_s'] == 'nan', out
    assert 'ps at 4 ranks failed' in err, err
    print('ok: bench startup at 4 and 8 ranks; a failing run is reported')


if __name__ == '__main__':
    main()
