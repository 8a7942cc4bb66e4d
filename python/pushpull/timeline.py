"""Your own phases on pushpull's timeline (docs/timeline.md, "Your own phases").

With ``PUSHPULL_TIMELINE`` (or ``HOROVOD_TIMELINE``) set, every process writes
a Chrome trace of the engine's work: per tensor ``QUEUE``, ``NEGOTIATE`` and
the operation. Spans recorded here land in the same file, in the same
process lane, on a lane of their own (``step`` by default), so a training
loop can show where its forward, backward and update ran next to the
communication::

    from pushpull import timeline
    with timeline.span('FORWARD'):
        loss = model(x).sum()
    with timeline.span('BACKWARD'):
        loss.backward()
    with timeline.span('STEP'):
        opt.step()

When the timeline is off, ``span`` costs a function call and records
nothing. Thread-safe (the recorder serialises events).
"""

import contextlib

from ._pushpull import timeline as _timeline

__all__ = ['enabled', 'span', 'record', 'now']


def enabled():
    """True when this process records a timeline."""
    return _timeline.enabled()


def now():
    """The timeline's clock in nanoseconds (steady; the same in every process of a host)."""
    return _timeline.now()


def _default_node():
    # The collective engine's lanes are "rank N": annotations of a Horovod-style
    # job go next to them. Otherwise the launcher's name ("worker 0", ...).
    try:
        from ._pushpull import collective
        if collective.is_initialized():
            return 'rank %d' % collective.rank()
    except ImportError:  # built without the collectives
        pass
    return _timeline.process_node()


def record(name, begin_ns, end_ns, lane='step', node=None):
    """Records a span from ``begin_ns`` to ``end_ns`` (times from ``now()``)."""
    if _timeline.enabled():
        _timeline.span(node or _default_node(), lane, name, begin_ns, end_ns)


@contextlib.contextmanager
def span(name, lane='step', node=None):
    """A span named ``name`` around the ``with`` block, on lane ``lane`` of
    ``node`` (default: this process's collective rank, "rank N", else the
    launcher's node name). Recorded when the block ends, also by an exception."""
    if not _timeline.enabled():
        yield
        return
    begin = _timeline.now()
    try:
        yield
    finally:
        _timeline.span(node or _default_node(), lane, name, begin, _timeline.now())
