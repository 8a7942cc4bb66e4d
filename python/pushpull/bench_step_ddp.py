"""DDP's training step over torch.distributed backends, for `pushpull bench step`.

    pushpull launch -n 2 -s 0 -- python3 -m pushpull.bench_step_ddp --impl ddp-pushpull --grad-mb 64

The same synthetic step as `pushpull bench step` (a stack of ``--layers``
square linear layers holding ``--grad-mb`` MiB of float32 parameters, a
random batch of ``--batch`` rows, one torch thread, SGD), under
``torch.nn.parallel.DistributedDataParallel`` with the process group of
``--impl``:

- ``ddp-gloo``: torch's gloo backend (rendezvous through a file in
  ``--store-dir``);
- ``ddp-pushpull``: the ``pushpull`` backend (``import
  pushpull.torch.distributed``; env:// from the launcher's variables).

Rank 0 prints ``result <impl> <median step ms>`` over ``--steps`` timed steps
after ``--warmup`` untimed ones. `make_ddp_step` is the piece a step
benchmark can call for these two implementations.
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch

IMPLS = ('ddp-gloo', 'ddp-pushpull')


def build_model(grad_mb, layers):
    """`layers` square Linear layers whose d*d + d floats add up to grad_mb MiB."""
    floats = grad_mb * (1 << 20) / 4 / layers
    d = max(1, int(math.sqrt(floats)))
    torch.manual_seed(1234)  # the same initial weights on every rank
    return torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(layers)]), d


def make_ddp_step(impl, model, x, rank, world, store_dir=''):
    """Joins the group of `impl` and wraps `model` in DDP. Returns (step,
    finish): one training step, and leaving the group."""
    import torch.distributed as dist
    if impl == 'ddp-gloo':
        if not store_dir:
            sys.exit('bench_step_ddp: --impl ddp-gloo needs --store-dir')
        dist.init_process_group('gloo', init_method='file://' + os.path.join(store_dir, 'ddp'),
                                rank=rank, world_size=world)
    elif impl == 'ddp-pushpull':
        import pushpull.torch.distributed  # noqa: F401  (registers the backend)
        dist.init_process_group('pushpull', rank=rank, world_size=world)
    else:
        sys.exit(f'bench_step_ddp: unknown --impl {impl}; known: {", ".join(IMPLS)}')
    net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)

    def step():
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()

    return step, dist.destroy_process_group


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--impl', required=True, choices=IMPLS)
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
    step, finish = make_ddp_step(a.impl, model, x, rank, world, a.store_dir)
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
