"""Horovod's torch collective ops (``hvd.allreduce`` ...) over pushpull's engine.

Tensors cross into the C++ engine without a copy (DLPack, see python/src/arrays.cpp);
they must be CPU tensors, contiguous, of a supported dtype. Names work as in
Horovod: every rank must submit each name (in any order); an unnamed op gets
``<op>.noname.<n>`` from a per-process counter, so unnamed ops must be issued in
the same order on every rank.

Thread safety: every function may be called from any thread. A handle keeps the
tensors of its operation alive until it is done; the caller must not change an
input (or read an output) before ``synchronize(handle)``.
"""

import itertools
import threading

import torch

from pushpull._pushpull import InvalidArgument
from pushpull._pushpull import collective as _c

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

_SUPPORTED_DTYPES = {
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int32, torch.int64, torch.int8, torch.uint8,
}

_counters = {}
_counters_lock = threading.Lock()


def _auto_name(kind, name):
    if name is not None:
        return str(name)
    with _counters_lock:
        counter = _counters.setdefault(kind, itertools.count())
        return '%s.noname.%d' % (kind, next(counter))


def _resolve_op(average, op):
    if op is Adasum:
        raise InvalidArgument(
            'pushpull.torch: op=Adasum is not supported; use op=Average (or Sum)')
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
    if tensor.dtype not in _SUPPORTED_DTYPES:
        raise InvalidArgument(
            'pushpull.torch: %s has dtype %s, which is not supported; use float32, float16, '
            'bfloat16, float64, int32, int64, int8 or uint8' % (what, tensor.dtype))
    if not tensor.is_contiguous():
        raise InvalidArgument(
            'pushpull.torch: %s is not contiguous (shape %s, strides %s); call .contiguous() '
            'first' % (what, tuple(tensor.shape), tensor.stride()))


def _raw(tensor):
    # DLPack refuses tensors that require grad; the engine writes raw memory,
    # outside autograd, exactly as Horovod's C++ ops do.
    return tensor.detach()


class Handle:
    """An operation in flight. Pass it to ``synchronize`` or ``poll``."""

    __slots__ = ('_op', '_result', '_finish', '__weakref__')

    def __init__(self, op, result, finish=None):
        self._op = op
        self._result = result
        self._finish = finish

    @property
    def name(self):
        return self._op.name

    def __repr__(self):
        return '<pushpull.torch.Handle %r done=%s>' % (self._op.name, self._op.done())


def poll(handle):
    """True once the operation is done (``synchronize`` then returns at once)."""
    return handle._op.done()


def synchronize(handle, timeout=None):
    """Waits for the operation and returns its output tensor (raises its error)."""
    if handle._finish is not None:
        finish, handle._finish = handle._finish, None
        handle._result = finish(handle._op, timeout)
    else:
        handle._op.wait(timeout)
    return handle._result


# ---- allreduce -------------------------------------------------------------------


def _scaled(output, postscale_factor):
    def finish(op, timeout):
        op.wait(timeout)
        if postscale_factor != 1.0:
            output.mul_(postscale_factor)
        return output
    return finish


def _allreduce_impl(tensor, output, average, name, op, prescale_factor, postscale_factor):
    reduction = _resolve_op(average, op)
    _check(tensor, 'allreduce tensor')
    name = _auto_name('allreduce', name)
    source = tensor
    if prescale_factor != 1.0:
        if output is tensor:  # in place: scale the tensor itself
            tensor.mul_(prescale_factor)
        else:
            source = tensor * prescale_factor
    out_arg = None if output is source else _raw(output)
    h = _c.allreduce_async(name, _raw(source), out_arg, reduction)
    return Handle(h, output, _scaled(output, postscale_factor))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None):
    """Starts an out-of-place allreduce; ``synchronize(handle)`` returns the result."""
    _no_process_set(process_set)
    _check(tensor, 'allreduce tensor')
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_impl(tensor, output, average, name, op, prescale_factor, postscale_factor)


def _differentiable(tensor):
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


