#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A local user squatting the ports a `pushpull launch` job listens on.

Two ways to race the job (tests/collective/collective_launch_test.cpp,
`CollectiveLaunch.PortSquatter*`):

  window  PORT...   run in the window between the launcher publishing a port
                    and the job's process listening on it (worker 0's command
                    runs this first): bind and listen on each port, on
                    127.0.0.1 and on the wildcard address. A port it gets is
                    held (a child keeps listening for --hold seconds, as a
                    squatter would), and the job then cannot bind it.
  race              while the launcher starts: bind and listen on every port
                    the kernel hands out for port 0 (the ephemeral range,
                    where a launcher's own port-0 bind lands) and on every
                    port of --range, holding the last --max, for --seconds.

It prints one line per port ("squatted P" / "held by the job P: <error>")
and "squatter done: N squatted" at the end; it exits 0 either way (the test
judges). As root, the test runs it as another user (setpriv).
"""
import argparse
import errno
import os
import socket
import sys
import time


def try_listen(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
        s.listen(16)
        return s, None
    except OSError as e:
        s.close()
        return None, e


def hold(socks, seconds):
    """Keeps `socks` listening in a detached child for `seconds`."""
    if not socks or seconds <= 0:
        return
    if os.fork() == 0:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        time.sleep(seconds)
        os._exit(0)


def window(ports, hold_s):
    held = []
    for port in ports:
        got = False
        for host in ('127.0.0.1', '0.0.0.0'):
            s, err = try_listen(host, port)
            if s is not None:
                held.append(s)
                got = True
                print(f'squatted {port} on {host}', flush=True)
                break
        if not got:
            print(f'held by the job {port}: {os.strerror(err.errno)}', flush=True)
    print(f'squatter done: {len(held)} squatted', flush=True)
    hold(held, hold_s)


def race(seconds, lo, hi, most):
    held = []
    deadline = time.monotonic() + seconds
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    ports = list(range(lo, hi + 1)) if hi >= lo else []
    while time.monotonic() < deadline:
        # Whatever port the kernel hands out next, and the range, again and
        # again: a port released by anyone is ours at once.
        s, err = try_listen('127.0.0.1', 0)
        if s is not None:
            held.append(s)
        elif err.errno not in (errno.EMFILE, errno.ENFILE):
            pass
        if len(held) > most:
            # Keep churning (the oldest goes): taking the whole ephemeral
            # range would deny every connect() on the host, which is no
            # attack on pushpull's ports.
            held.pop(0).close()
        for port in ports:
            s, err = try_listen('127.0.0.1', port)
            if s is not None:
                held.append(s)
        time.sleep(0.001)
    print(f'squatter done: {len(held)} squatted', flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('mode', choices=['window', 'race'])
    ap.add_argument('ports', nargs='*', type=int)
    ap.add_argument('--hold', type=float, default=30)
    ap.add_argument('--seconds', type=float, default=5)
    ap.add_argument('--range', default='', help='LO-HI: ports to take too (race)')
    ap.add_argument('--max', type=int, default=2000, help='sockets held at most (race)')
    a = ap.parse_args()
    if a.mode == 'window':
        window([p for p in a.ports if p > 0], a.hold)
    else:
        lo, hi = (map(int, a.range.split('-'))) if a.range else (1, 0)
        race(a.seconds, lo, hi, a.max)
    return 0


if __name__ == '__main__':
    sys.exit(main())
