"""pushpull.torch.elastic: Horovod's elastic API (``horovod.torch.elastic``).

    import pushpull.torch as hvd          # was: import horovod.torch as hvd
    hvd.init()
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

Run under ``pushpull launch --min-workers A --max-workers B [--host-discovery-script F]
python3 train.py`` (docs/elastic.md). The loop of ``run`` (Horovod's):

- sync the state from rank 0, call the function;
- a member failed (``HorovodInternalError``: pushpull's ``PeerFailure``): restore the last
  commit; the host set changed (``HostsUpdatedInterrupt``, raised by ``commit()`` /
  ``check_host_updates()`` on every rank at the same commit): keep the state;
- re-form the group (``shutdown()`` + ``init()``: the launcher places this worker in the next
  round, with new ranks and size), call the reset callbacks, go round again.

Outside an elastic job (a plain ``pushpull launch -n N`` or a script run alone) the same code
runs: a failure is then not recoverable and ends the job, as without elastic.
"""

import copy
import functools
import io
import math
import random

import torch

from pushpull._pushpull import PeerFailure
from pushpull._pushpull import elastic as _e
from pushpull._pushpull import collective as _c
from . import ops
from .functions import broadcast_parameters

# Horovod's exception names. A collective of a group that lost a member raises pushpull's
# PeerFailure; HorovodInternalError is that class, so `except HorovodInternalError` works.
HorovodInternalError = PeerFailure


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed: every rank raises it at the same commit and the group
    re-forms. ``skip_sync``: the state is the same everywhere already (no sync needed)."""

    def __init__(self, skip_sync=False):
        super().__init__('elastic: the set of hosts changed; re-forming the group')
        self.skip_sync = skip_sync


def _broadcast_object(obj, name):
    """rank 0's ``obj`` on every rank, under a fixed name (ranks that just joined count their
    automatic names from zero, so elastic syncs never use automatic names)."""
    from .functions import broadcast_object
    return broadcast_object(obj, 0, name=name)


class State(_e.State):
    """Horovod's State: what a worker carries across a re-formation.

    Subclasses implement ``save`` (live -> saved copy), ``restore`` (saved -> live) and
    ``sync`` (everyone's live and saved values <- rank 0's). The rest is the C++ state
    machine of include/pushpull/elastic.h (the libtorch elastic API's too):
    ``commit()`` (save, then ``check_host_updates()``, which raises
    ``HostsUpdatedInterrupt`` on every rank at the same commit once the launcher announced
    a host change), ``register_reset_callbacks``, ``on_reset``, ``on_hosts_updated``."""

    def __init__(self, bcast_object=None, get_rank=None):
        super().__init__()
        if bcast_object is None:
            self._bcast_object = _broadcast_object
        else:  # Horovod's signature: bcast_object(obj)
            self._bcast_object = lambda obj, name: bcast_object(obj)
        self._rank = get_rank or _c.rank

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()


class ObjectState(State):
    """State of plain Python objects given as keyword arguments (exposed as attributes)."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super(ObjectState, self).__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        new_state = {}
        for attr in self._saved_state.keys():
            new_state[attr] = getattr(self, attr)
        self._saved_state = new_state

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, 'elastic.sync.objects')
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


class StateHandler(object):
    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self, name):
        raise NotImplementedError()

    def set_value(self, value):
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    def __init__(self, model):
        super().__init__(model)
        self._saved = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self, name):
        # Fixed names: 'broadcast_parameters.<key>' (the same on every rank).
        broadcast_parameters(self.value.state_dict(), root_rank=0)
        self.save()


def _quiesce_distributed_optimizer(opt):
    """A pushpull DistributedOptimizer interrupted by a failure holds reductions of the old
    group (they failed): it drops them and starts its round afresh over the new group."""
    if hasattr(opt, '_quiesce'):
        opt._quiesce()


class OptimizerStateHandler(StateHandler):
    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._saved = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        _quiesce_distributed_optimizer(self.value)
        self.value.load_state_dict(self._saved)

    def sync(self, name):
        _quiesce_distributed_optimizer(self.value)
        buffer = io.BytesIO()
        if _c.rank() == 0:
            torch.save(self.value.state_dict(), buffer)
        blob = _broadcast_object(buffer.getvalue() if _c.rank() == 0 else None, name)
        if _c.rank() != 0:
            self.value.load_state_dict(torch.load(io.BytesIO(blob)))
        self.save()


