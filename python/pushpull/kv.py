"""MXNet's KVStore API on pushpull stores (``mxnet.kv`` → ``pushpull.kv``).

    import numpy as np, pushpull
    kv = pushpull.kv.create('local')             # 'dist_sync' etc. under `pushpull launch`
    kv.init(3, np.ones((2, 3), np.float32))
    kv.push(3, [np.ones((2, 3), np.float32)] * 2)  # a list = one array per device: summed
    out = [np.empty((2, 3), np.float32) for _ in range(2)]
    kv.pull(3, out=out)                            # every device gets the stored value (2s)

Conventions (MXNet's):
- Keys are ints or strs; one store never mixes them.
- ``key`` + array, or ``key`` + list of arrays (one per device);
  ``[keys]`` + list with one entry per key, each an array or a list of arrays.
- An array is any numpy array or CPU torch tensor, C-contiguous, of a
  supported dtype; outputs are written in place (no copies at the boundary).

Every call blocks until its work is done (numpy has no dependency engine to
make MXNet's asynchronous calls safe); the GIL is released meanwhile. The
``*_async`` variants return a handle with ``wait()`` and keep their arrays
alive until done. Errors are ``pushpull.Error`` subclasses: InvalidArgument
(wrong dtype, shape, non-contiguous or GPU array, ...), NotFound (key never
initialised), AlreadyExists (second init), Timeout, PeerFailure.
"""

import os
import sys
import weakref

from . import _pushpull
from . import optimizer as _opt
from ._pushpull import InvalidArgument

__all__ = ['KVStore', 'create', 'types']


def _is_list(x):
    return isinstance(x, (list, tuple))


def _is_key(k):
    return isinstance(k, (int, str)) and not isinstance(k, bool)


def _normalise(op, key, value, role):
    """(keys, per-key lists of arrays) from MXNet's key/value conventions."""
    if _is_list(key):
        keys = list(key)
        if not _is_list(value) or len(value) != len(keys):
            got = f'{len(value)} entries' if _is_list(value) else type(value).__name__
            raise InvalidArgument(f'{op}: {len(keys)} keys need a list of {len(keys)} {role}s '
                                  f'(one array, or a list of arrays, per key); got {got}')
        return keys, [list(v) if _is_list(v) else [v] for v in value]
    if not _is_key(key):
        raise InvalidArgument(f'{op}: a key must be an int or a str (or a list of them), got '
                              f'{key!r} ({type(key).__name__})')
    if _is_list(value):
        if not value:
            raise InvalidArgument(f'{op}: empty {role} list for key {key!r}')
        if any(_is_list(v) for v in value):
            raise InvalidArgument(f'{op}: nested {role} lists need a list of keys, got key '
                                  f'{key!r}')
        return [key], [list(value)]
    return [key], [[value]]


class _FailFast:
    """A worker that dies of an uncaught exception must not meet the others at
    the final barrier (they would wait for it until the barrier deadline):
    like a crashed C++ worker it exits at once, so the job fails fast with a
    PeerFailure naming it. Installed with the first distributed store."""

    failed = False
    installed = False

    @classmethod
    def install(cls):
        if cls.installed:
            return
        cls.installed = True
        previous = sys.excepthook

        def hook(exc_type, exc, tb):
            cls.failed = True
            previous(exc_type, exc, tb)

        sys.excepthook = hook

    @classmethod
    def close(cls, store):
        if cls.failed:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        store.close()


def types():
    """The store types ``create`` accepts."""
    return _pushpull.kvstore_types()


