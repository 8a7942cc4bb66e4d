"""Runs one hvd_worker.py case under `pushpull launch -s 0` for the
test_hvd_*.py suites (the launcher, environment and cleanup of torch_launch.py)."""

import sys

from torch_launch import HERE, run_job


def run_hvd_case(case, n, timeout=120):
    code, out = run_job([sys.executable, str(HERE / 'hvd_worker.py'), case], n, timeout)
    assert code == 0, 'case %s on %d ranks exited %d:\n%s' % (case, n, code, out)
    for r in range(n):
        assert 'PASS %s rank %d of %d' % (case, r, n) in out, out
    assert 'Traceback' not in out, out
    return out
