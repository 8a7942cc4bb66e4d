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
  pushpull optimizer run by a private local store.

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
"""

import warnings

import torch

import pushpull.kv
import pushpull.optimizer
from pushpull._pushpull import InvalidArgument
from pushpull._pushpull import PushSchedule as _PushSchedule
from pushpull._pushpull import pack_keys as _pack_keys


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


class _Unit:
    """One key of the store: one parameter, or several small ones packed in
    order into a flat float32 buffer (`value`: the weights; `grad`: the
    gradients gathered for a push; `summed`: the summed gradients pulled
    when the update runs here)."""

    def __init__(self, key, members, offsets, numel, params):
        self.key = key
        self.members = members
        self.packed = len(members) > 1
        self.offsets = offsets
        if self.packed:
            self.value = torch.empty(numel, dtype=torch.float32)
            self.grad = torch.empty(numel, dtype=torch.float32)
        else:
            self.value = params[members[0]].detach()
        self.summed = None

    def views(self, flat, params):
        """(i, the slice of `flat` shaped as parameter i) per member."""
        for i, at in zip(self.members, self.offsets):
            n = params[i].numel()
            yield i, flat[at:at + n].view_as(params[i])

    def gather(self, params, get, flat):
        """Copies get(parameter) of each member into `flat` (a packed unit)."""
        for i, view in self.views(flat, params):
            view.copy_(get(params[i]))

    def scatter(self, flat, params):
        """Copies `flat` back into the members' weights (a packed unit)."""
        for i, view in self.views(flat, params):
            params[i].detach().copy_(view)


def _pack(params, key_base, fuse_below, bucket_bytes):
    """The store's keys (packing and assignment: the C++ pack_keys of
    include/pushpull/frontend/key_packing.h, which the libtorch Trainer uses)."""
    return [_Unit(key, members, offsets, numel, params) for key, members, offsets, numel in
            _pack_keys([p.numel() for p in params], key_base, fuse_below, bucket_bytes)]


