"""Horovod's torch collective ops (``hvd.allreduce`` ...) over pushpull's engine.

Tensors cross into the C++ engine without a copy (DLPack, see python/src/arrays.cpp);
they must be CPU tensors, contiguous, of a supported dtype. Names work as in
Horovod: every rank must submit each name (in any order); an unnamed op gets
``<op>.noname.<n>`` from a per-process counter, so unnamed ops must be issued in
the same order on every rank.

Process sets (process_sets.py) scope names: an op of set k is named
``ps<k>.<name>`` in the engine. allgather and broadcast are in gather.py,
reducescatter in reducescatter.py, alltoall in alltoall.py, the grouped forms
in grouped.py, handles and their names in handles.py.

Thread safety: every function may be called from any thread. A handle keeps the
tensors of its operation alive until it is done; the caller must not change an
input (or read an output) before ``synchronize(handle)``.
"""


import torch

from pushpull._pushpull import InvalidArgument
from pushpull._pushpull import collective as _c

from .handles import (DROP_HOLD, Handle, _auto_name, _counters, _counters_lock,  # noqa: F401
                      _dropped, _dropped_lock, _Group, poll, synchronize)

# Reduction ops, as hvd.Average / hvd.Sum / ... (Horovod's names).
Average = _c.Reduction.AVERAGE
Sum = _c.Reduction.SUM
Min = _c.Reduction.MIN
Max = _c.Reduction.MAX
Product = _c.Reduction.PRODUCT


class _Unsupported:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return 'pushpull.torch.' + self.name


# Horovod's Adasum has no implementation here; passing it is an InvalidArgument.
Adasum = _Unsupported('Adasum')

# The engine's dtypes (include/pushpull/dtype.h).
_NATIVE = {
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int32, torch.int64, torch.int8, torch.uint8,
}
# The others Horovod accepts on CPU: reduced in int32 (copies), moved as the
# bits of a native dtype of the same size (no copy).
_WIDENED = {torch.int16, torch.bool}
_BITS = {torch.int16: torch.float16, torch.bool: torch.uint8}

def _resolve_op(average, op):
    if op is Adasum:
        raise InvalidArgument(
            'pushpull.torch: op=Adasum is not supported (Horovod implements it for MPI and '
            'NCCL builds only); use op=Average (or Sum)')
    if average is not None:
        if op is not None:
            raise InvalidArgument(
                'pushpull.torch: pass either average= (deprecated) or op=, not both')
        return Average if average else Sum
    if op is None:
        return Average
    if not isinstance(op, _c.Reduction):
        raise InvalidArgument(
            'pushpull.torch: op must be one of Average, Sum, Min, Max, Product; got %r' % (op,))
    return op