class KVStore:
    """A key-value store (``create`` makes one). Thread-safe; see module doc."""

    def __init__(self, store):
        self._store = store
        # A dist store leaves the job (final barrier) when closed; do it at
        # interpreter exit at the latest, while the interpreter still works.
        if store.num_workers > 1 or store.type.startswith('dist'):
            _FailFast.install()
            self._finalizer = weakref.finalize(self, _FailFast.close, store)
        else:
            self._finalizer = weakref.finalize(self, store.close)

    # ---- properties ----
    @property
    def type(self):
        """The type given to ``create`` ('local', 'dist_sync', ...)."""
        return self._store.type

    @property
    def rank(self):
        """This worker's rank, 0..num_workers-1 (0 for local stores)."""
        return self._store.rank

    @property
    def num_workers(self):
        """Number of workers in the job (1 for local stores)."""
        return self._store.num_workers

    @property
    def restart_round(self):
        """A worker restarted by ``pushpull launch --max-restarts`` (a
        parameter-server job): the rounds its rank had completed when it
        rejoined, known after ``init`` (which adopts the servers' values);
        train on from round ``restart_round + 1``. 0 otherwise (docs/ps.md,
        "Worker restart")."""
        return self._store.restart_round

    # ---- data ----
    def init(self, key, value):
        """Stores a copy of ``value`` under ``key`` (lists: one array per key).
        In a distributed job, worker 0's values win; all workers must call it."""
        if _is_list(key):
            if not _is_list(value) or len(value) != len(key):
                raise InvalidArgument(f'init: {len(key)} keys need {len(key)} values')
            if any(_is_list(v) for v in value):
                raise InvalidArgument('init: one array per key (init takes no device lists)')
            self._store.init(list(key), list(value))
        else:
            if _is_list(value):
                raise InvalidArgument(f'init: one array for key {key!r}, got a list; init a '
                                      f'list of keys with a list of values instead')
            self._store.init([key], [value])

    def push(self, key, value, priority=0):
        """Pushes ``value``; a list of arrays for one key is summed (devices).
        Workers' pushes are summed too; the store's updater/optimizer then runs."""
        keys, values = _normalise('push', key, value, 'value')
        self._store.push(keys, values, priority)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Copies the stored value into ``out`` (a list: every device's array)."""
        del ignore_sparse  # every pushpull value is dense
        if out is None:
            raise InvalidArgument('pull: out= is required (the arrays to write into)')
        keys, outs = _normalise('pull', key, out, 'output')
        self._store.pull(keys, outs, priority)

    def pushpull(self, key, value, out=None, priority=0):
        """push then pull as one operation; ``out=None`` writes into ``value``."""
        keys, values = _normalise('pushpull', key, value, 'value')
        if out is None:
            outs = values
        else:
            _, outs = _normalise('pushpull', key, out, 'output')
        self._store.pushpull(keys, values, outs, priority)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        """Pulls the rows ``row_ids`` (1-D int32/int64 array; one per output, or
        one for all) into ``out`` arrays of the value's shape; other rows get 0."""
        if out is None or row_ids is None:
            raise InvalidArgument('row_sparse_pull: out= and row_ids= are required')
        keys, outs = _normalise('row_sparse_pull', key, out, 'output')
        if _is_list(key):
            if not _is_list(row_ids) or len(row_ids) != len(keys):
                raise InvalidArgument(f'row_sparse_pull: {len(keys)} keys need a list of '
                                      f'{len(keys)} row_ids entries')
            rows = [list(r) if _is_list(r) else r for r in row_ids]
        else:
            rows = [list(row_ids) if _is_list(row_ids) else row_ids]
        for k, o, r in zip(keys, outs, rows):
            if _is_list(r):  # one row_ids array per device
                if len(r) != len(o):
                    raise InvalidArgument(f'row_sparse_pull: {len(o)} outputs but {len(r)} '
                                          f'row_ids arrays for key {k!r}')
                for oi, ri in zip(o, r):
                    self._store.row_sparse_pull(k, [oi], ri, priority)
            else:
                self._store.row_sparse_pull(k, o, r, priority)

    # ---- asynchronous variants (pushpull extensions) ----
    def push_async(self, key, value, priority=0):
        """As push; returns a handle (``wait()``, ``done()``). Do not change the
        arrays until it is done."""
        keys, values = _normalise('push', key, value, 'value')
        return self._store.push(keys, values, priority, True)

    def pull_async(self, key, out, priority=0):
        """As pull; ``out`` is complete once the handle's ``wait()`` returned."""
        keys, outs = _normalise('pull', key, out, 'output')
        return self._store.pull(keys, outs, priority, True)

    def pushpull_async(self, key, value, out=None, priority=0):
        keys, values = _normalise('pushpull', key, value, 'value')
        outs = values if out is None else _normalise('pushpull', key, out, 'output')[1]
        return self._store.pushpull(keys, values, outs, priority, True)

    def wait_all(self):
        """Blocks until every operation issued so far finished."""
        self._store.wait_all()

    # ---- updates ----
    def set_optimizer(self, optimizer, **kwargs):
        """Runs ``optimizer`` on every push (on the servers for dist stores).
        ``optimizer``: a ``pushpull.optimizer`` object, a name with keywords
        (``set_optimizer('sgd', learning_rate=0.1)``) or "sgd:learning_rate=0.1"."""
        if isinstance(optimizer, _opt.Optimizer) and not kwargs:
            opt = optimizer
        elif isinstance(optimizer, (str, _opt.Optimizer)):
            opt = _opt.create(optimizer, **kwargs)
        elif hasattr(optimizer, 'name') and hasattr(optimizer, 'hyperparameters'):
            opt = _opt.create(optimizer.name, **dict(optimizer.hyperparameters), **kwargs)
        else:
            raise InvalidArgument(
                f'set_optimizer: expected pushpull.optimizer.create(...), a name and keywords, or '
                f'"name:k=v,..." text; got {type(optimizer).__name__} (mxnet optimizer objects '
                f'are not accepted: pass their name and hyperparameters)')
        self._store.set_optimizer(opt.name, opt.hyperparameters)

    def _set_updater(self, updater):
        """``updater(key, input, stored)`` runs on every push (local stores):
        numpy views of the summed push (read-only) and the stored value
        (update it in place, e.g. ``stored += input * 2``). None removes it."""
        self._store.set_updater(updater)

    set_updater = _set_updater

    def set_gradient_compression(self, compression_params):
        """``{'type': '2bit', 'threshold': 0.5}`` (or '1bit', 'fp16', 'none'), parsed by
        the C++ parser (same errors). dist_sync/dist_async compress pushes with a
        residual per key; dist_sync_allreduce sums fp16 on the ring and
        allgathers 1bit/2bit codes, which every worker sums; local stores
        refuse anything but 'none' (nothing travels)."""
        if not isinstance(compression_params, dict):
            raise InvalidArgument('set_gradient_compression: expected a dict such as '
                                  "{'type': '2bit', 'threshold': 0.5}")
        self._store.set_gradient_compression(
            {str(k): (v if isinstance(v, str) else repr(v)) for k, v in
             compression_params.items()})

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Saves the optimizer's per-key states (waits for pending pushes)."""
        if dump_optimizer:
            raise InvalidArgument('save_optimizer_states: dump_optimizer=True is not supported; '
                                  'call set_optimizer again after load_optimizer_states')
        self._store.save_optimizer_states(str(fname))

    def load_optimizer_states(self, fname):
        """Restores states saved by save_optimizer_states (same optimizer)."""
        self._store.load_optimizer_states(str(fname))

    # ---- job ----
    def barrier(self):
        """Blocks until every worker called it (at once for local stores)."""
        self._store.barrier()

    _barrier = barrier

    def close(self):
        """Waits for pending work and leaves the job; later calls raise.
        Happens by itself when the store is collected or at exit."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f'<pushpull.kv.KVStore {self.type!r} rank {self.rank} of {self.num_workers}>'


def create(name='local', env=None):
    """Makes a store: 'local' (also 'device', 'local_update_cpu', ...),
    'dist_sync', 'dist_device_sync', 'dist_async' (a parameter-server worker:
    run under ``pushpull launch``), 'dist_sync_allreduce' (collectives, no
    servers). Configured from the environment; ``env`` (dict) overrides
    variables for this store only. Dist stores block until the job met."""
    if not isinstance(name, str):
        raise InvalidArgument(f'kv.create: the type must be a str, got {name!r}')
    if env is not None:
        env = {str(k): str(v) for k, v in env.items()}
    return KVStore(_pushpull.create_kvstore(name, env))
