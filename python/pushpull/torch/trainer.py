"""pushpull.torch.Trainer: a Gluon-style trainer over a KVStore (parameter
server or any other store type), for torch models.

    kv = pushpull.kv.create('dist_sync')              # under pushpull launch -n 2 -s 2
    trainer = pushpull.torch.Trainer(model.named_parameters(), 'sgd',
                                     {'learning_rate': 0.1, 'momentum': 0.9}, kvstore=kv)
    for x, y in batches:
        loss = F.cross_entropy(model(x), y, reduction='sum')   # a SUM over the batch
        loss.backward()
        trainer.step(len(x))                          # samples this worker processed
        model.zero_grad()

Parameter i (in the order given) is key ``key_base + i``, except small ones:
parameters of fewer than ``fuse_below`` bytes (default 256 KiB, where a value
starts to be split over the servers) are packed, in order, into flat keys of
up to ``bucket_bytes`` (default 1 MiB), each under the key of its first
parameter, as DDP packs gradients into buckets: one request, round and reply
for many biases and small layers instead of one each. Every pushpull
optimizer is elementwise, so a packed key updates exactly as its parameters
would one by one; ``fuse_below=0`` turns packing off. A Trainer uses keys in
``key_base .. key_base + P - 1`` (P parameters) either way. The constructor
stores worker 0's weights and pulls them into every worker (every worker must
create its Trainer; it blocks until worker 0's values are there). step(batch_size)
pushes every gradient (the store sums the workers'), then

- update_on_kvstore (default for a pushpull optimizer): the store runs the
  optimizer with ``rescale_grad = rescale_grad / (batch_size * num_workers)``
  (set at the first step, as Gluon does) and step() pulls the new weights;
- otherwise step() pulls the summed gradient, scales it by
  ``1 / (batch_size * num_workers)`` and updates locally: with the torch
  optimizer you passed (``Trainer(params, torch.optim.SGD(...))``) or with the
  pushpull optimizer run here on each key.

From the second step on each gradient is pushed from a hook on its
AccumulateGrad node as soon as backward() produced it (priority -i: the first
layers, needed first by the next forward pass, go first; a packed key once
its last parameter's gradient is there) with ``pushpull_async``: the push
asks for the new value back, so both directions of the exchange overlap the
rest of the backward pass. backward() no longer reads a parameter once its
gradient is accumulated, so the new value may land in it before step()
returns (a packed key's is copied in by step()): read parameters after
step(), as with Horovod's gradients. One backward per step with hooks on; for gradient
accumulation pass ``push_from_hooks=False``.

Parameters must be float32, contiguous, CPU tensors. Thread safety: one
thread drives a Trainer (autograd runs the hooks on the backward() thread).

The step itself (keys and their flat buffers, init, the pushes, the first
step's rescale, the local update) is the C++ TrainerCore
(include/pushpull/frontend/trainer_core.h), the libtorch Trainer's too; this
file keeps the torch glue: checks and messages, hooks, a torch optimizer.
"""

import functools
import warnings

import torch

import pushpull.kv
import pushpull.optimizer
from pushpull._pushpull import InvalidArgument
from pushpull._pushpull import TrainerCore as _TrainerCore


def _named(params):
    items = list(params.items()) if isinstance(params, dict) else list(params)
    named = []
    for i, item in enumerate(items):
        name, p = item if isinstance(item, tuple) and len(item) == 2 else ('param%d' % i, item)
        if not isinstance(p, torch.Tensor):
            raise InvalidArgument('Trainer: parameter %r is a %s, not a tensor'
                                  % (name, type(p).__name__))
        named.append((str(name), p))
    if not named:
        raise InvalidArgument('Trainer: no parameters given')
    return named


def _check_tensor(t, name, i, what):
    if t.device.type != 'cpu':
        raise InvalidArgument('Trainer: %s of %r (index %d) is on %s; only CPU tensors are '
                              'supported; call .cpu()' % (what, name, i, t.device))
    if t.dtype != torch.float32:
        raise InvalidArgument('Trainer: %s of %r (index %d) is %s; the Trainer needs '
                              'float32' % (what, name, i, t.dtype))
    if not t.is_contiguous():
        raise InvalidArgument('Trainer: %s of %r (index %d) is not contiguous'
                              % (what, name, i))


# The core's callbacks: plain functions of the parameters, never of the
# Trainer (the core keeps them; a reference to the Trainer would be a cycle
# through C++ that Python cannot collect).
def _gradient(named, key_of, i):
    name, p = named[i]
    if p.grad is None:
        raise InvalidArgument('Trainer.step: parameter %r (key %d) has no gradient; run '
                              'backward() first (every worker pushes every key)'
                              % (name, key_of[i]))
    _check_tensor(p.grad, name, i, 'gradient')
    return p.grad


