#!/usr/bin/python3
"""Prometheus endpoints of a real job (docs/timeline.md, "Prometheus").

`pushpull launch -n 2 -s 1` runs ps_loop_worker (push/pull in a loop, ended
with the launcher's SIGTERM) with
PUSHPULL_METRICS_PORT=P: server 0, worker 0 and worker 1 (host process
indexes 0, 1, 2) serve http://127.0.0.1:P+i/metrics. The test scrapes each
endpoint directly (exposition format, role/rank labels, counters moving), then,
when Debian's `prometheus` is installed, starts it with a generated config
scraping the three ports every second and asks its HTTP API for the series:
every target up, pushpull_server_rounds_total{role="server",rank="0"} > 0 and
pushpull_ps_requests_total of both workers > 0. Without the binary that part
is skipped with a reason (the direct scrape still runs); exit 0 either way.
Every process is ended by its PID."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

BIN = sys.argv[1]
DEADLINE_S = 60


def free_port_block(n):
    """A base port P with P..P+n-1 free (checked by binding each)."""
    for _ in range(50):
        s = socket.socket()
        s.bind(('127.0.0.1', 0))
        base = s.getsockname()[1]
        s.close()
        if base + n > 65535:
            continue
        socks = []
        try:
            for i in range(n):
                t = socket.socket()
                t.bind(('127.0.0.1', base + i))
                socks.append(t)
            return base
        except OSError:
            pass
        finally:
            for t in socks:
                t.close()
    raise RuntimeError('no free port block')


def get(url, timeout=3):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get('Content-Type', ''), r.read().decode()


def wait_for(what, fn, deadline):
    last = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(0.3)
    raise AssertionError(f'timed out waiting for {what} (last error: {last})')


def sample(text, name, role, rank):
    m = re.search(r'^%s\{role="%s",rank="%s"\} (\d+)$' % (name, role, rank), text, re.M)
    return int(m.group(1)) if m else None


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_prometheus(tmp, ports, deadline):
    prom = shutil.which('prometheus')
    if prom is None:
        print('SKIP (prometheus part): the prometheus binary is not installed (make deps)')
        return
    web = free_port_block(1)
    cfg = os.path.join(tmp, 'prometheus.yml')
    targets = ', '.join("'127.0.0.1:%d'" % p for p in ports)
    with open(cfg, 'w') as f:
        f.write('global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n'
                'scrape_configs:\n  - job_name: pushpull\n'
                '    static_configs:\n      - targets: [%s]\n' % targets)
    log = open(os.path.join(tmp, 'prometheus.log'), 'w')
    p = subprocess.Popen([prom, '--config.file=' + cfg, '--storage.tsdb.path=' + os.path.join(tmp, 'tsdb'),
                          '--web.listen-address=127.0.0.1:%d' % web], stdout=log, stderr=log)
    try:
        api = 'http://127.0.0.1:%d/api/v1/query?query=' % web

        def query(q):
            _, _, body = get(api + urllib.parse.quote(q))
            return json.loads(body)['data']['result']

        up = wait_for('every target up in prometheus',
                      lambda: (lambda r: r if len(r) == 3 else None)(query('up == 1')), deadline)
        rounds = wait_for('server rounds in prometheus', lambda: query(
            'pushpull_server_rounds_total{role="server",rank="0"} > 0'), deadline)
        reqs = wait_for('both workers\' requests in prometheus', lambda: (lambda r: r if len(r) == 2 else None)(
            query('pushpull_ps_requests_total{role="worker"} > 0')), deadline)
        print('prometheus: %d targets up; server rounds %s; worker requests %s' % (
            len(up), rounds[0]['value'][1], sorted(r['value'][1] for r in reqs)))
    finally:
        stop(p)
        log.close()


def main():
    worker = os.path.join(BIN, 'ps_loop_worker')
    if not os.path.exists(worker):
        print('SKIP: ps_loop_worker not built')
        return 77
    deadline = time.monotonic() + DEADLINE_S
    with tempfile.TemporaryDirectory() as tmp:
        base = free_port_block(3)
        env = dict(os.environ, PUSHPULL_METRICS_PORT=str(base))
        job = subprocess.Popen([os.path.join(BIN, 'pushpull'), 'launch', '-n', '2', '-s', '1',
                                '--timeout', '60', worker], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            roles = [('server', 0), ('worker', 0), ('worker', 1)]
            ports = [base + i for i in range(3)]
            for (role, rank), port in zip(roles, ports):
                url = 'http://127.0.0.1:%d/metrics' % port
                status, ctype, text = wait_for(url, lambda: get(url), deadline)
                assert status == 200 and ctype.startswith('text/plain; version=0.0.4'), (status, ctype)
                assert '# TYPE pushpull_collective_ops_total counter' in text, text[:300]
                name = 'pushpull_server_rounds_total' if role == 'server' else 'pushpull_ps_requests_total'
                wait_for('%s of %s %d above 0' % (name, role, rank),
                         lambda: (sample(get(url)[2], name, role, rank) or 0) > 0, deadline)
                print('scraped %s: %s %s %d = %d' % (url, name, role, rank,
                                                     sample(get(url)[2], name, role, rank)))
            run_prometheus(tmp, ports, deadline)
        finally:
            # The launcher ends the job on SIGTERM (its children by their
            # process groups); a stop file would let one worker leave while
            # the other waits for a round that never comes.
            stop(job)
            out = job.stdout.read()
        assert job.returncode is not None, 'the launcher did not end'
        for port in ports:  # every endpoint went with its process
            try:
                socket.create_connection(('127.0.0.1', port), timeout=1).close()
                raise AssertionError('port %d still served after the job ended: %s' % (port, out))
            except OSError:
                pass
    print('metrics_prometheus_job: ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
