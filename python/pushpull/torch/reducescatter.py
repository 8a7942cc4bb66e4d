"""Horovod's reducescatter: the reduction (default Average) of every member's
tensor, split along dim 0; member i of the set gets part i (the first
``rows % size`` members one row more). int16 and bool reduce in an int32 copy;
Average is a sum divided by the set's size, as in ops.allreduce."""

import torch

from pushpull._pushpull import InvalidArgument
from pushpull._pushpull import collective as _c

from . import ops


def reducescatter_async(tensor, name=None, op=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts a reducescatter: the reduction (default Average) of every member's
    tensor, split along dim 0; member i of the set gets part i (the first
    ``rows % size`` members one row more)."""
    if isinstance(name, _c.Reduction):
        raise InvalidArgument(
            'pushpull.torch: reducescatter(tensor, name=None, ..., op=...): pass op by keyword '
            '(Horovod\'s order has name second)')
    reduction = ops._resolve_op(None, op)
    ops._check(tensor, 'reducescatter tensor')
    if tensor.dim() == 0:
        raise InvalidArgument('pushpull.torch: reducescatter of a scalar (0-d tensor)')
    members, prefix, n = ops._scope(process_set, 'reducescatter')
    name = ops._auto_name('reducescatter', name, prefix)
    dtype = tensor.dtype
    reduction, divisor = ops._reduce_plan(reduction, dtype, n, 'reducescatter',
                                      (prescale_factor, postscale_factor))
    if dtype in ops._WIDENED:
        source = tensor.detach().to(torch.int32)
        ops._scale_(source, prescale_factor)
    elif prescale_factor != 1.0:
        source = ops._scale_(tensor.detach().clone(), prescale_factor)
    else:
        source = ops._raw(tensor)
    h = _c.reduce_scatter_async(name, source, reduction, members)

    def finish(op_, timeout):
        out = ops._from_numpy(op_.output(timeout), source.dtype)
        if dtype in ops._WIDENED:
            return ops._scale_(out, postscale_factor, divisor).to(dtype)
        return ops._scale_(out, postscale_factor, divisor)
    return ops.Handle(h, None, finish)


class _ReducescatterFn(torch.autograd.Function):
    """Backward, as Horovod's: the gradients of every member gathered, times the
    set's size for Sum (times 1 for Average), times the pre- and postscale
    factors. (Like its allreduce's, Horovod's gradient counts every rank's
    loss: a Sum's output rows feed the loss of each of the n ranks.)"""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, pre, post):
        ctx.args = (name, op, process_set, pre, post)
        return ops.synchronize(reducescatter_async(tensor, name, op, process_set, pre, post))

    @staticmethod
    def backward(ctx, grad):
        name, op, process_set, pre, post = ctx.args
        if op not in (ops.Sum, ops.Average):
            raise InvalidArgument('pushpull.torch: reducescatter with op=%s has no gradient' % op)
        n = process_set.size() if process_set is not None else _c.size()
        factor = pre * post * (n if op == ops.Sum else 1)
        full = ops.allgather(grad.contiguous(), name=name + '.grad', process_set=process_set)
        return full * factor, None, None, None, None, None


def reducescatter(tensor, name=None, compression=None, op=None, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduction (default Average) of every rank's tensor, split along dim 0
    (rank i of the set gets part i). Differentiable (Sum and Average)."""
    if compression is not None:
        compressed, ctx = compression.compress(tensor)
        out = reducescatter(compressed, name, None, op, process_set, prescale_factor,
                            postscale_factor)
        return compression.decompress(out, ctx)
    if ops._differentiable(tensor):
        ops._check(tensor, 'reducescatter tensor')
        _, prefix, _ = ops._scope(process_set, 'reducescatter')
        return _ReducescatterFn.apply(
            tensor, ops._auto_name('reducescatter', name, prefix)[len(prefix):],
            ops._resolve_op(None, op), process_set, prescale_factor, postscale_factor)
    return ops.synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                           postscale_factor))