class _AllreduceFn(torch.autograd.Function):
    """allreduce in the autograd graph: the gradient is allreduced the same way
    (Horovod's HorovodAllreduce)."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.args = (name, op, prescale_factor, postscale_factor)
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        return synchronize(_allreduce_impl(tensor, out, None, name, op, prescale_factor,
                                           postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        name, op, pre, post = ctx.args
        if op not in (Sum, Average):
            raise InvalidArgument('pushpull.torch: allreduce with op=%s has no gradient' % op)
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        return (synchronize(_allreduce_impl(grad, out, None, name + '.grad', op, pre, post)),
                None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Returns the reduction (default: average) of ``tensor`` over all ranks.
    Differentiable when ``tensor`` requires grad (Sum and Average)."""
    if compression is None and _differentiable(tensor):
        _no_process_set(process_set)
        _check(tensor, 'allreduce tensor')
        return _AllreduceFn.apply(tensor, _auto_name('allreduce', name),
                                  _resolve_op(average, op), prescale_factor, postscale_factor)
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
    _no_process_set(process_set)
    return _allreduce_impl(tensor, tensor, average, name, op, prescale_factor, postscale_factor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce(tensors, average=None, name=None, op=None, process_set=None):
    """Allreduces a list of tensors (fused by the engine); returns the results."""
    base = _auto_name('grouped_allreduce', name)
    handles = [allreduce_async(t, average, '%s.%d' % (base, i), op, process_set=process_set)
               for i, t in enumerate(tensors)]
    return [synchronize(h) for h in handles]


# ---- allgather / broadcast / reducescatter ------------------------------------


def _from_numpy(array, dtype):
    if dtype == torch.bfloat16:
        # The bindings return bfloat16 as uint16 bits, which torch 1.13's
        # from_numpy refuses; int16 has the same size.
        return torch.from_numpy(array.view('int16')).view(torch.bfloat16)
    return torch.from_numpy(array)


def allgather_async(tensor, name=None, process_set=None):
    """Starts an allgather (concatenation along dim 0 in rank order)."""
    _no_process_set(process_set)
    _check(tensor, 'allgather tensor')
    dtype = tensor.dtype
    h = _c.allgather_async(_auto_name('allgather', name), _raw(tensor))

    def finish(op, timeout):
        return _from_numpy(op.output(timeout), dtype)
    return Handle(h, None, finish)


class _AllgatherFn(torch.autograd.Function):
    """Backward: the averaged gradient's rows of this rank (as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, name):
        ctx.name = name
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        return synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx, grad):
        grad = allreduce(grad.contiguous(), op=Average, name=ctx.name + '.grad')
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), name=ctx.name + '.rows')
        offset = int(rows[:_c.rank()].sum().item())
        return grad.narrow(0, offset, ctx.rows), None


def allgather(tensor, name=None, process_set=None):
    """Concatenation of every rank's tensor along dim 0 (first dims may differ).
    Differentiable when ``tensor`` requires grad."""
    if _differentiable(tensor) and tensor.dim() > 0:
        _no_process_set(process_set)
        _check(tensor, 'allgather tensor')
        return _AllgatherFn.apply(tensor, _auto_name('allgather', name))
    return synchronize(allgather_async(tensor, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Starts an in-place broadcast of root_rank's ``tensor``."""
    _no_process_set(process_set)
    _check(tensor, 'broadcast tensor')
    h = _c.broadcast_async(_auto_name('broadcast', name), _raw(tensor), int(root_rank))
    return Handle(h, tensor)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """Overwrites ``tensor`` with root_rank's; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Starts an out-of-place broadcast; ``synchronize`` returns root_rank's tensor."""
    _check(tensor, 'broadcast tensor')
    return broadcast_async_(tensor.clone(memory_format=torch.contiguous_format), root_rank,
                            name, process_set)


class _BroadcastFn(torch.autograd.Function):
    """Backward: the averaged gradient on the root, zeros elsewhere (as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root, ctx.name = root_rank, name
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad):
        grad = allreduce(grad.contiguous(), op=Average, name=ctx.name + '.grad')
        if _c.rank() != ctx.root:
            grad = torch.zeros_like(grad)
        return grad, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Returns a copy of root_rank's ``tensor`` (``tensor`` is unchanged).
    Differentiable when ``tensor`` requires grad."""
    if _differentiable(tensor):
        _no_process_set(process_set)
        _check(tensor, 'broadcast tensor')
        return _BroadcastFn.apply(tensor, int(root_rank), _auto_name('broadcast', name))
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def reducescatter(tensor, op=None, name=None, process_set=None):
    """Reduction of every rank's tensor, split along dim 0 (rank r gets part r)."""
    _no_process_set(process_set)
    reduction = _resolve_op(None, op)
    _check(tensor, 'reducescatter tensor')
    h = _c.reduce_scatter_async(_auto_name('reducescatter', name), _raw(tensor), reduction)
    dtype = tensor.dtype
    return synchronize(Handle(h, None, lambda op_, timeout: _from_numpy(op_.output(timeout),
                                                                        dtype)))


def barrier(process_set=None):
    """Blocks until every rank reached the barrier."""
    _no_process_set(process_set)
    _c.barrier()


def join(device=-1):
    """This rank is out of data. Until every rank joined, the others' ops proceed
    with it contributing nothing (Average divides by the ranks that contributed).
    Returns once every rank joined. Unlike Horovod it returns None, not the rank
    that joined last."""
    del device  # CPU only
    _c.join()


def _no_process_set(process_set):
    if process_set is not None:
        raise InvalidArgument(
            'pushpull.torch: process sets are not supported; every op runs over all ranks')
