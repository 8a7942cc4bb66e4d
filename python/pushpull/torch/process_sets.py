"""Horovod's process sets: collectives over a subset of the ranks.

    even = hvd.add_process_set([0, 2])          # every rank calls it, in the same order
    if even.included():
        hvd.allreduce(t, process_set=even)      # only ranks 0 and 2 call this

How it works: an op in a process set carries its members to the engine
(include/pushpull/collective.h, ``members``). Only the members submit it; the
other ranks' background threads take part in the algorithm as a joined rank
does (they relay and contribute nothing), so the non-members' Python code is
never blocked by it. Names are scoped by the set's id (``ps<id>.<name>``), so
two sets may use the same names.

Unlike Horovod, sets may be added and removed at any time without
``HOROVOD_DYNAMIC_PROCESS_SETS`` (adding is collective over all ranks either
way), and ``init(comm=...)`` (MPI communicators) is refused.

Thread safety: add/remove are collective calls; make them from one thread.
"""

import threading

import torch

from pushpull._pushpull import InvalidArgument
from pushpull._pushpull import collective as _c


class ProcessSet:
    """A subset of the ranks (Horovod's ``hvd.ProcessSet``). Register it with
    ``add_process_set`` (or ``init(process_sets=[...])``) before use."""

    def __init__(self, ranks):
        if ranks is None:  # the global set
            self._ranks = None
        else:
            try:
                ranks = [int(r) for r in ranks]
            except TypeError:
                raise InvalidArgument(
                    'ProcessSet: expected a list of ranks; MPI communicators are not supported '
                    '(got %s)' % type(ranks).__name__) from None
            if not ranks:
                raise InvalidArgument('ProcessSet: a process set needs at least one rank')
            self._ranks = sorted(set(ranks))
        self.process_set_id = None

    @property
    def ranks(self):
        """The member ranks, sorted."""
        return list(range(_c.size())) if self._ranks is None else list(self._ranks)

    def size(self):
        """Number of member ranks."""
        return _c.size() if self._ranks is None else len(self._ranks)

    def rank(self):
        """This process's rank within the set (-1 when not a member)."""
        me = _c.rank()
        if self._ranks is None:
            return me
        return self._ranks.index(me) if me in self._ranks else -1

    def included(self):
        """True when this process is a member."""
        return self._ranks is None or _c.rank() in self._ranks

    def _members(self):
        # What the engine gets: [] for every rank.
        return [] if self._ranks is None else list(self._ranks)

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self):
        return hash(tuple(self.ranks))

    def __repr__(self):
        return 'ProcessSet(process_set_id=%s, ranks=%s)' % (
            self.process_set_id, 'all' if self._ranks is None else self._ranks)


global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0

_lock = threading.Lock()
_table = {0: global_process_set}
_next_id = [1]


def _resolve(process_set, what):
    """(members for the engine, name prefix, set size) of an op's process set;
    raises InvalidArgument at once for an unregistered set or a non-member."""
    if process_set is None or process_set is global_process_set:
        return [], '', _c.size()
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgument('%s: process_set must be a hvd.ProcessSet, got %s'
                              % (what, type(process_set).__name__))
    with _lock:
        registered = _table.get(process_set.process_set_id) is process_set
    if not registered:
        raise InvalidArgument(
            '%s: %r is not registered; call hvd.add_process_set() on every rank first'
            % (what, process_set))
    if not process_set.included():
        raise InvalidArgument('%s: rank %d is not in %r; only its members may call it'
                              % (what, _c.rank(), process_set))
    return (process_set._members(), 'ps%d.' % process_set.process_set_id, process_set.size())


def _agree(tag, values):
    """Checks that every rank passed the same values (collective over all ranks)."""
    mine = torch.tensor([len(values)] + list(values), dtype=torch.int64)
    width = _c.allgather('%s.len' % tag, torch.tensor([mine.numel()], dtype=torch.int64).numpy())
    if len(set(width.tolist())) != 1:
        return False
    every = _c.allgather(tag, mine.view(1, -1).numpy())
    return all((row == every[0]).all() for row in every)


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) and returns it.
    Collective: every rank (members or not) calls it with the same ranks, in the
    same order as its other add/remove calls."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set._ranks is None:
        raise InvalidArgument('add_process_set: the global process set is always registered')
    if process_set.process_set_id is not None:
        raise InvalidArgument('add_process_set: %r is already registered' % (process_set,))
    with _lock:
        new_id = _next_id[0]
    # Agreement first, so that the checks below (deterministic given the same
    # ranks and the same table) fail on every rank alike.
    if not _agree('process_set.add.%d' % new_id, process_set._ranks):
        raise InvalidArgument(
            'add_process_set: the ranks passed different process sets (this rank: %s); every '
            'rank must add the same sets in the same order' % process_set._ranks)
    bad = [r for r in process_set._ranks if r < 0 or r >= _c.size()]
    if bad:
        raise InvalidArgument('add_process_set: %s are not ranks of the job (size %d)'
                              % (bad, _c.size()))
    with _lock:
        same = [ps for ps in _table.values() if ps.ranks == process_set.ranks]
    if same:
        raise InvalidArgument('add_process_set: a process set with ranks %s is already '
                              'registered (id %d)' % (process_set.ranks, same[0].process_set_id))
    with _lock:
        _next_id[0] += 1
        process_set.process_set_id = new_id
        _table[new_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Unregisters a process set (collective, like add_process_set). Returns
    False for the global set or a set that is not registered."""
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id in (None, 0):
        return False
    with _lock:
        if _table.get(process_set.process_set_id) is not process_set:
            return False
    if not _agree('process_set.remove.%d' % process_set.process_set_id,
                  [process_set.process_set_id]):
        raise InvalidArgument('remove_process_set: the ranks removed different process sets')
    with _lock:
        del _table[process_set.process_set_id]
        process_set.process_set_id = None
    return True


def _reset():
    """Forgets every set but the global one (hvd.shutdown)."""
    with _lock:
        for ps in list(_table.values()):
            if ps is not global_process_set:
                ps.process_set_id = None
        _table.clear()
        _table[0] = global_process_set
        _next_id[0] = 1
