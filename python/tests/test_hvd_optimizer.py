"""Horovod compatibility: broadcast_optimizer_state with parameters without
state, Horovod's synchronize()-then-step() warning text, sparse gradients in
DistributedOptimizer (allgather path and sparse_as_dense), sparse_allreduce_async,
Adasum refused wherever a reduction is requested, build introspection and
HorovodInternalError, on 2 and 3 ranks."""

import pytest

from hvd_launch import run_hvd_case


@pytest.mark.parametrize('n', [2, 3])
def test_optimizer_sparse_state_and_introspection(n):
    run_hvd_case('optimizer', n)
