"""Horovod's grouped ops: several tensors in one call and one handle.

Each tensor is its own engine op (named ``<group name>.<i>``), submitted
together, so the engine fuses the allreduces that are ready at once; the
handle completes when all of them have. Unlike Horovod's, a group is not
atomic across ranks: its ops may complete at different times (no
``HOROVOD_DISABLE_GROUP_FUSION`` needed).
"""

from pushpull._pushpull import InvalidArgument

from . import ops
from .reducescatter import reducescatter, reducescatter_async


def _group_handle(kind, handles):
    def finish(group, timeout):
        return [ops.synchronize(h, timeout) for h in handles]
    return ops.Handle(ops._Group(kind, [h._op for h in handles]), None, finish)


def _names(kind, tensors, name, process_set):
    if not isinstance(tensors, (list, tuple)):
        raise InvalidArgument('pushpull.torch: %s takes a list of tensors, got %s'
                              % (kind, type(tensors).__name__))
    _, prefix, _ = ops._scope(process_set, kind)
    base = ops._auto_name(kind, name, prefix)[len(prefix):]
    return ['%s.%d' % (base, i) for i in range(len(tensors))]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    """Starts an out-of-place allreduce of each tensor; synchronize returns the list."""
    names = _names('grouped_allreduce', tensors, name, process_set)
    return _group_handle('grouped_allreduce', [
        ops.allreduce_async(t, average, n, op, prescale_factor, postscale_factor, process_set)
        for t, n in zip(tensors, names)])


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """The allreduce of each tensor (a list). Differentiable per tensor."""
    if compression is not None or any(ops._differentiable(t) for t in tensors):
        names = _names('grouped_allreduce', tensors, name, process_set)
        return [ops.allreduce(t, average, n, compression, op, prescale_factor, postscale_factor,
                              process_set) for t, n in zip(tensors, names)]
    return ops.synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                                   postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    """Starts an in-place allreduce of each tensor."""
    names = _names('grouped_allreduce', tensors, name, process_set)
    return _group_handle('grouped_allreduce', [
        ops.allreduce_async_(t, average, n, op, prescale_factor, postscale_factor, process_set)
        for t, n in zip(tensors, names)])


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    """In-place allreduce of each tensor; returns the tensors."""
    return ops.synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                    postscale_factor, process_set))


def grouped_allgather_async(tensors, name=None, process_set=None):
    names = _names('grouped_allgather', tensors, name, process_set)
    return _group_handle('grouped_allgather', [
        ops.allgather_async(t, n, process_set) for t, n in zip(tensors, names)])


def grouped_allgather(tensors, name=None, process_set=None):
    """The allgather of each tensor (a list)."""
    if any(ops._differentiable(t) for t in tensors):
        names = _names('grouped_allgather', tensors, name, process_set)
        return [ops.allgather(t, n, process_set) for t, n in zip(tensors, names)]
    return ops.synchronize(grouped_allgather_async(tensors, name, process_set))


def grouped_reducescatter_async(tensors, name=None, op=None, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0):
    names = _names('grouped_reducescatter', tensors, name, process_set)
    return _group_handle('grouped_reducescatter', [
        reducescatter_async(t, n, op, process_set, prescale_factor, postscale_factor)
        for t, n in zip(tensors, names)])


def grouped_reducescatter(tensors, name=None, compression=None, op=None, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0):
    """The reducescatter of each tensor (a list)."""
    if compression is not None or any(ops._differentiable(t) for t in tensors):
        names = _names('grouped_reducescatter', tensors, name, process_set)
        return [reducescatter(t, n, compression, op, process_set, prescale_factor,
                                  postscale_factor) for t, n in zip(tensors, names)]
    return ops.synchronize(grouped_reducescatter_async(tensors, name, op, process_set,
                                                       prescale_factor, postscale_factor))
