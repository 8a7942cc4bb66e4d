"""How a chaos trial is judged (chaos.py, docs/reliability.md): waiting for
the job to train, injecting the fault, the launcher's exit and its code, and
its output (the verdict naming the victim, crashes, core files).
"""

import os
import re
import shutil
import signal
import subprocess
import time

from chaos_procs import kill_quietly, wait_gone
from chaos_trials import SIGNALS

# NONE: a control trial, no fault: the job must succeed, and the launcher end
# within CLEAN_END_S of its last worker (the servers leave by themselves).
CLEAN_END_S = 2.0
CRASH_SIGNALS = 'SIGSEGV|SIGABRT|SIGBUS|SIGFPE|SIGILL|SIGSYS|SIGTRAP'
CRASH_LINE = re.compile(rf'(ended|failed) with signal ({CRASH_SIGNALS})|Segmentation fault|'
                        r'terminate called|AddressSanitizer|ThreadSanitizer|runtime error:')
CRASHED_PID = re.compile(rf'\(pid (\d+)\) (ended|failed) with signal ({CRASH_SIGNALS})')
FAILURE_LINE = re.compile(r'PeerFailure|failed')
NODE_NAME = re.compile(r'\b(worker|server) (\d+)\b')


def expected_code(t):
    if t.signal == 'NONE':
        return 0
    if t.role == 'launcher':
        return {'KILL': -9, 'TERM': 143, 'STOP': None}[t.signal]  # STOP: any failure
    return {'KILL': 137, 'TERM': 143, 'STOP': 1}[t.signal]


def training_seen(engine, proc, out, deadline):
    """Waits until every worker printed the engine's training line."""
    marker = re.compile(engine.marker)

    def training(lines):
        ranks = {m.group(1) for _, _, text in lines if marker.search(text)
                 for m in [re.match(r'\[worker (\d+)\]', text)] if m}
        return len(ranks) == engine.workers or proc.poll() is not None

    return out.wait_for(training, deadline) and proc.poll() is None


def judge_clean(t, engine, proc, tracker, out, started):
    """The control trial: no fault; the job succeeds and ends promptly."""
    if not training_seen(engine, proc, out, started + 120):
        t.reasons.append('the job did not start training (exit code %s)' % proc.poll())
        return
    try:
        proc.wait(timeout=max(1.0, started + 240 - time.monotonic()))
    except subprocess.TimeoutExpired:
        t.reasons.append('the job did not end within 240 s')
        return
    ended = time.monotonic()
    tracker.scan()
    last = tracker.last_gone('worker')
    if proc.returncode != 0:
        t.reasons.append(f'exit code {proc.returncode}, expected 0 (no fault)')
    if last is not None:
        t.exit_s = max(0.0, ended - last)
        if t.exit_s > CLEAN_END_S + 1.0:  # 1 s for this driver's sampling under load
            t.reasons.append(f'the launcher ended {t.exit_s:.1f} s after the last worker exited '
                             f'(servers should stop within {CLEAN_END_S:.0f} s)')


def inject(t, engine, proc, tracker, out, started):
    """Waits for the moment, signals the victim; returns the fault's time, or
    None when the trial could not inject it (reasons/status set)."""
    deadline = started + 120
    if t.moment == 'training':
        if not training_seen(engine, proc, out, deadline):
            t.reasons.append('the job did not start training (exit code %s)' % proc.poll())
            return None
        moment = time.monotonic()
    else:
        while time.monotonic() < deadline and proc.poll() is None:
            if t.role == 'launcher' or tracker.find(t.role, t.rank):
                break
            time.sleep(0.01)
        moment = time.monotonic()
    while time.monotonic() < moment + t.delay:
        if proc.poll() is not None:
            t.status = 'skip'
            t.reasons.append(f'the job ended (exit code {proc.poll()}) before the fault: '
                             'make the job longer or the delay shorter')
            return None
        time.sleep(0.01)
    pid = proc.pid if t.role == 'launcher' else tracker.find(t.role, t.rank)
    if pid is None or proc.poll() is not None:
        t.reasons.append(f'{t.victim()} was not found running at the moment of the fault')
        return None
    os.kill(pid, SIGNALS[t.signal])
    return time.monotonic()