def _check(tensor, what):
    """Horovod-style errors before anything reaches the engine."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgument(
            'pushpull.torch: %s must be a torch.Tensor, got %s' % (what, type(tensor).__name__))
    if tensor.device.type != 'cpu':
        raise InvalidArgument(
            'pushpull.torch: %s is on %s; %s tensors are not supported yet; call .cpu()'
            % (what, tensor.device, tensor.device.type.upper()))
    if tensor.is_sparse:
        raise InvalidArgument(
            'pushpull.torch: %s is sparse; use sparse_allreduce_async or .to_dense()' % what)
    if tensor.dtype not in _NATIVE and tensor.dtype not in _WIDENED:
        raise InvalidArgument(
            'pushpull.torch: %s has dtype %s, which is not supported; use uint8, int8, int16, '
            'int32, int64, float16, bfloat16, float32, float64 or bool' % (what, tensor.dtype))
    if not tensor.is_contiguous():
        raise InvalidArgument(
            'pushpull.torch: %s is not contiguous (shape %s, strides %s); call .contiguous() '
            'first' % (what, tuple(tensor.shape), tensor.stride()))


def _raw(tensor):
    # DLPack refuses tensors that require grad; the engine writes raw memory,
    # outside autograd, exactly as Horovod's C++ ops do. int16 and bool travel
    # as the bits of a same-sized native dtype (data movement only).
    t = tensor.detach()
    bits = _BITS.get(t.dtype)
    return t if bits is None else t.view(bits)


def _scale_(tensor, factor, divisor=1):
    """tensor *= factor / divisor in place; integers are scaled in float64 and
    cast back (truncating), 16-bit floats in float32, as Horovod does. The
    divisor (an Average's set size) divides; an integer is divided truncating
    toward zero, as Horovod's C++ casts sum * (1 / n) back and its 0.28 suite
    checks (div(..., rounding_mode='trunc'): -75 / 2 is -37), but exactly
    (9 / 3 is 3, where 9 * (1 / 3) may truncate to 2)."""
    if factor == 1.0 and divisor == 1:
        return tensor
    if tensor.dtype == torch.bool:
        raise InvalidArgument('pushpull.torch: prescale/postscale of a bool tensor')
    if tensor.dtype in (torch.float32, torch.float64):
        if factor != 1.0:
            tensor.mul_(factor)
        return tensor.div_(divisor) if divisor != 1 else tensor
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.copy_(tensor.to(torch.float32) * factor / divisor)
    if factor != 1.0:
        tensor.copy_(tensor.to(torch.float64) * factor)
    if divisor != 1:
        tensor.copy_(torch.div(tensor, divisor, rounding_mode='trunc'))
    return tensor


def _scope(process_set, what):
    """(members, name prefix, set size) of the op's process set."""
    from .process_sets import _resolve
    return _resolve(process_set, what)


# ---- allreduce -------------------------------------------------------------------


def _reduce_plan(reduction, dtype, set_size, what, scales=(1.0, 1.0)):
    """(engine reduction, divisor of the result) for a reduction over a set:
    Average is a sum divided by the set's size (as Horovod: a joined rank
    counts as zeros); bool reduces as int32 0/1 (sum, max: or; min, product:
    and)."""
    if dtype == torch.bool and tuple(scales) != (1.0, 1.0):
        raise InvalidArgument('pushpull.torch: %s: prescale/postscale of a bool tensor' % what)
    if reduction == Average:
        if dtype == torch.bool:
            raise InvalidArgument('pushpull.torch: %s: op=Average of a bool tensor' % what)
        return Sum, set_size
    if dtype == torch.bool:
        return (Max if reduction in (Sum, Max) else Min), 1
    return reduction, 1


def _allreduce_impl(tensor, output, average, name, op, prescale_factor, postscale_factor,
                    process_set=None):
    reduction = _resolve_op(average, op)
    _check(tensor, 'allreduce tensor')
    members, prefix, n = _scope(process_set, 'allreduce')
    name = _auto_name('allreduce', name, prefix)
    reduction, divisor = _reduce_plan(reduction, tensor.dtype, n, 'allreduce',
                                      (prescale_factor, postscale_factor))
    if tensor.dtype in _WIDENED:
        work = tensor.detach().to(torch.int32)
        _scale_(work, prescale_factor)
        h = _c.allreduce_async(name, work, None, reduction, members)

        def finish(op_, timeout):
            op_.wait(timeout)
            _scale_(work, postscale_factor, divisor)
            output.detach().copy_(work)
            return output
        return Handle(h, output, finish)
    source = tensor
    if prescale_factor != 1.0:
        if output is tensor:  # in place: scale the tensor itself
            _scale_(tensor.detach(), prescale_factor)
        else:
            source = _scale_(tensor.detach().clone(), prescale_factor)
    out_arg = None if output is source else _raw(output)
    if output.dtype in (torch.float32, torch.float64):
        # The engine multiplies each block while it is in cache (an
        # average's 1/n too): no pass of its own over the result.
        h = _c.allreduce_async(name, _raw(source), out_arg, reduction, members,
                               postscale_factor / divisor)
        return Handle(h, output, lambda op_, timeout: (op_.wait(timeout), output)[1])
    h = _c.allreduce_async(name, _raw(source), out_arg, reduction, members)

    def finish(op_, timeout):
        op_.wait(timeout)
        _scale_(output.detach(), postscale_factor, divisor)
        return output
    return Handle(h, output, finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Starts an out-of-place allreduce; ``synchronize(handle)`` returns the result."""
    _check(tensor, 'allreduce tensor')
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_impl(tensor, output, average, name, op, prescale_factor, postscale_factor,
                           process_set)


def _differentiable(tensor):
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


class _AllreduceFn(torch.autograd.Function):
    """allreduce in the autograd graph: the gradient is allreduced the same way
    (Horovod's HorovodAllreduce)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (name, op, prescale_factor, postscale_factor, process_set)
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        return synchronize(_allreduce_impl(tensor, out, None, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad):
        name, op, pre, post, process_set = ctx.args
        if op not in (Sum, Average):
            raise InvalidArgument('pushpull.torch: allreduce with op=%s has no gradient' % op)
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        return (synchronize(_allreduce_impl(grad, out, None, name + '.grad', op, pre, post,
                                            process_set)),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Returns the reduction (default: average) of ``tensor`` over the ranks of
    ``process_set`` (default: all). Differentiable when ``tensor`` requires
    grad (Sum and Average)."""
    if compression is None and _differentiable(tensor):
        _check(tensor, 'allreduce tensor')
        _, prefix, _ = _scope(process_set, 'allreduce')
        return _AllreduceFn.apply(tensor, _auto_name('allreduce', name, prefix)[len(prefix):],
                                  _resolve_op(average, op), prescale_factor, postscale_factor,
                                  process_set)
    if compression is not None:
        compressed, ctx = compression.compress(tensor)
        out = synchronize(allreduce_async(compressed, average, name, op, prescale_factor,
                                          postscale_factor, process_set))
        return compression.decompress(out, ctx)
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                       postscale_factor, process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None):
    """Starts an in-place allreduce of ``tensor``."""
    return _allreduce_impl(tensor, tensor, average, name, op, prescale_factor, postscale_factor,
                           process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def barrier(process_set=None):
    """Blocks until every rank of the set (default: all) reached the barrier."""
    members, prefix, _ = _scope(process_set, 'barrier')
    if not members:
        _c.barrier()
        return
    synchronize(allreduce_async_(torch.zeros(1), name=_auto_name('barrier', None, prefix)[
        len(prefix):], op=Sum, process_set=process_set))


def join(device=-1):
    """This rank is out of data. Until every rank joined, the others' ops
    proceed with it contributing zeros (Average still divides by the set's
    size, as in Horovod) and no rows to allgathers. Returns, once every rank
    joined, the rank that joined last."""
    del device  # CPU only
    return _c.join()


# allgather / broadcast live in gather.py (kept out of this file's size); they
# stay reachable as ops.allgather, ops.broadcast_, ... for the other modules.
from .gather import (_from_numpy, allgather, allgather_async, broadcast,  # noqa: E402,F401
                     broadcast_, broadcast_async, broadcast_async_)
