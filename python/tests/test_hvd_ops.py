"""Horovod compatibility: reducescatter (average, async, pre/postscale,
grouped, autograd), grouped_allreduce(_)(_async)(_), grouped_allgather(_async),
alltoall (equal and explicit splits, empty parts, received splits, async,
autograd, bad splits refused at once), on 2 and 3 ranks."""

import pytest

from hvd_launch import run_hvd_case


@pytest.mark.parametrize('n', [2, 3])
def test_reducescatter_grouped_and_alltoall(n):
    run_hvd_case('ops', n)