def judge_exit(t, proc, tracker, out, fault_at, limit):
    grace_for_lateness = 10.0  # how long past the limit a late exit is still measured
    if t.role == 'launcher' and t.signal == 'KILL':
        proc.wait()
        gone = wait_gone(tracker, fault_at + limit + grace_for_lateness)
        if gone is None:
            t.reasons.append(f'processes of the job still alive {limit + grace_for_lateness:.0f} s '
                             'after the launcher was killed')
        else:
            t.exit_s = gone - fault_at
        return
    if t.role == 'launcher' and t.signal == 'STOP':
        # The nodes must notice the silent scheduler by themselves (the
        # launcher's own helper processes are stopped with it, or wait for it).
        gone = wait_gone(tracker, fault_at + limit + grace_for_lateness, exclude=(proc.pid,),
                         nodes_only=True)
        if gone is None:
            t.reasons.append('the nodes did not stop while the launcher (scheduler) was stopped')
        else:
            t.exit_s = gone - fault_at
        kill_quietly(proc.pid, signal.SIGCONT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            t.reasons.append('the launcher did not exit within 10 s of SIGCONT')
        return
    try:
        proc.wait(timeout=max(0.0, fault_at + limit + grace_for_lateness - time.monotonic()))
        t.exit_s = time.monotonic() - fault_at
    except subprocess.TimeoutExpired:
        t.reasons.append(f'the launcher did not exit within {limit + grace_for_lateness:.0f} s of '
                         'the fault (hang)')


def check_output(t, lines, fault_at, forced_at, cwd, keep_dir, limit):
    errs = [text for _, name, text in lines if name == 'err' and text.strip()]
    # The launcher's verdict: its last "job failed:" line, which only
    # indented continuation lines ("  consequences: ...") may follow.
    verdict = max((i for i, text in enumerate(errs) if 'job failed:' in text), default=None)
    final_ok = verdict is not None and all(text[:1].isspace() for text in errs[verdict + 1:])
    t.final_line = ' | '.join(errs[verdict:]) if final_ok else (errs[-1] if errs else '')
    crashes = [text for _, _, text in lines if CRASH_LINE.search(text)]
    crashed_pids = {m.group(1) for text in crashes for m in [CRASHED_PID.search(text)] if m}
    cores = sorted(f for f in os.listdir(cwd) if f.startswith('core'))
    # One crash shows as a core file and a launcher line or two: count processes.
    t.crashes = max(len(crashed_pids), len(cores), 1 if crashes else 0)
    for core in cores:  # kept for a backtrace: gdb <program> <core>
        kept = os.path.join(keep_dir, f'trial-{t.index:03d}-{core}')
        shutil.move(os.path.join(cwd, core), kept)
        t.reasons.append(f'core file: {kept}')
    for text in crashes[:3]:
        t.reasons.append('crash: ' + text.strip())
    if fault_at is None:
        return
    # What the job said by itself: not what it said once this driver stopped it.
    after = [(ts, text) for ts, _, text in lines
             if ts >= fault_at and (forced_at is None or ts < forced_at)]
    failure = next((ts for ts, text in after if FAILURE_LINE.search(text)), None)
    if failure is not None:
        t.detect_s = failure - fault_at
    if t.role == 'launcher' and t.signal == 'STOP':
        # A stopped launcher relays no output: the nodes' exits are the detection.
        t.detect_s = t.exit_s
    if t.exit_s is not None and t.exit_s > limit:
        t.reasons.append(f'took {t.exit_s:.1f} s from the fault to the end, limit {limit:.0f} s')
    if t.role == 'launcher' and t.signal == 'KILL':
        return  # nothing to read: the launcher is gone; no process may be left (checked)
    want = expected_code(t)
    if want is None:
        if t.exit_code in (0, None):
            t.reasons.append(f'exit code {t.exit_code}, expected a failure')
    elif t.exit_code != want:
        t.reasons.append(f'exit code {t.exit_code}, expected {want}')
    if t.role == 'launcher' and t.signal == 'STOP' and \
            not any('scheduler' in text for _, text in after):
        t.reasons.append('no node said it lost the scheduler')
    if not final_ok:
        t.reasons.append('the last line is not "job failed: ..."')
    elif t.role == 'launcher':
        if t.signal == 'TERM' and 'SIGTERM' not in t.final_line:
            t.reasons.append('the last line does not say the launcher got SIGTERM')
    else:
        blamed = [f'{m.group(1)} {m.group(2)}' for m in
                  NODE_NAME.finditer(errs[verdict].split('job failed:', 1)[1])]
        if t.victim() not in blamed:
            t.reasons.append(f'the last line does not name {t.victim()}')
        elif blamed[0] != t.victim():
            t.reasons.append(f'the last line blames {blamed[0]} before {t.victim()}')

