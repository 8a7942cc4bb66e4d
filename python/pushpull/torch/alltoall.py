"""Horovod's alltoall: rank i sends rows ``splits[j]`` of its tensor to rank j.

Built on two allgathers of the set (every rank's splits, then every rank's
tensor), from which each rank keeps the rows sent to it. Simple and correct,
but each rank receives every member's whole tensor: the traffic is that of an
allgather, not of a true alltoall (fine for the modest sizes alltoall usually
moves, e.g. embedding lookups; a point-to-point exchange in the engine would
cut it by the set's size).
"""

import torch

from pushpull._pushpull import InvalidArgument
from pushpull._pushpull import collective as _c

from . import ops


def _splits_of(tensor, splits, n):
    rows = tensor.shape[0]
    if splits is None:
        if rows % n:
            raise InvalidArgument(
                'alltoall: the first dimension (%d) must be divisible by the number of ranks '
                '(%d) when splits is not given' % (rows, n))
        return [rows // n] * n
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.dtype.is_floating_point or splits.dtype == torch.bool:
            raise InvalidArgument('alltoall: splits must be a 1-D integer tensor or a list')
        splits = splits.tolist()
    splits = [int(x) for x in splits]
    if len(splits) != n:
        raise InvalidArgument('alltoall: splits has %d entries; it needs one per rank of the '
                              'set (%d)' % (len(splits), n))
    if any(x < 0 for x in splits):
        raise InvalidArgument('alltoall: splits %s has a negative entry' % splits)
    if sum(splits) != rows:
        raise InvalidArgument('alltoall: splits %s sum to %d, but the first dimension is %d'
                              % (splits, sum(splits), rows))
    return splits


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Starts an alltoall; ``synchronize`` returns (output, received_splits)."""
    ops._check(tensor, 'alltoall tensor')
    if tensor.dim() == 0:
        raise InvalidArgument('alltoall: the tensor must have at least one dimension')
    _, prefix, n = ops._scope(process_set, 'alltoall')
    me = _c.rank() if process_set is None else process_set.rank()
    mine = torch.tensor(_splits_of(tensor, splits, n), dtype=torch.int64).view(1, n)
    base = ops._auto_name('alltoall', name, prefix)[len(prefix):]
    h_splits = ops.allgather_async(mine, base + '.splits', process_set)
    h_data = ops.allgather_async(tensor, base + '.data', process_set)

    def finish(group, timeout):
        every = ops.synchronize(h_splits, timeout)  # (n, n): row i = member i's splits
        data = ops.synchronize(h_data, timeout)
        parts, offset = [], 0
        for i in range(n):
            start = offset + int(every[i, :me].sum())
            parts.append(data.narrow(0, start, int(every[i, me])))
            offset += int(every[i].sum())
        out = torch.cat(parts) if parts else data.narrow(0, 0, 0)
        return out, every[:, me].to(torch.int32).contiguous()
    return ops.Handle(ops._Group(base, [h_splits._op, h_data._op]), None, finish)


class _AlltoallFn(torch.autograd.Function):
    """Backward: the gradient goes back along the reverse alltoall."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.name, ctx.process_set = name, process_set
        out, received = ops.synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, unused):
        back, _ = ops.synchronize(alltoall_async(grad.contiguous(), ctx.received,
                                                 ctx.name + '.grad', ctx.process_set))
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Scatters ``tensor``'s rows to the ranks of the set (``splits[j]`` rows
    to member j; equal parts when None) and gathers what they sent to this
    rank. As Horovod: returns the output tensor when ``splits`` is None, and
    (output, received_splits) when splits are given. Differentiable."""
    if ops._differentiable(tensor):
        ops._check(tensor, 'alltoall tensor')
        _, prefix, _ = ops._scope(process_set, 'alltoall')
        out = _AlltoallFn.apply(tensor, splits,
                                ops._auto_name('alltoall', name, prefix)[len(prefix):],
                                process_set)
    else:
        out = ops.synchronize(alltoall_async(tensor, splits, name, process_set))
    return out[0] if splits is None else out