class _StateDictHandler(StateHandler):
    """An object with a small picklable state_dict(): saved by deep copy,
    synced as rank 0's state_dict."""

    def __init__(self, value):
        super().__init__(value)
        self._saved = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self, name):
        self.value.load_state_dict(_broadcast_object(self.value.state_dict(), name))
        self.save()


class LRSchedulerStateHandler(_StateDictHandler):
    pass


class SamplerStateHandler(_StateDictHandler):
    """Syncs rank 0's position; the sampler re-partitions it by the new size and rank."""


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions a dataset across the ranks and re-partitions what is left of the epoch
    after every re-formation (Horovod's ElasticSampler).

    Track it in the ``TorchState``, call ``record_batch(batch_idx, batch_size)`` after each
    batch and ``set_epoch(epoch)`` at the END of each epoch. The position (samples done this
    epoch, over all ranks) is committed with the state; after a reset the remaining samples
    are split among the new ranks, so every sample of an epoch is seen once (the last batch
    may repeat a few to make the split even)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Counts ``batch_size`` samples done on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        self.processed_num += len(indices) * self.num_replicas

    def load_state_dict(self, state_dict):
        self.epoch = state_dict['epoch']
        self.processed_num = state_dict['processed_num']
        self.reset()

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def reset(self):
        self.num_replicas = _c.size() if _c.is_initialized() else 1
        self.rank = _c.rank() if _c.is_initialized() else 0
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[min(self.processed_num, len(indices)):]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = self.remaining_indices[:]
        if indices:
            indices += indices[:(self.total_size - len(indices))]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (torch.optim.lr_scheduler._LRScheduler, LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handlers(kwargs):
    handlers, rest = {}, {}
    for k, v in kwargs.items():
        for handler_type, handler_cls in _handler_registry:
            if isinstance(v, handler_type):
                handlers[k] = handler_cls(v)
                break
        else:
            rest[k] = v
    return handlers, rest


class TorchState(ObjectState):
    """State of a PyTorch training process: models, optimizers, LR schedulers and
    ElasticSamplers given as keyword arguments get handlers (state_dict copies, broadcast
    from rank 0); anything else is a plain object (epoch, batch, ...). Every argument is an
    attribute of the state."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        if model is not None:
            kwargs['model'] = model
        if optimizer is not None:
            kwargs['optimizer'] = optimizer
        handlers, rest = _get_handlers(kwargs)
        object.__setattr__(self, '_handlers', handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super(TorchState, self).__init__(**rest)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super(TorchState, self).save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super(TorchState, self).restore()

    def sync(self):
        for name in sorted(self._handlers):  # the same order on every rank
            self._handlers[name].sync('elastic.sync.' + name)
        super(TorchState, self).sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get('_handlers')
        if handlers is not None and name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)


def _reset():
    from . import init, shutdown
    shutdown()
    # Automatic names ('allreduce.noname.N') count per process: start every member of the
    # new round from zero, so old members and newcomers name their ops alike.
    with ops._counters_lock:
        ops._counters.clear()
    init()


def run(func):
    """Decorator: runs ``func(state, ...)`` until it returns, surviving workers that leave and
    join (see the module's docstring). Collectives must happen inside ``func`` (or in
    reset callbacks), never between ``init()`` and the call, as in Horovod."""
    return _run_fn(func, _reset)


def _run_fn(func, reset):
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        # The loop is the C++ one (include/pushpull/elastic.h): sync, agree on the hosts,
        # func; restore on a member's failure (HorovodInternalError), keep the state on a
        # host change; re-form with reset() (again while members fail), reset callbacks.
        result = []
        _e.run(state, lambda: result.append(func(state, *args, **kwargs)), reset)
        return result[0]
    return wrapper


__all__ = [
    'run', 'State', 'ObjectState', 'TorchState', 'ElasticSampler', 'HorovodInternalError',
    'HostsUpdatedInterrupt', 'StateHandler', 'ModelStateHandler', 'OptimizerStateHandler',
    'LRSchedulerStateHandler', 'SamplerStateHandler', 'get_handler_registry',
    'set_handler_registry'
]
