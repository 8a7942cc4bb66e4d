#!/usr/bin/env python3
"""Runs Horovod's own torch test file (horovod/horovod test/parallel/test_torch.py)
against pushpull.torch, each test alone under `pushpull launch -n N -s 0`, and
prints a table of pass / fail / skip / hang with the skip reasons.

    scripts/horovod_suite.py /tmp/test_torch.py --ranks 2,3,4 --jobs 2 -k alltoall
    make horovod-suite HOROVOD_TEST=/tmp/test_torch.py

Horovod's file is not part of this repository: pass the path of a copy. The
runner writes, into a temporary folder, that file with one change (the line
`import horovod.torch as hvd` becomes `import pushpull.torch as hvd`, or the
module --module names: pushpull.torch.horovod_0_21 for a file of Horovod
<= 0.21, whose allgather/broadcast gradients and alltoall result differ) and a
stand-in for the helper module it imports (`common`: mpi_env_rank_and_size,
skip_or_fail_gpu_test, temppath), written here, not copied. Each test runs as
`python3 -m pytest FILE::Class::test` on every rank, with a small pytest plugin
that writes each rank's outcome (and the skip reason or failure) to a file; a
test still running after --timeout seconds (default 45) is a hang, and its job
is stopped by its process group (the launcher's guardian then stops the ranks).

Python compatibility shim (always on): files written before Python 3.11 call
inspect.getargspec, removed in 3.11; the plugin restores it as
inspect.getfullargspec (the tests read only `.args`).

torch compatibility shim (opt-in, --legacy-type-is-xpu): Intel's copy of the
0.28-era file (intel/intel-optimization-for-horovod) asks `dtype.is_xpu` of the
legacy type classes (torch.FloatTensor, ...). torch 1.13 without Intel's
extension gives those classes no is_xpu: the lookup finds the tensor-instance
descriptor, which is truthy, so cast_and_place calls tensor.xpu() and raises
NotImplementedError before any hvd call. The shim makes the classes answer
False (no torch 1.13 type is an XPU type); tensors and pushpull are untouched.

Exit status: 0 when no test failed or hung, 1 otherwise, 2 on bad arguments.
"""

import argparse
import ast
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMPORT_RE = re.compile(r'^import horovod\.torch as hvd[ \t]*$', re.M)

# Stand-in for Horovod's test/utils/common.py: only what test files import.
COMMON_PY = '''"""pushpull's stand-in for Horovod's test utility module (written for the
suite runner scripts/horovod_suite.py; not Horovod's code)."""
import contextlib
import os
import tempfile


def mpi_env_rank_and_size():
    """(rank, size) of this process from the launcher's variables (pushpull
    launch sets RANK / WORLD_SIZE like torchrun; mpirun's names also work)."""
    for r, s in (('PUSHPULL_RANK', 'PUSHPULL_SIZE'), ('RANK', 'WORLD_SIZE'),
                 ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'), ('PMI_RANK', 'PMI_SIZE')):
        if os.environ.get(r) is not None and os.environ.get(s) is not None:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    """Skips (or fails when HOROVOD_TEST_GPU=1 says a GPU is expected)."""
    if os.environ.get('HOROVOD_TEST_GPU') == '1':
        test.fail(message)
    test.skipTest(message)


@contextlib.contextmanager
def temppath():
    """A path for a temporary file, removed afterwards."""
    fd, path = tempfile.mkstemp()
    os.close(fd)
    os.remove(path)
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)
'''

