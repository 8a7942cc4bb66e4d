"""broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object."""

import collections.abc
import io
import pickle

import torch

from pushpull._pushpull import InvalidArgument
from . import ops


def _named_tensors(params):
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, collections.abc.Iterable):
        items = []
        for i, p in enumerate(params):
            if isinstance(p, tuple) and len(p) == 2:
                items.append(p)
            else:
                items.append(('noname.%d' % i, p))
    else:
        raise InvalidArgument(
            'broadcast_parameters: params must be a state_dict (dict), named_parameters() or a '
            'list of tensors; got %s' % type(params).__name__)
    for name, p in items:
        if p is not None and not isinstance(p, torch.Tensor):
            raise InvalidArgument(
                'broadcast_parameters: %r is a %s, not a tensor' % (name, type(p).__name__))
    return items


def broadcast_parameters(params, root_rank, process_set=None):
    """Overwrites every tensor of ``params`` (model.state_dict() or
    model.named_parameters()) with root_rank's, in place. Every rank (of
    ``process_set``) must pass the same names and shapes."""
    handles = [ops.broadcast_async_(p, root_rank, name='broadcast_parameters.%s' % name,
                                    process_set=process_set)
               for name, p in _named_tensors(params) if p is not None]
    for h in handles:
        ops.synchronize(h)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns root_rank's ``obj`` (pickled) on every rank (of ``process_set``)."""
    _, prefix, _ = ops._scope(process_set, 'broadcast_object')  # errors before anything is sent
    name = ops._auto_name('broadcast_object', name, prefix)[len(prefix):]
    if ops._c.rank() == root_rank:
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        size = torch.tensor([len(payload)], dtype=torch.int64)
    else:
        payload = None
        size = torch.zeros(1, dtype=torch.int64)
    ops.broadcast_(size, root_rank, name=name + '.size', process_set=process_set)
    if payload is not None:
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else \
            torch.zeros(0, dtype=torch.uint8)
    else:
        buf = torch.zeros(int(size.item()), dtype=torch.uint8)
    ops.broadcast_(buf, root_rank, name=name + '.data', process_set=process_set)
    if payload is not None:
        return obj
    return pickle.loads(buf.numpy().tobytes())


def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's (of ``process_set``) ``obj``, in rank order."""
    _, prefix, _ = ops._scope(process_set, 'allgather_object')
    name = ops._auto_name('allgather_object', name, prefix)[len(prefix):]
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sizes = ops.allgather(torch.tensor([len(payload)], dtype=torch.int64), name=name + '.size',
                          process_set=process_set)
    data = ops.allgather(torch.frombuffer(bytearray(payload), dtype=torch.uint8),
                         name=name + '.data', process_set=process_set).numpy().tobytes()
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[offset:offset + n]))
        offset += n
    return out


def broadcast_optimizer_state(optimizer, root_rank, process_set=None):
    """Makes every rank's optimizer state (hyperparameters and per-parameter
    buffers such as momentum) root_rank's. Unlike Horovod, ranks whose state is
    still empty need no dummy step: root's state_dict is sent whole (one pickled
    object) and loaded with ``load_state_dict``. Parameters must be in the same
    order on every rank (the same model). As Horovod, an optimizer with no
    state yet leaves with a zero gradient on each parameter that requires grad
    and had none (sparse for SparseAdam): code written for Horovod reads it."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgument(
            'broadcast_optimizer_state: expected a torch.optim.Optimizer, got %s'
            % type(optimizer).__name__)
    if not optimizer.state:
        for group in optimizer.param_groups:
            for p in group['params']:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
    _, prefix, _ = ops._scope(process_set, 'broadcast_optimizer_state')
    state = optimizer.state_dict() if ops._c.rank() == root_rank else None
    buffer = io.BytesIO()
    if state is not None:
        torch.save(state, buffer)
    blob = broadcast_object(buffer.getvalue() if state is not None else None, root_rank,
                            name=ops._auto_name('broadcast_optimizer_state', None,
                                                prefix)[len(prefix):],
                            process_set=process_set)
    if ops._c.rank() != root_rank:
        optimizer.load_state_dict(torch.load(io.BytesIO(blob)))
