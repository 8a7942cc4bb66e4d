"""The timeline shows what the engine's scheduling promises (issue 15, item
2): a Horovod-style step's gradient allreduces start during backward, not
after it. `python -m pushpull.bench_step --impl hvd` runs under `pushpull
launch -s 0` with PUSHPULL_TIMELINE set; its FORWARD / BACKWARD / STEP spans
(pushpull.timeline) land in each rank's trace next to the engine's QUEUE,
NEGOTIATE and allreduce phases of every layer (docs/timeline.md)."""

import json
import os
import sys

import pytest

torch = pytest.importorskip('torch')

from torch_launch import run_job  # noqa: E402

LAYERS = 4


def load_trace(path):
    with open(path) as f:
        events = json.load(f)
    lanes = {}  # (pid, tid) -> lane name
    for e in events:
        if e.get('ph') == 'M' and e.get('name') == 'thread_name':
            lanes[(e['pid'], e['tid'])] = e['args']['name']
    spans = []
    for e in events:
        if e.get('ph') == 'X':
            spans.append((lanes.get((e['pid'], e['tid'])), e['name'], e['ts'], e['ts'] + e['dur']))
    return spans


def steps_of(spans):
    """The step lane's spans, grouped per step: [{'FORWARD': (b, e), ...}]."""
    out = []
    for lane, name, b, e in sorted((s for s in spans if s[0] == 'step'), key=lambda s: s[2]):
        if name == 'FORWARD':
            out.append({})
        if out:
            out[-1][name] = (b, e)
    return [s for s in out if {'FORWARD', 'BACKWARD', 'STEP'} <= set(s)]


def test_gradient_allreduces_start_during_backward(tmp_path):
    base = str(tmp_path / 'trace.json')
    # 16 MiB in 4 layers: 4 MiB per gradient, above the size that goes out
    # alone as soon as every rank submitted it (never fused, never held).
    rc, out = run_job([sys.executable, '-m', 'pushpull.bench_step', '--impl', 'hvd', '--grad-mb', '16',
                       '--layers', str(LAYERS), '--steps', '4', '--warmup', '1'],
                      2, timeout=180, extra_env={'PUSHPULL_TIMELINE': base})
    assert rc == 0, out
    files = sorted(p for p in os.listdir(tmp_path) if p.startswith('trace.') and p != 'trace.json')
    assert len(files) == 2, (files, out)
    overlapped_steps = 0
    for name in files:
        spans = load_trace(os.path.join(tmp_path, name))
        steps = steps_of(spans)
        assert len(steps) == 5, (name, len(steps))  # warm-up + timed steps
        queued = [s for s in spans if s[1] == 'QUEUE']
        ops = [s for s in spans if s[1] == 'allreduce']
        assert len(ops) >= 5 * LAYERS, (name, len(ops))
        for st in steps:
            fb, fe = st['FORWARD']
            bb, be = st['BACKWARD']
            sb, se = st['STEP']
            assert fe <= bb <= be <= sb <= se, st
            # Every layer's gradient is handed to the engine from its hook,
            # inside backward (QUEUE begins at allreduce_async).
            mine = [q for q in queued if bb <= q[2] <= be]
            assert len(mine) == LAYERS + LAYERS, (name, st, len(mine))  # weights and biases
            # Every allreduce of the step is done when step() returns.
            started = [o for o in ops if bb <= o[2] <= se]
            assert all(o[3] <= se for o in started), (name, st)
            if any(o[2] < be for o in started):
                overlapped_steps += 1
    # Communication runs while backward still computes: the first layers'
    # allreduces start before backward ends (on a loaded 2-core machine a
    # step may miss it; most do not).
    assert overlapped_steps >= 2, overlapped_steps
