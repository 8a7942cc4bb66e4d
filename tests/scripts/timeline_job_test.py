#!/usr/bin/python3
"""A timeline of real jobs: kvstore_basics under `pushpull launch` with
PUSHPULL_TIMELINE set, once over the parameter server (2 workers, 1 server)
and once over the collectives (dist_sync_allreduce, -s 0), and once with
HOROVOD_TIMELINE, and PUSHPULL_METRICS each time. Every process writes its file; each loads as JSON and holds
the phases of docs/timeline.md (workers: PUSH/PULL requests; server: SUM,
UPDATE, PULL_REPLY; collectives: QUEUE, NEGOTIATE, then the op: allreduce, ...)."""

import glob
import json
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1]


def run_job(tmp, env_name, servers, kvstore):
    base = os.path.join(tmp, f'{kvstore}.json')
    env = dict(os.environ)
    env.pop('PUSHPULL_TIMELINE', None)
    env.pop('HOROVOD_TIMELINE', None)
    env[env_name] = base
    env['PUSHPULL_METRICS'] = os.path.join(tmp, f'{kvstore}-metrics')
    cmd = [os.path.join(BIN, 'pushpull'), 'launch', '-n', '2', '-s', str(servers), '--timeout', '120',
           os.path.join(BIN, 'kvstore_basics'), '--kvstore', kvstore]
    job = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout + job.stderr
    files = {}
    for path in glob.glob(os.path.join(tmp, f'{kvstore}.*.json')):
        with open(path) as f:
            files[os.path.basename(path)] = json.load(f)
    return files


def names(events, *phases):
    return {e['name'] for e in events if e.get('ph') in phases}


def main():
    if not os.path.exists(os.path.join(BIN, 'kvstore_basics')):
        print('SKIP: kvstore_basics not built (PUSHPULL_BUILD_EXAMPLES=OFF)')
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        ps = run_job(tmp, 'PUSHPULL_TIMELINE', 1, 'dist_sync')
        assert {'dist_sync.worker0.json', 'dist_sync.worker1.json',
                'dist_sync.server0.json'} <= set(ps), sorted(ps)
        for w in ('dist_sync.worker0.json', 'dist_sync.worker1.json'):
            got = names(ps[w], 'b')
            assert {'PUSH', 'PULL'} <= got, (w, got)
            begins = sum(1 for e in ps[w] if e.get('ph') == 'b')
            ends = sum(1 for e in ps[w] if e.get('ph') == 'e')
            assert begins == ends, (w, begins, ends)
        got = names(ps['dist_sync.server0.json'], 'X')
        assert {'SUM', 'UPDATE', 'PULL_REPLY'} <= got, got
        # Metrics (PUSHPULL_METRICS): the last line of each file is the final one.
        final = {}
        for role in ('worker0', 'worker1', 'server0'):
            with open(os.path.join(tmp, f'dist_sync-metrics.{role}.jsonl')) as f:
                lines = [json.loads(l) for l in f if l.strip()]
            assert lines and lines[-1]['final'], (role, lines)
            final[role] = lines[-1]['counters']
        assert final['worker0']['ps_requests'] > 0 and final['worker0']['ps_bytes'] > 0, final
        assert final['server0']['server_pushes'] >= 2 and final['server0']['server_pulls'] > 0, final
        assert final['server0']['server_rounds'] > 0, final

        coll = run_job(tmp, 'HOROVOD_TIMELINE', 0, 'dist_sync_allreduce')
        assert {'dist_sync_allreduce.worker0.json', 'dist_sync_allreduce.worker1.json'} <= set(
            coll), sorted(coll)
        for w in ('dist_sync_allreduce.worker0.json', 'dist_sync_allreduce.worker1.json'):
            got = names(coll[w], 'X')
            assert {'QUEUE', 'NEGOTIATE', 'allreduce'} <= got, (w, got)
            lanes = {e['args']['name'] for e in coll[w] if e.get('name') == 'process_name'}
            assert any(l.startswith('rank ') for l in lanes), lanes
            with open(os.path.join(tmp, 'dist_sync_allreduce-metrics.' + w.split('.')[1] + '.jsonl')) as f:
                last = [json.loads(l) for l in f if l.strip()][-1]
            assert last['counters']['collective_ops'] > 0, last
            assert last['counters']['collective_bytes'] > 0, last
    print('timeline_job_test: ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
