"""Handles of pushpull.torch's ops and the names they hold (Horovod's rules).

``Handle`` is what every ``*_async`` op returns; ``synchronize`` / ``poll`` take
it. ``_auto_name`` gives an op its engine name (``<op>.noname.<n>`` when
unnamed, from a per-process counter) and refuses a name that a dropped handle
still holds (see ``DROP_HOLD``). Split from ops.py, which re-exports these.

Thread safety: every function may be called from any thread; the counters and
the dropped names have their own locks.
"""

import itertools
import threading
import time

from pushpull._pushpull import InvalidArgument

_counters = {}
_counters_lock = threading.Lock()


# Ops whose handle was dropped without synchronize: {engine name: (op, when)}.
# As in Horovod, submitting a name again while its op is pending on this rank
# is a ValueError. Horovod negotiates once per cycle (milliseconds), so an op
# never completes between two submissions in a row; pushpull's engine can, so
# a dropped handle keeps its name taken until the op is done and DROP_HOLD
# seconds have passed since the drop (the op is kept here, which also keeps
# its tensors alive, until then). That holds when the op completed before its
# handle was dropped, too (op None here): otherwise whether the second
# submission is refused would depend on how fast the others submitted theirs
# (Horovod's suite saw that race on the rank that submits last).
DROP_HOLD = 1.0
_dropped = {}
_dropped_lock = threading.Lock()


def _forget_dropped(handle):
    """Handle.__del__: remembers the names of the engine ops of a handle that
    was never synchronized (auto-generated names are never submitted again)."""
    if handle._waited:
        return
    op = handle._op
    try:
        now = time.monotonic()
        for one in (op.ops if isinstance(op, _Group) else [op]):
            pending = not one.done()
            if pending or '.noname.' not in one.name:
                with _dropped_lock:
                    _dropped[one.name] = (one if pending else None, now)
    except Exception:  # noqa: BLE001 - never raise from a destructor
        pass


def _done(op):
    if op is None:
        return True
    try:
        return op.done()
    except Exception:  # noqa: BLE001 - e.g. a handle of a session that was shut down
        return True


def _check_not_dropped(full):
    now = time.monotonic()
    with _dropped_lock:
        for n, (op, when) in list(_dropped.items()):
            if _done(op) and (n != full or now - when >= DROP_HOLD):
                del _dropped[n]
        taken = full in _dropped
    if taken:
        raise InvalidArgument(
            "pushpull.torch: an op named '%s' is still pending on this rank, or its handle was "
            "dropped without synchronize less than %g s ago; a name may not be submitted again "
            "until then" % (full, DROP_HOLD))


def _auto_name(kind, name, prefix=''):
    """The op's engine name: ``prefix`` scopes it to a process set. A name whose
    op is still pending here (its handle dropped) is refused (ValueError)."""
    if name is not None:
        _check_not_dropped(prefix + str(name))
        return prefix + str(name)
    with _counters_lock:
        counter = _counters.setdefault((kind, prefix), itertools.count())
        return '%s%s.noname.%d' % (prefix, kind, next(counter))



class Handle:
    """An operation in flight. Pass it to ``synchronize`` or ``poll``."""

    __slots__ = ('_op', '_result', '_finish', '_waited', '__weakref__')

    def __init__(self, op, result, finish=None):
        self._op = op
        self._result = result
        self._finish = finish
        self._waited = False  # synchronize was called: dropping it frees its name

    @property
    def name(self):
        return self._op.name

    def __repr__(self):
        return '<pushpull.torch.Handle %r done=%s>' % (self._op.name, self._op.done())

    def __del__(self):
        _forget_dropped(self)


class _Group:
    """Several engine operations behind one Handle (grouped ops, alltoall)."""

    __slots__ = ('name', 'ops')

    def __init__(self, name, ops):
        self.name, self.ops = name, list(ops)

    def done(self):
        return all(op.done() for op in self.ops)

    def wait(self, timeout=None):
        for op in self.ops:
            op.wait(timeout)


def poll(handle):
    """True once the operation is done (``synchronize`` then returns at once)."""
    return handle._op.done()


def synchronize(handle, timeout=None):
    """Waits for the operation and returns its output tensor (raises its error)."""
    handle._waited = True
    if handle._finish is not None:
        finish, handle._finish = handle._finish, None
        handle._result = finish(handle._op, timeout)
    else:
        handle._op.wait(timeout)
    return handle._result
