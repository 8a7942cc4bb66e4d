"""One worker of `pushpull bench step`: a synthetic data-parallel training step.

    pushpull launch -n 2 -s 0 -- python3 -m pushpull.bench_step --impl hvd --grad-mb 64

Like Horovod's synthetic benchmark: a stack of ``--layers`` square linear
layers (with biases) holding ``--grad-mb`` MiB of float32 parameters, a random
batch of ``--batch`` rows, one torch thread; each step is zero_grad, forward,
backward, the gradient exchange and the optimizer update (SGD). Rank 0 prints
``result <impl> <median step ms>`` over ``--steps`` timed steps after
``--warmup`` untimed ones. Implementations:

- ``ddp`` (or ``ddp-gloo``): ``torch.nn.parallel.DistributedDataParallel``
  over torch's gloo backend (rendezvous through a file in ``--store-dir``,
  which the benchmark makes fresh for each run);
- ``ddp-pushpull``: the same over the ``pushpull`` torch.distributed backend
  (both in bench_step_ddp.py);
- ``hvd``: ``pushpull.torch.DistributedOptimizer`` (Horovod's API over the
  collectives engine);
- ``trainer``: ``pushpull.torch.Trainer`` over a ``dist_sync`` KVStore (run
  with ``-s S`` parameter servers); the update runs on the servers;
- ``local``: no exchange at all, every rank trains its own copy with plain
  SGD: the floor that any exchange adds to when the N ranks share this
  machine's cores (the ranks still start and time together, so they compete
  for the cores as in the other rows).

Every rank runs the same steps; a step ends when the update is applied, so the
ranks stay in lock step through the exchange and rank 0's median stands for
the job.
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch

from pushpull.bench_step_ddp import IMPLS, make_ddp_step


def build_model(grad_mb, layers):
    # d*d + d floats per layer, `layers` of them, add up to grad_mb MiB.
    floats = grad_mb * (1 << 20) / 4 / layers
    d = max(1, int(math.sqrt(floats)))
    torch.manual_seed(1234)  # the same initial weights on every rank
    return torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(layers)]), d


def annotated_step(zero_grad, forward, update):
    """One step; with the timeline on (PUSHPULL_TIMELINE) its FORWARD,
    BACKWARD and STEP spans go on the ``step`` lane next to the engine's
    (docs/timeline.md: backward overlaps the gradients' allreduces)."""
    from pushpull import timeline

    def step():
        zero_grad()
        with timeline.span('FORWARD'):
            loss = forward()
        with timeline.span('BACKWARD'):
            loss.backward()
        with timeline.span('STEP'):
            update()
    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--impl', required=True, choices=['ddp', 'hvd', 'trainer', 'local', *IMPLS])
    ap.add_argument('--grad-mb', type=float, default=64)
    ap.add_argument('--layers', type=int, default=8)
    ap.add_argument('--batch', type=int, default=4)
    ap.add_argument('--steps', type=int, default=15)
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--store-dir', default='')
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rank = int(os.environ.get('RANK', '0'))
    world = int(os.environ.get('WORLD_SIZE', '1'))

    model, d = build_model(a.grad_mb, a.layers)
    x = torch.randn(a.batch, d)
    finish = lambda: None  # noqa: E731
    if a.impl == 'ddp' or a.impl in IMPLS:
        step, finish = make_ddp_step('ddp-gloo' if a.impl == 'ddp' else a.impl, model, x, rank,
                                     world, a.store_dir)
    elif a.impl == 'hvd':
        import pushpull.torch as hvd
        hvd.init()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                       named_parameters=model.named_parameters())

        step = annotated_step(opt.zero_grad, lambda: model(x).sum(), opt.step)
        finish = hvd.shutdown
    elif a.impl == 'local':
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        step = annotated_step(opt.zero_grad, lambda: model(x).sum(), opt.step)
    else:
        import pushpull.kv
        import pushpull.torch
        kv = pushpull.kv.create('dist_sync')
        trainer = pushpull.torch.Trainer(model.named_parameters(), 'sgd', {'learning_rate': 1e-4},
                                         kvstore=kv)

        step = annotated_step(model.zero_grad, lambda: model(x).sum(),
                              lambda: trainer.step(a.batch))

    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        step()
        if i >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    finish()
    if rank == 0:
        print('result %s %.4f' % (a.impl, statistics.median(times)), flush=True)


if __name__ == '__main__':
    main()
