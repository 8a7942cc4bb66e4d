"""How a survival trial is judged (survive.py, docs/reliability.md): the
scheduler's and the workers' lines, whether the trial should survive (two
servers failed at once do not), and the checks of its output: exact values,
recoveries within their target, the right verdict when it fails.
"""

import os
import re
import shutil

import chaos_judge
from survive_plan import AFTER_LAST_FAULT_S, FAIL_LIMIT_S, RECOVERY_TARGET_S

# The scheduler's lines (in the launcher's own output, not prefixed by a node;
# tagged "scheduler" or not, whichever thread saw the death first).
SCHED_FAILOVER = re.compile(r'^\[pushpull \w [\d:.]+( scheduler)?\] fail-over: server (\d+) ')
SCHED_REJOINED = re.compile(r'^\[pushpull \w [\d:.]+( scheduler)?\] server (\d+) rejoined:')
NO_REPLICA = 'no replica left'
ROUND_LINE = re.compile(r'^\[worker 0\] ROUND (\d+)$')
WORKER_ERROR = re.compile(r'^\[worker \d\] ERROR ')
OK_LINE = re.compile(r'^\[worker (\d)\] OK worker (\d)$')


def resolve_expected(t, lines):
    """'fail' when two distinct servers were failed at once in the scheduler's
    timeline (R=1, 3 servers: any two are neighbours); else 'survive'.
    Also checks that a 'no replica left' verdict had that reason."""
    dead = set()
    verdict = None
    for ts, _, text in lines:
        m = SCHED_FAILOVER.match(text)
        if m:
            if dead - {int(m.group(2))} and verdict is None:
                t.reasons.append(f'server {m.group(2)} failed over while server(s) {sorted(dead)} '
                                 f'were failed too (R=1, 3 servers: a range has no replica '
                                 f'left): {text.strip()}')
            dead.add(int(m.group(2)))
            continue
        m = SCHED_REJOINED.match(text)
        if m:
            dead.discard(int(m.group(2)))
            continue
        if NO_REPLICA in text and verdict is None:
            verdict = (ts, text, set(dead))
    if verdict is None:
        return 'survive', None
    _, text, was_dead = verdict
    m = re.search(r'server (\d+) \(pid', text) or re.search(r'server (\d+)', text)
    victim = int(m.group(1)) if m else None
    justified = bool(was_dead - {victim})
    if not justified:
        t.reasons.append(f'"no replica left" although no other server was failed over '
                         f'(failed then: {sorted(was_dead) or "none"}): {text.strip()}')
        return 'survive', verdict
    return 'fail', verdict