# pytest plugin loaded on every rank: records each rank's outcome.
PLUGIN_PY = '''"""Writes this rank's test outcome to $PP_SUITE_OUT/rank<r>.json."""
import inspect
import json
import os

if not hasattr(inspect, 'getargspec'):  # removed in Python 3.11
    inspect.getargspec = inspect.getfullargspec

# Opt-in (--legacy-type-is-xpu): Intel's XPU copy of the file asks the legacy
# type classes (torch.FloatTensor, ...) for .is_xpu. torch 1.13 without Intel's
# extension has no such class attribute: the lookup falls through to the
# tensor-instance descriptor, which is truthy, and cast_and_place sends every
# CPU tensor to the absent XPU backend before any hvd call. The shim gives the
# legacy type classes is_xpu = False (none of them is an XPU type in torch
# 1.13); tensors and pushpull are untouched.
if os.environ.get('PP_SUITE_LEGACY_IS_XPU') == '1':
    import ctypes
    import gc

    import torch

    _meta = type(torch.FloatTensor)
    gc.get_referents(_meta.__dict__)[0]['is_xpu'] = property(lambda cls: False)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(_meta))

_result = {'outcome': None, 'reason': ''}


def _rank():
    for var in ('PUSHPULL_RANK', 'RANK', 'OMPI_COMM_WORLD_RANK'):
        if os.environ.get(var) is not None:
            return int(os.environ[var])
    return 0


def pytest_runtest_logreport(report):
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(
            report.longrepr)
        _result.update(outcome='skip', reason=reason.replace('Skipped: ', ''))
    elif report.failed:
        text = str(report.longrepr).strip().splitlines()
        _result.update(outcome='fail', reason=text[-1] if text else report.when)
    elif report.when == 'call' and _result['outcome'] is None:
        _result['outcome'] = 'pass'


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get('PP_SUITE_OUT')
    if out:
        with open(os.path.join(out, 'rank%d.json' % _rank()), 'w') as f:
            json.dump(_result, f)
'''


def prepare(test_file, work, module='pushpull.torch'):
    """Writes the import-swapped copy and the helpers; returns its path."""
    text = Path(test_file).read_text()
    swapped, count = IMPORT_RE.subn('import %s as hvd' % module, text)
    if count != 1:
        sys.exit('horovod_suite: expected one line "import horovod.torch as hvd" in %s, found %d'
                 % (test_file, count))
    (work / 'parallel').mkdir()
    (work / 'utils').mkdir()
    dest = work / 'parallel' / 'test_torch.py'
    dest.write_text(swapped)
    (work / 'utils' / 'common.py').write_text(COMMON_PY)
    (work / 'parallel' / 'pp_suite_plugin.py').write_text(PLUGIN_PY)
    return dest


def list_tests(path):
    """'Class::test_name' of every test method of every TestCase-like class,
    each once: a class that defines a name twice has one test of that name
    (Python keeps the last definition; pytest collects it once)."""
    tree = ast.parse(Path(path).read_text())
    tests = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith('test'):
                    test = '%s::%s' % (node.name, item.name)
                    if test not in tests:
                        tests.append(test)
    return tests


RUNNING = set()  # the launchers of tests in flight (stopped on SIGINT / SIGTERM)


def on_signal(signum, frame):
    """Stops every job in flight by its process group, then exits (the
    temporary folder is removed on the way out)."""
    for proc in list(RUNNING):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    raise SystemExit(128 + signum)


