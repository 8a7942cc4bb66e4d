"""Horovod compatibility: misuse that used to hang is an error at once, and
hvd.join() behaves as Horovod's (hvd_worker.py cases, 2 and 3 ranks)."""

import pytest

from hvd_launch import run_hvd_case


@pytest.mark.parametrize('n', [2, 3])
def test_duplicate_pending_name_is_value_error_at_once(n):
    # allreduce_async / allgather_async / broadcast_async with the name of a
    # pending op: ValueError on that rank within 2 s; the others carry on.
    run_hvd_case('duplicate_names', n)


@pytest.mark.parametrize('n', [2, 3])
def test_join_contributes_zeros_and_returns_the_last_rank(n):
    # Joined ranks: zeros in sums and averages (divided by size()), no rows in
    # allgathers, zeros in reducescatters; broadcasts from a rank still there
    # work, from a joined root fail on every rank; join() returns size() - 1.
    run_hvd_case('join', n)
