"""Horovod's allgather and broadcast (``hvd.allgather``, ``hvd.broadcast_`` ...)
over pushpull's engine, with their autograd functions; split from ops.py, whose
helpers (names, process-set scope, handles) they share, and re-exported there.

Thread safety: as ops.py (every function may be called from any thread).
"""

import torch

from pushpull._pushpull import collective as _c

from .ops import (Average, Handle, _auto_name, _check, _differentiable, _raw, _scope, allreduce,
                  synchronize)


def _from_numpy(array, dtype):
    """A result array of the engine as a tensor of `dtype` (no copy)."""
    if dtype == torch.bfloat16:
        # The bindings return bfloat16 as uint16 bits, which torch 1.13's
        # from_numpy refuses; int16 has the same size.
        return torch.from_numpy(array.view('int16')).view(torch.bfloat16)
    t = torch.from_numpy(array)
    return t if t.dtype == dtype else t.view(dtype)  # int16, bool: their bits


def allgather_async(tensor, name=None, process_set=None):
    """Starts an allgather (concatenation along dim 0 in rank order)."""
    _check(tensor, 'allgather tensor')
    members, prefix, _ = _scope(process_set, 'allgather')
    dtype = tensor.dtype
    h = _c.allgather_async(_auto_name('allgather', name, prefix), _raw(tensor), members)

    def finish(op, timeout):
        return _from_numpy(op.output(timeout), dtype)
    return Handle(h, None, finish)


def _set_rank(process_set):
    return _c.rank() if process_set is None else process_set.rank()


class _AllgatherFn(torch.autograd.Function):
    """Backward: the averaged gradient's rows of this rank (as Horovod since
    0.22; ``grad_op=Sum``: summed, as Horovod 0.21, see horovod_0_21.py)."""

    @staticmethod
    def forward(ctx, tensor, name, process_set, grad_op=Average):
        ctx.name, ctx.process_set, ctx.grad_op = name, process_set, grad_op
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        grad = allreduce(grad.contiguous(), op=ctx.grad_op, name=ctx.name + '.grad',
                         process_set=ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), name=ctx.name + '.rows',
                         process_set=ctx.process_set)
        offset = int(rows[:_set_rank(ctx.process_set)].sum().item())
        return grad.narrow(0, offset, ctx.rows), None, None, None


def allgather(tensor, name=None, process_set=None, _grad_op=Average):
    """Concatenation of every rank's tensor along dim 0 (first dims may differ).
    Differentiable when ``tensor`` requires grad."""
    if _differentiable(tensor) and tensor.dim() > 0:
        _check(tensor, 'allgather tensor')
        _, prefix, _ = _scope(process_set, 'allgather')
        return _AllgatherFn.apply(tensor, _auto_name('allgather', name, prefix)[len(prefix):],
                                  process_set, _grad_op)
    return synchronize(allgather_async(tensor, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Starts an in-place broadcast of root_rank's ``tensor`` (root_rank is a
    rank of the job, and a member of ``process_set``)."""
    _check(tensor, 'broadcast tensor')
    members, prefix, _ = _scope(process_set, 'broadcast')
    h = _c.broadcast_async(_auto_name('broadcast', name, prefix), _raw(tensor), int(root_rank),
                           members)
    return Handle(h, tensor)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """Overwrites ``tensor`` with root_rank's; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Starts an out-of-place broadcast; ``synchronize`` returns root_rank's tensor."""
    _check(tensor, 'broadcast tensor')
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            root_rank, name, process_set)


class _BroadcastFn(torch.autograd.Function):
    """Backward: the averaged gradient on the root, zeros elsewhere (as Horovod
    since 0.22; ``grad_op=Sum``: summed, as Horovod 0.21)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set, grad_op=Average):
        ctx.root, ctx.name, ctx.process_set = root_rank, name, process_set
        ctx.grad_op = grad_op
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        grad = allreduce(grad.contiguous(), op=ctx.grad_op, name=ctx.name + '.grad',
                         process_set=ctx.process_set)
        if _c.rank() != ctx.root:
            grad = torch.zeros_like(grad)
        return grad, None, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None, _grad_op=Average):
    """Returns a copy of root_rank's ``tensor`` (``tensor`` is unchanged).
    Differentiable when ``tensor`` requires grad."""
    if _differentiable(tensor):
        _check(tensor, 'broadcast tensor')
        _, prefix, _ = _scope(process_set, 'broadcast')
        return _BroadcastFn.apply(tensor, int(root_rank),
                                  _auto_name('broadcast', name, prefix)[len(prefix):],
                                  process_set, _grad_op)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))
