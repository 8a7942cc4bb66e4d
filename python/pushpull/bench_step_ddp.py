"""DDP's training step over torch.distributed backends, for `pushpull bench step`
(python/pushpull/bench_step.py runs it):

    pushpull launch -n 2 -s 0 -- python3 -m pushpull.bench_step --impl ddp-pushpull --grad-mb 64

The synthetic step of bench_step.py under
``torch.nn.parallel.DistributedDataParallel`` with the process group of
``--impl``:

- ``ddp-gloo``: torch's gloo backend (rendezvous through a file in
  ``--store-dir``);
- ``ddp-pushpull``: the ``pushpull`` backend (``import
  pushpull.torch.distributed``; env:// from the launcher's variables).

`make_ddp_step` builds the step for either.
"""

import os
import sys

import torch

IMPLS = ('ddp-gloo', 'ddp-pushpull')


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