def _batch_changed(batch_size, first):
    warnings.warn('Trainer.step(%d): the store\'s optimizer keeps the first step\'s batch size '
                  '%d (rescale_grad is set once, as in Gluon)' % (batch_size, first))


class Trainer:
    def __init__(self, params, optimizer='sgd', optimizer_params=None, kvstore='dist_sync',
                 update_on_kvstore=None, key_base=0, push_from_hooks=True,
                 fuse_below=256 << 10, bucket_bytes=1 << 20):
        self._named = _named(params)
        self._params = [p for _, p in self._named]
        for i, (name, p) in enumerate(self._named):
            _check_tensor(p, name, i, 'parameter')
            if not p.requires_grad or p.grad_fn is not None:
                raise InvalidArgument('Trainer: parameter %r (key %d) must be a leaf tensor that '
                                      'requires grad' % (name, key_base + i))
        self._kv = pushpull.kv.create(kvstore) if isinstance(kvstore, str) else kvstore

        self._torch_opt = None
        self._spec = None
        if isinstance(optimizer, torch.optim.Optimizer):
            if optimizer_params:
                raise InvalidArgument('Trainer: optimizer_params go with an optimizer name, not '
                                      'with a torch optimizer object')
            if update_on_kvstore:
                raise InvalidArgument('Trainer: a torch optimizer runs on the worker; pass a '
                                      'pushpull optimizer name for update_on_kvstore=True')
            self._torch_opt = optimizer
            update_on_kvstore = False
        else:
            self._spec = pushpull.optimizer.create(optimizer, **(optimizer_params or {}))
            if update_on_kvstore is None:
                update_on_kvstore = True
        self._update_on_kvstore = bool(update_on_kvstore)
        spec = self._spec or pushpull.optimizer.create('sgd')  # unused by a torch optimizer
        key_of = []  # parameter i's key (its unit's), for messages
        # Packing and key assignment, the step state machine, init, the
        # rescale and the local update: the C++ TrainerCore, as the libtorch
        # Trainer's (messages name a parameter's key: its packed unit's).
        self._core = _TrainerCore(
            getattr(self._kv, '_store', self._kv), [p.detach() for p in self._params],
            functools.partial(_gradient, self._named, key_of),
            _batch_changed, spec.name, dict(spec.hyperparameters), self._update_on_kvstore,
            bool(push_from_hooks), key_base, fuse_below, bucket_bytes, self._torch_opt is None)
        key_of.extend(self._core.key_of(i) for i in range(len(self._params)))
        self._summed = None
        if self._torch_opt is not None:  # the core sums and scales; torch updates
            self._summed = [torch.from_numpy(self._core.summed(i))
                            for i in range(len(self._params))]
        self._grad_accs = []
        if push_from_hooks:
            for i, p in enumerate(self._params):
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_hook(i))
                self._grad_accs.append(acc)  # the hook lives as long as the node
        # Now rather than at the first step (the C++ Trainer's choice): the
        # first forward pass must already see worker 0's weights.
        self.init()

    @property
    def kvstore(self):
        return self._kv

    @property
    def keys(self):
        """The store keys this Trainer uses, ascending (a packed unit's is its
        first parameter's)."""
        return list(self._core.keys)

    @property
    def update_on_kvstore(self):
        return self._update_on_kvstore

    @property
    def learning_rate(self):
        if self._torch_opt is not None:
            return self._torch_opt.param_groups[0]['lr']
        return self._spec.hyperparameters.get('learning_rate')

    @property
    def stats(self):
        """{'steps', 'hook_pushes', 'step_pushes', 'wait_seconds'}: keys pushed
        from hooks / from step(), and step()'s seconds waiting for the store."""
        return self._core.stats()

    def init(self):
        """Stores worker 0's weights and pulls them into every worker (the
        constructor does it; later calls do nothing)."""
        self._core.init()

    def _make_hook(self, i):
        def hook(*unused):
            if self._core.grad_ready(i) == 'second':
                raise InvalidArgument(
                    'Trainer: parameter %r got a second gradient before step(); the Trainer '
                    'pushes each gradient once per step from its hook. For several backward '
                    'passes per step create it with push_from_hooks=False' % self._named[i][0])
        return hook

    def step(self, batch_size, ignore_stale_grad=False):
        """Pushes the gradients, updates, and writes the new weights into the
        parameters. ``batch_size``: samples this worker processed this step."""
        del ignore_stale_grad
        self._core.step(batch_size)
        if self._torch_opt is not None:  # the summed gradients, scaled by 1 / (batch * workers)
            for p, s in zip(self._params, self._summed):
                p.grad.copy_(s.view_as(p))
            self._torch_opt.step()
