"""The table of a survival run (survive.py): recovery times, per-scenario
counts and the summary printed (and written as JSON) at the end.
"""

import statistics

from survive_plan import RECOVERY_TARGET_S

# ----------------------------------------------------------------------------
# The run, the table


def summarize(trials):
    rec1 = [f.recovery_s for t in trials for f in t.faults if f.recovery_s is not None]
    rec2 = [f.recovery2_s for t in trials for f in t.faults if f.recovery2_s is not None]
    trial_rec = [max(r) for t in trials
                 for r in [[f.recovery_s for f in t.faults if f.recovery_s is not None]] if r]

    def med(v):
        return round(statistics.median(v), 3) if v else None

    s = {
        'trials': len(trials),
        'passed': sum(t.status == 'pass' for t in trials),
        'failed_trials': sum(t.status == 'fail' for t in trials),
        'apriori': {k: sum(t.apriori == k for t in trials) for k in ('survive', 'fail', 'timing')},
        'expected_survive': sum(t.expected == 'survive' for t in trials),
        'expected_fail': sum(t.expected == 'fail' for t in trials),
        'survived': sum(t.outcome == 'survived' and t.expected == 'survive' for t in trials),
        'failed_as_expected': sum(t.outcome == 'failed as expected' and t.status == 'pass'
                                  for t in trials),
        'died_unexpectedly': sum(t.outcome == 'died' for t in trials),
        'lost_or_doubled_updates': sum(t.wrong > 0 for t in trials),
        'hangs': sum(t.hang for t in trials),
        'crashes': sum(t.crashes for t in trials),
        'orphans': sum(t.orphans for t in trials),
        'not_injected': sum(t.outcome == 'not injected' for t in trials),
        'recovery_next_round_s': {'median': med(rec1), 'max': round(max(rec1), 3) if rec1 else None,
                                  'faults': len(rec1)},
        'recovery_second_round_s': {'median': med(rec2),
                                    'max': round(max(rec2), 3) if rec2 else None},
        'recovery_target_s': RECOVERY_TARGET_S,
        'catchup_faults_in_catchup': sum(f.in_catchup is True for t in trials for f in t.faults),
        'catchup_faults_after_rejoin': sum(f.in_catchup is False for t in trials
                                           for f in t.faults),
    }
    by = {}
    for t in trials:
        by.setdefault(t.scenario, []).append(t)
    s['by_scenario'] = {k: {'trials': len(v), 'passed': sum(t.status == 'pass' for t in v),
                            'expected_fail': sum(t.expected == 'fail' for t in v)}
                        for k, v in sorted(by.items())}
    return s


def table(s):
    r1, r2 = s['recovery_next_round_s'], s['recovery_second_round_s']
    fmt = lambda v: '-' if v is None else f'{v:.2f}'  # noqa: E731
    rows = [
        ('trials', s['trials']), ('passed', s['passed']), ('failed', s['failed_trials']),
        ('a priori survive / fail / timing',
         ' / '.join(str(s['apriori'][k]) for k in ('survive', 'fail', 'timing'))),
        ('expected to survive / to fail', f"{s['expected_survive']} / {s['expected_fail']}"),
        ('survived', s['survived']), ('failed as expected (no replica left)',
                                      s['failed_as_expected']),
        ('died although survivable', s['died_unexpectedly']),
        ('lost/doubled updates (WRONG)', s['lost_or_doubled_updates']),
        ('hangs', s['hangs']), ('crashes', s['crashes']), ('orphans', s['orphans']),
        ('faults not injected', s['not_injected']),
        ('catch-up kills in / after catch-up',
         f"{s['catchup_faults_in_catchup']} / {s['catchup_faults_after_rejoin']}"),
        ('recovery to next ROUND median / max (s)', f"{fmt(r1['median'])} / {fmt(r1['max'])}"),
        ('recovery to 2nd ROUND median / max (s)', f"{fmt(r2['median'])} / {fmt(r2['max'])}"),
        ('recovery target (s)', f"{s['recovery_target_s']:.0f}"),
    ]
    w = max(len(k) for k, _ in rows)
    out = [f'{k:<{w}}  {v}' for k, v in rows]
    out.append('')
    out.append(f'{"scenario":<16} {"trials":>6} {"passed":>6} {"exp.fail":>8}')
    for k, v in s['by_scenario'].items():
        out.append(f'{k:<16} {v["trials"]:>6} {v["passed"]:>6} {v["expected_fail"]:>8}')
    return '\n'.join(out)


