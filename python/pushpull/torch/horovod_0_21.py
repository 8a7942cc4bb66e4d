"""pushpull.torch with the behaviour of Horovod 0.21, for scripts written for it.

    import pushpull.torch.horovod_0_21 as hvd    # was: import horovod.torch as hvd (<= 0.21)

Everything is pushpull.torch's (docs/python.md), the same functions over the
same engine and session (the two modules can be mixed in one program), except
the three behaviours Horovod changed after 0.21, which a script (and Horovod's
own test file of that time) may rely on:

- the gradients of ``allgather`` and ``broadcast`` are summed over the ranks
  (Horovod 0.22 made them averages, horovod/horovod PR 2687);
- ``alltoall(tensor, splits)`` returns the output tensor alone (Horovod 0.24
  added the received splits: ``(output, received_splits)``), and so does
  ``synchronize`` of ``alltoall_async``;
- ``DistributedOptimizer`` gives each parameter that requires grad and has no
  gradient a zero gradient when it wraps the optimizer (Horovod 0.21 did so
  when it registered its hooks; later versions leave ``None`` until a backward
  pass reaches the parameter), so ``p.grad`` is a tensor from the start.

Thread safety and ownership are those of pushpull.torch.
"""

import torch

import pushpull.torch as _base

from . import ops as _ops

# Every public name of pushpull.torch, the lazy ones (Trainer, elastic) through
# __getattr__ below so that importing this module stays as light as the other.
globals().update({n: getattr(_base, n) for n in _base.__all__
                  if n not in ('Trainer', 'elastic')})


def __getattr__(name):
    return getattr(_base, name)


def allgather(tensor, name=None, process_set=None):
    """pushpull.torch.allgather; its gradient is the sum over the ranks."""
    return _ops.allgather(tensor, name, process_set, _grad_op=_ops.Sum)


def broadcast(tensor, root_rank, name=None, process_set=None):
    """pushpull.torch.broadcast; the root's gradient is the sum over the ranks."""
    return _ops.broadcast(tensor, root_rank, name, process_set, _grad_op=_ops.Sum)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """pushpull.torch.alltoall returning the output tensor alone."""
    out = _base.alltoall(tensor, splits, name, process_set)
    return out[0] if isinstance(out, tuple) else out


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """pushpull.torch.alltoall_async; ``synchronize`` returns the output alone."""
    handle = _base.alltoall_async(tensor, splits, name, process_set)
    finish = handle._finish
    handle._finish = lambda op, timeout: finish(op, timeout)[0]
    return handle


def DistributedOptimizer(optimizer, *args, **kwargs):
    """pushpull.torch.DistributedOptimizer, after giving each parameter that
    requires grad and has none a zero gradient (as Horovod 0.21)."""
    for group in optimizer.param_groups:
        for p in group['params']:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
    return _base.DistributedOptimizer(optimizer, *args, **kwargs)


__all__ = list(_base.__all__)