def stop(proc):
    """Stops the job we started: its process group, TERM then KILL."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            pass


def run_one(args, dest, test, n):
    """(verdict, reason, seconds, log tail) of one test on n ranks."""
    out = Path(tempfile.mkdtemp(prefix='pp-hvd-%d-' % n, dir=dest.parent.parent))
    env = dict(os.environ, PP_SUITE_OUT=str(out), PYTHONDONTWRITEBYTECODE='1',
               PP_SUITE_LEGACY_IS_XPU='1' if args.legacy_type_is_xpu else '0',
               PYTHONPATH=os.pathsep.join(
                   [str(dest.parent), args.pythonpath, os.environ.get('PYTHONPATH', '')]))
    cmd = [args.bin, 'launch', '-n', str(n), '-s', '0', args.python, '-m', 'pytest', '-q',
           '-p', 'no:cacheprovider', '-p', 'pp_suite_plugin', '%s::%s' % (dest, test)]
    t0 = time.time()
    with open(out / 'log', 'w+b') as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=str(dest.parent), start_new_session=True)
        RUNNING.add(proc)
        try:
            proc.wait(args.timeout)
            hung = False
        except subprocess.TimeoutExpired:
            stop(proc)
            hung = True
        finally:
            RUNNING.discard(proc)
        log.seek(0)
        tail = log.read().decode(errors='replace')[-3000:]
    secs = time.time() - t0
    ranks = []
    for r in range(n):
        f = out / ('rank%d.json' % r)
        ranks.append(json.loads(f.read_text()) if f.exists() else {'outcome': None,
                                                                    'reason': 'no result'})
    if hung:
        return 'hang', 'still running after %d s' % args.timeout, secs, tail
    outcomes = [x['outcome'] for x in ranks]
    if 'fail' in outcomes or None in outcomes or proc.returncode != 0:
        bad = [(r, x) for r, x in enumerate(ranks) if x['outcome'] != 'pass'] or [(0, ranks[0])]
        # The root cause: a rank's own failure, not the PeerFailure the others
        # see when it exits.
        bad.sort(key=lambda rx: 'PeerFailure' in (rx[1]['reason'] or ''))
        r, x = bad[0]
        reason = 'rank %d: %s' % (r, x['reason'] or 'exit %d' % proc.returncode)
        if x['outcome'] is None:  # the rank died before pytest reported: its last words
            lines = [ln for ln in tail.splitlines() if ln.startswith('[worker')]
            reason += ' (%s)' % (lines[-1] if lines else 'launcher exit %d' % proc.returncode)
        if 'fail' not in outcomes and None not in outcomes:
            reason = 'launcher exit %d' % proc.returncode
        return 'fail', reason, secs, tail
    if all(o == 'skip' for o in outcomes):
        return 'skip', ranks[0]['reason'], secs, tail
    if 'skip' in outcomes:
        return 'pass', 'skipped on ranks %s' % [r for r, o in enumerate(outcomes)
                                                if o == 'skip'], secs, tail
    return 'pass', '', secs, tail


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('test_file', help="path of Horovod's test_torch.py (a copy; not in this repo)")
    p.add_argument('--ranks', default='2', help='comma-separated rank counts (default 2)')
    p.add_argument('--jobs', type=int, default=1, help='tests run at once (default 1)')
    p.add_argument('-k', dest='filter', default=None,
                   help='only tests whose name contains this (a regular expression)')
    p.add_argument('--timeout', type=int, default=45, help='seconds per test (default 45)')
    p.add_argument('--bin', default=str(ROOT / 'build' / 'bin' / 'pushpull'))
    p.add_argument('--python', default='/usr/bin/python3',
                   help='interpreter of the ranks (default /usr/bin/python3: Debian torch)')
    p.add_argument('--pythonpath', default=str(ROOT / 'build' / 'python'))
    p.add_argument('--module', default='pushpull.torch',
                   help='what the import line names instead of horovod.torch (default '
                        'pushpull.torch; pushpull.torch.horovod_0_21 for a file written for '
                        'Horovod <= 0.21, docs/python.md)')
    p.add_argument('--legacy-type-is-xpu', action='store_true',
                   help="torch 1.13 shim for Intel's XPU copy of the file: torch.FloatTensor"
                        ' and the other legacy type classes answer is_xpu = False')
    p.add_argument('--json', default=None, help='also write the results here')
    p.add_argument('--markdown', default=None,
                   help='also write the counts and the skipped tests as a Markdown table '
                        '(what docs/python.md shows)')
    p.add_argument('-v', '--verbose', action='store_true', help='print the log of failures')
    args = p.parse_args()
    try:
        counts = [int(x) for x in args.ranks.split(',') if x]
    except ValueError:
        p.error('--ranks takes integers, e.g. 2,3,4')
    if not counts or min(counts) < 1 or args.jobs < 1 or args.timeout < 1:
        p.error('--ranks, --jobs and --timeout must be positive')
    # The ranks run in the temporary folder: relative paths must not change meaning.
    args.bin = str(Path(args.bin).resolve())
    args.pythonpath = str(Path(args.pythonpath).resolve())
    if not Path(args.bin).exists():
        p.error('no pushpull binary at %s (build it, or pass --bin)' % args.bin)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with tempfile.TemporaryDirectory(prefix='pp-hvd-suite-') as tmp:
        dest = prepare(args.test_file, Path(tmp), args.module)
        tests = list_tests(dest)
        if args.filter:
            tests = [t for t in tests if re.search(args.filter, t)]
        if not tests:
            sys.exit('horovod_suite: no test matches')
        jobs = [(t, n) for n in counts for t in tests]
        results = {}
        pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
        try:
            futures = {pool.submit(run_one, args, dest, t, n): (t, n) for t, n in jobs}
            for fut in concurrent.futures.as_completed(futures):
                t, n = futures[fut]
                results[(t, n)] = fut.result()
                verdict, reason, secs, tail = results[(t, n)]
                print('%-5s n=%d %5.1fs %s %s' % (verdict, n, secs, t.split('::')[-1],
                                                  reason), flush=True)
                if args.verbose and verdict in ('fail', 'hang'):
                    print(tail, flush=True)
        finally:  # on a signal: no test not yet started runs
            pool.shutdown(wait=True, cancel_futures=True)
    report(tests, counts, results)
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{'test': t, 'ranks': n, 'verdict': v, 'reason': r, 'seconds': round(s, 1)}
             for (t, n), (v, r, s, _) in sorted(results.items())], indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(tests, counts, results))
    bad = [k for k, v in results.items() if v[0] in ('fail', 'hang')]
    return 1 if bad else 0


def markdown(tests, counts, results):
    """Counts per rank count, then each test that did not pass everywhere."""
    lines = ['| ranks | pass | fail | hang | skip | slowest test |', '|---|---|---|---|---|---|']
    for n in counts:
        v = [results[(t, n)][0] for t in tests]
        lines.append('| %d | %d | %d | %d | %d | %.1f s |' % (
            n, v.count('pass'), v.count('fail'), v.count('hang'), v.count('skip'),
            max(results[(t, n)][2] for t in tests)))
    lines += ['', '| test | %s | reason |' % ' | '.join('%d ranks' % n for n in counts),
              '|---|%s---|' % ('---|' * len(counts))]
    for t in tests:
        verdicts = [results[(t, n)][0] for n in counts]
        if all(v == 'pass' for v in verdicts):
            continue
        reasons = sorted({results[(t, n)][1] for n in counts if results[(t, n)][1]})
        lines.append('| `%s` | %s | %s |' % (t.split('::')[-1], ' | '.join(verdicts),
                                            '; '.join(reasons)))
    return '\n'.join(lines) + '\n'


def report(tests, counts, results):
    """The table: one row per test (a column per rank count), then totals."""
    width = max(len(t.split('::')[-1]) for t in tests)
    print('\n%-*s  %s' % (width, 'test', '  '.join('n=%-5d' % n for n in counts)))
    for t in tests:
        row = '  '.join('%-7s' % results[(t, n)][0] for n in counts)
        reasons = {results[(t, n)][1] for n in counts if results[(t, n)][0] != 'pass'
                   and results[(t, n)][1]}
        print('%-*s  %s %s' % (width, t.split('::')[-1], row, '; '.join(sorted(reasons))))
    print()
    for n in counts:
        tally = {}
        for t in tests:
            tally[results[(t, n)][0]] = tally.get(results[(t, n)][0], 0) + 1
        slowest = max(results[(t, n)][2] for t in tests)
        print('n=%d: %d pass, %d fail, %d hang, %d skip (of %d; slowest %.1f s)' % (
            n, tally.get('pass', 0), tally.get('fail', 0), tally.get('hang', 0),
            tally.get('skip', 0), len(tests), slowest))


if __name__ == '__main__':
    sys.exit(main())