class Trainer:
    def __init__(self, params, optimizer='sgd', optimizer_params=None, kvstore='dist_sync',
                 update_on_kvstore=None, key_base=0, push_from_hooks=True,
                 fuse_below=256 << 10, bucket_bytes=1 << 20):
        self._named = _named(params)
        self._params = [p for _, p in self._named]
        for i, (name, p) in enumerate(self._named):
            self._check_tensor(p, name, i, 'parameter')
            if not p.requires_grad or p.grad_fn is not None:
                raise InvalidArgument('Trainer: parameter %r (key %d) must be a leaf tensor that '
                                      'requires grad' % (name, key_base + i))
        self._kv = pushpull.kv.create(kvstore) if isinstance(kvstore, str) else kvstore
        self._keys = [key_base + i for i in range(len(self._params))]  # one per parameter
        self._units = _pack(self._params, key_base, fuse_below, bucket_bytes)
        self._unit_of = [0] * len(self._params)
        for u, unit in enumerate(self._units):
            for i in unit.members:
                self._unit_of[i] = u

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
        if not update_on_kvstore and 'async' in self._kv.type:
            raise InvalidArgument("Trainer: a '%s' store needs update_on_kvstore=True (the "
                                  'servers run the optimizer), as in Gluon' % self._kv.type)
        self._update_on_kvstore = bool(update_on_kvstore)
        self._local_kv = None
        self._summed = None
        self._initialized = False
        self._batch_size = None
        self._steps = 0
        self._push_from_hooks = push_from_hooks
        # When a hook pushes which unit: the C++ PushSchedule (frontend/push_schedule.h),
        # as the libtorch Trainer's.
        self._schedule = _PushSchedule([u.members for u in self._units], len(self._params), 1,
                                       bool(push_from_hooks))
        self._pushed = {}  # unit -> its exchange in flight
        self._grad_accs = []
        self.stats = {'steps': 0, 'hook_pushes': 0, 'step_pushes': 0}
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
        return sorted(u.key for u in self._units)

    @property
    def update_on_kvstore(self):
        return self._update_on_kvstore

    @property
    def learning_rate(self):
        if self._torch_opt is not None:
            return self._torch_opt.param_groups[0]['lr']
        return self._spec.hyperparameters.get('learning_rate')

    @staticmethod
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

    def init(self):
        """Stores worker 0's weights and pulls them into every worker (the
        constructor does it; later calls do nothing)."""
        if self._initialized:
            return
        packed = [u for u in self._units if u.packed]
        for unit in packed:
            unit.gather(self._params, torch.Tensor.detach, unit.value)
        keys = [u.key for u in self._units]
        values = [u.value for u in self._units]
        self._kv.init(keys, values)
        self._kv.pull(keys, out=values)
        for unit in packed:
            unit.scatter(unit.value, self._params)
        if not self._update_on_kvstore:
            self._summed = [None] * len(self._params)
            for unit in self._units:
                unit.summed = torch.empty_like(unit.value)
                for i, view in unit.views(unit.summed, self._params):
                    self._summed[i] = view
            if self._torch_opt is None:
                self._local_kv = pushpull.kv.create('local')
                self._local_kv.init(self._keys, [p.detach() for p in self._params])
                self._local_kv.set_optimizer(self._spec)
        self._initialized = True

    def _exchange(self, u):
        # Push the gradient and pull the result in one call: each slice's push
        # asks for the value back, so a server answers it as soon as the
        # round is complete. The result is the new weight
        # (update_on_kvstore) or the summed gradient; a packed key's lands in
        # its flat buffer, copied into the parameters by step().
        unit = self._units[u]
        if unit.packed:
            unit.gather(self._params, lambda p: p.grad, unit.grad)
            grad = unit.grad
            out = unit.value if self._update_on_kvstore else unit.summed
        else:
            i = unit.members[0]
            grad = self._params[i].grad
            out = self._params[i].detach() if self._update_on_kvstore else self._summed[i]
        return self._kv.pushpull_async(unit.key, grad, out=out, priority=-unit.members[0])

    def _make_hook(self, i):
        def hook(*unused):
            what, u = self._schedule.grad_ready(i)
            if what == 'second':
                raise InvalidArgument(
                    'Trainer: parameter %r got a second gradient before step(); the Trainer '
                    'pushes each gradient once per step from its hook. For several backward '
                    'passes per step create it with push_from_hooks=False' % self._named[i][0])
            if what != 'push':  # the unit's last gradient sends it
                return
            try:
                for j in self._units[u].members:
                    self._check_tensor(self._params[j].grad, self._named[j][0], j, 'gradient')
                self._pushed[u] = self._exchange(u)
            except BaseException:
                self._schedule.push_failed(u)  # step() pushes it (and reports the problem)
                raise
            self.stats['hook_pushes'] += 1
        return hook

    def step(self, batch_size, ignore_stale_grad=False):
        """Pushes the gradients, updates, and writes the new weights into the
        parameters. ``batch_size``: samples this worker processed this step."""
        del ignore_stale_grad
        if batch_size <= 0:
            raise InvalidArgument('Trainer.step: batch_size must be > 0, got %r' % (batch_size,))
        self._schedule.disarm()  # no hook pushes while step() runs
        self.init()
        scale = 1.0 / (batch_size * self._kv.num_workers)
        if self._update_on_kvstore:
            if self._batch_size is None:
                hp = dict(self._spec.hyperparameters)
                hp['rescale_grad'] = hp.get('rescale_grad', 1.0) * scale
                self._kv.set_optimizer(pushpull.optimizer.create(self._spec.name, **hp))
                self._batch_size = batch_size
            elif batch_size != self._batch_size:
                warnings.warn('Trainer.step(%d): the store\'s optimizer keeps the first step\'s '
                              'batch size %d (rescale_grad is set once, as in Gluon)'
                              % (batch_size, self._batch_size))
        # Check every gradient before pushing any, so a bad one changes nothing.
        for i, (name, p) in enumerate(self._named):
            if self._unit_of[i] in self._pushed:
                continue
            if p.grad is None:
                raise InvalidArgument('Trainer.step: parameter %r (key %d) has no gradient; run '
                                      'backward() first (every worker pushes every key)'
                                      % (name, self._units[self._unit_of[i]].key))
            self._check_tensor(p.grad, name, i, 'gradient')
        exchanges = []
        for u in range(len(self._units)):
            h = self._pushed.pop(u, None)
            if h is None:
                h = self._exchange(u)
                self.stats['step_pushes'] += 1
            exchanges.append(h)
        self._schedule.end_round()
        self._schedule.disarm()  # armed again once the new weights are in
        for h in exchanges:
            h.wait()
        if self._update_on_kvstore:
            for unit in self._units:
                if unit.packed:
                    unit.scatter(unit.value, self._params)
        else:
            self._local_update(scale)
        self._steps += 1
        self.stats['steps'] = self._steps
        self._schedule.end_round()

    def _local_update(self, scale):
        if self._torch_opt is not None:
            for p, s in zip(self._params, self._summed):
                p.grad.copy_(s).mul_(scale)
            self._torch_opt.step()
            return
        for s in self._summed:
            s.mul_(scale)
        weights = [p.detach() for p in self._params]
        self._local_kv.push(self._keys, self._summed)
        self._local_kv.pull(self._keys, out=weights)
