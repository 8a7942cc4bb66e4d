#!/usr/bin/python3
"""Draws one training step of a timeline (docs/timeline.md, "Backward and
communication") as a PNG, and prints how much of the step's communication
ran during backward.

    scripts/plot-step-timeline.py [--step K] [--out step.png] trace.rank0.json [trace.rank1.json ...]

Each file is one process's trace (PUSHPULL_TIMELINE) of a loop that marks
its FORWARD, BACKWARD and STEP on the `step` lane (pushpull.timeline.span;
`python3 -m pushpull.bench_step` does). For step K (default: the last one
every file has) it draws, per process, the step lane and every tensor's
QUEUE, NEGOTIATE and allreduce phases, in milliseconds from the step's start
on the first file's process. A timeline of one host shares one clock, so the
processes line up.

Printed per process: the allreduce time of the step (the union of its
tensors' spans), the part of it inside BACKWARD, and the time from the end
of BACKWARD to the end of the step's last allreduce (what backward did not
hide). Needs matplotlib (python3-matplotlib) only with --out.
"""

import argparse
import json
import sys

PHASE_COLORS = {'FORWARD': '#9ecae1', 'BACKWARD': '#3182bd', 'STEP': '#08519c',
                'QUEUE': '#d9d9d9', 'NEGOTIATE': '#fdae6b', 'allreduce': '#31a354'}


def load(path):
    with open(path) as f:
        events = json.load(f)
    lanes, procs = {}, {}
    for e in events:
        if e.get('ph') == 'M' and e.get('name') == 'thread_name':
            lanes[(e['pid'], e['tid'])] = e['args']['name']
        if e.get('ph') == 'M' and e.get('name') == 'process_name':
            procs[e['pid']] = e['args']['name']
    spans = [(procs.get(e['pid'], str(e['pid'])), lanes.get((e['pid'], e['tid']), '?'), e['name'],
              e['ts'], e['ts'] + e['dur']) for e in events if e.get('ph') == 'X']
    return spans


def steps(spans):
    out = []
    for _, lane, name, b, e in sorted((s for s in spans if s[1] == 'step'), key=lambda s: s[3]):
        if name == 'FORWARD':
            out.append({})
        if out:
            out[-1][name] = (b, e)
    return [s for s in out if {'FORWARD', 'BACKWARD', 'STEP'} <= set(s)]


def union(intervals):
    total, end = 0.0, None
    for b, e in sorted(intervals):
        if end is None or b > end:
            total += e - b
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def clipped(intervals, lo, hi):
    return [(max(b, lo), min(e, hi)) for b, e in intervals if min(e, hi) > max(b, lo)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('traces', nargs='+')
    ap.add_argument('--step', type=int, default=-1, help='step index (default: the last)')
    ap.add_argument('--out', help='PNG to write')
    a = ap.parse_args(argv)
    per_file = [load(p) for p in a.traces]
    all_steps = [steps(s) for s in per_file]
    if not all(all_steps):
        sys.exit('no FORWARD/BACKWARD/STEP spans on a step lane in %s' % a.traces)
    k = a.step if a.step >= 0 else min(len(s) for s in all_steps) - 1
    t0 = all_steps[0][k]['FORWARD'][0]
    rows = []  # (label, [(name, begin_ms, end_ms)])
    for path, spans, st in zip(a.traces, per_file, all_steps):
        s = st[k]
        lo, hi = s['FORWARD'][0], s['STEP'][1]
        proc = next((p for p, lane, *_ in spans if lane == 'step'), path)
        ops = [(b, e) for _, _, name, b, e in spans if name == 'allreduce' and lo <= b <= hi]
        comm = union(ops)
        inside = union(clipped(ops, *s['BACKWARD']))
        tail = max((e for _, e in ops), default=s['BACKWARD'][1]) - s['BACKWARD'][1]
        print('%s step %d: step %.1f ms, backward %.1f ms, allreduce %.1f ms of which %.1f ms '
              '(%.0f%%) during backward; %.1f ms after backward' %
              (proc, k, (hi - lo) / 1e3, (s['BACKWARD'][1] - s['BACKWARD'][0]) / 1e3, comm / 1e3,
               inside / 1e3, 100.0 * inside / comm if comm else 0.0, max(tail, 0) / 1e3))
        rows.append(('%s: step' % proc, [(n, (b - t0) / 1e3, (e - t0) / 1e3)
                                          for n, (b, e) in sorted(s.items(), key=lambda x: x[1])]))
        lanes = sorted({lane for _, lane, name, b, e in spans
                        if lane != 'step' and lo <= b <= hi and name in PHASE_COLORS},
                       key=lambda ln: min(b for _, l2, _, b, _ in spans if l2 == ln and lo <= b <= hi))
        for lane in lanes:
            rows.append(('%s: %s' % (proc, lane),
                         [(n, (b - t0) / 1e3, (e - t0) / 1e3) for _, l2, n, b, e in spans
                          if l2 == lane and lo <= b <= hi and n in PHASE_COLORS]))
    if not a.out:
        return 0
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.2))
    for y, (_, bars) in enumerate(reversed(rows)):
        for name, b, e in bars:
            ax.barh(y, e - b, left=b, height=0.7, color=PHASE_COLORS[name], edgecolor='none')
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in reversed(rows)], fontsize=7)
    ax.set_xlabel('ms from the step\'s start')
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASE_COLORS.values()]
    ax.legend(handles, list(PHASE_COLORS), fontsize=7, ncol=6, loc='upper center',
              bbox_to_anchor=(0.5, -0.12 if len(rows) > 8 else -0.3), frameon=False)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110, metadata={'Software': None})
    return 0


if __name__ == '__main__':
    sys.exit(main())