def judge(t, lines, cwd, cfg, forced_at, proc):
    errs = [text for _, name, text in lines if name == 'err' and text.strip()]
    verdict_i = max((i for i, text in enumerate(errs) if 'job failed:' in text), default=None)
    t.final_line = ' | '.join(errs[verdict_i:verdict_i + 2]) if verdict_i is not None else \
        (errs[-1] if errs else '')
    # Crashes: a core file, a crash signal in the launcher's -v lines.
    crashes = [text for _, _, text in lines if chaos_judge.CRASH_LINE.search(text)]
    crashed = {m.group(1) for text in crashes for m in [chaos_judge.CRASHED_PID.search(text)] if m}
    cores = sorted(f for f in os.listdir(cwd) if f.startswith('core'))
    t.crashes = max(len(crashed), len(cores), 1 if crashes else 0)
    for core in cores:
        kept = os.path.join(cfg.keep_dir, f'survive-{t.index:03d}-{core}')
        shutil.move(os.path.join(cwd, core), kept)
        t.reasons.append(f'core file: {kept}')
    for text in crashes[:3]:
        t.reasons.append('crash: ' + text.strip())
    wrong = [text for _, _, text in lines if 'WRONG' in text]
    t.wrong = len(wrong)
    for text in wrong[:3]:
        t.reasons.append('lost/doubled update: ' + text.strip())
    injected = [f for f in t.faults if f.at is not None]
    if len(injected) < len(t.faults):
        t.outcome = 'not injected'
        return
    # Catch-up faults: did the kill land before the server rejoined?
    for f in t.faults:
        if f.after_registered is not None:
            f.in_catchup = not any(
                ts < f.at and SCHED_REJOINED.match(text) and
                int(SCHED_REJOINED.match(text).group(2)) == f.after_registered and
                ts > t.faults[0].at for ts, _, text in lines)
    # What the job said by itself, not once this driver stopped it (a hung
    # job's teardown may print "no replica left" as its servers go).
    own = [ln for ln in lines if forced_at is None or ln[0] < forced_at]
    t.expected, verdict = resolve_expected(t, own)
    if t.apriori == 'survive' and t.expected == 'fail':
        t.reasons.append('a schedule with one faulty server ended with "no replica left"')
    last_fault = max(f.at for f in injected)
    end = forced_at if forced_at is not None else None
    exit_ts = None
    if forced_at is None and t.exit_code is not None:
        # the launcher's exit: the last output line is a close upper bound
        exit_ts = lines[-1][0] if lines else None
    if exit_ts is not None:
        t.end_s = exit_ts - last_fault
    oks = {int(m.group(1)) for _, _, text in lines for m in [OK_LINE.match(text)] if m}
    if t.hang:
        t.outcome = 'hang'
    elif t.expected == 'survive':
        t.outcome = 'survived' if t.exit_code == 0 else 'died'
        if t.exit_code != 0:
            t.reasons.append(f'exit code {t.exit_code}, expected 0 (survivable): {t.final_line}')
        # A worker that failed by itself (not one this driver killed): the job
        # may still end 0 through a restart, but a restart was spent on it.
        for text in [x for _, _, x in lines if WORKER_ERROR.match(x)][:2]:
            t.reasons.append('a worker failed although the job survives: ' + text.strip())
        missing = sorted(set(range(3)) - oks)
        if missing:
            t.reasons.append(f'no "OK worker r" from worker(s) {missing}')
        if t.end_s is not None and t.end_s < AFTER_LAST_FAULT_S and t.exit_code == 0:
            t.reasons.append(f'the job ended {t.end_s:.1f} s after the last fault (plan: at '
                             f'least {AFTER_LAST_FAULT_S:.0f} s): make it longer')
        # Recovery: fault -> next ROUND line (and the second one).
        rounds = [ts for ts, _, text in lines if ROUND_LINE.match(text)]
        for f in injected:
            after = [ts for ts in rounds if ts > f.at]
            if after:
                f.recovery_s = after[0] - f.at
            if len(after) > 1:
                f.recovery2_s = after[1] - f.at
            if f.recovery2_s is not None and f.recovery2_s > RECOVERY_TARGET_S and \
                    not (f.kind == 'stopcont' and f.stop_s + 0.5 >= f.recovery2_s):
                t.reasons.append(f'recovery {f.recovery2_s:.2f} s after "{f.describe()}" '
                                 f'(target {RECOVERY_TARGET_S:.0f} s)')
    else:
        t.outcome = 'failed as expected' if t.exit_code not in (0, None) else 'survived'
        if t.exit_code == 0:
            t.outcome = 'survived'  # the verdict came but the job still ended 0: odd
            t.reasons.append('a "no replica left" verdict, yet exit code 0')
        elif forced_at is not None:
            t.reasons.append('the launcher had to be stopped by this driver')
        if verdict is not None:
            took = (exit_ts or verdict[0]) - max(f.at for f in injected if f.at <= verdict[0]) \
                if any(f.at <= verdict[0] for f in injected) else None
            t.end_s = took
            if took is not None and took > FAIL_LIMIT_S:
                t.reasons.append(f'the non-survivable job took {took:.1f} s to end '
                                 f'(limit {FAIL_LIMIT_S:.0f} s)')
        if 'job failed:' not in t.final_line or NO_REPLICA not in ' '.join(errs[-3:] + [t.final_line]):
            t.reasons.append(f'the final line does not say "no replica left": {t.final_line}')


