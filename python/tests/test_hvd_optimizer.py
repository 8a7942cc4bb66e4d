"""Horovod compatibility: broadcast_optimizer_state with parameters without
state, Horovod's synchronize()-then-step() warning text, sparse gradients in
DistributedOptimizer (allgather path and sparse_as_dense), sparse_allreduce_async,
Adasum refused wherever a reduction is requested, build introspection and
HorovodInternalError, on 2 and 3 ranks; a sparse gradient missing on a rank."""

import sys

import pytest

from hvd_launch import run_hvd_case
from torch_launch import HERE, run_job


@pytest.mark.parametrize('n', [2, 3])
def test_optimizer_sparse_state_and_introspection(n):
    run_hvd_case('optimizer', n)


@pytest.mark.parametrize('n', [2])
def test_sparse_gradient_missing_on_a_rank(n):
    # A sparse embedding that one rank does not use in a step: training goes on
    # (the module says it is sparse, or an earlier step showed it), or, where
    # no rank can know, every rank fails at once naming the parameter. Before
    # the fix the ranks submitted different ops under different names and
    # waited for each other: the short stall shutdown turns that hang into a
    # failure within seconds.
    code, out = run_job([sys.executable, str(HERE / 'hvd_worker.py'), 'sparse_missing'], n, 60,
                        extra_env={'PUSHPULL_STALL_SHUTDOWN_SECONDS': '5'})
    assert code == 0, 'exited %d:\n%s' % (code, out)
    for r in range(n):
        assert 'PASS sparse_missing rank %d of %d' % (r, n) in out, out
    assert 'Traceback' not in out, out


@pytest.mark.parametrize('n', [2])
def test_sparse_allreduce_meets_a_dense_allreduce(n):
    # A rank calling allreduce and another sparse_allreduce_async under one
    # name: both fail at once (well under the 5 s stall shutdown set here,
    # which the ranks ran into before sparse_allreduce_async used one
    # allgather under the name itself), and the name works afterwards.
    code, out = run_job([sys.executable, str(HERE / 'hvd_worker.py'), 'sparse_meets_dense'], n,
                        60, extra_env={'PUSHPULL_STALL_SHUTDOWN_SECONDS': '5'})
    assert code == 0, 'exited %d:\n%s' % (code, out)
    for r in range(n):
        assert 'PASS sparse_meets_dense rank %d of %d' % (r, n) in out, out
    assert 'Traceback' not in out, out


def test_only_a_sparse_dense_mismatch_is_explained_as_one():
    # The optimizer turns a "submitted differently" error into its sparse
    # explanation only when some ranks allgathered sparse rows and others
    # submitted another op, not for, say, two shapes of an unused dense
    # parameter (the same rule as the libtorch optimizer's explain_mismatch).
    from pushpull.torch.optimizer import _kinds_differ
    head = "collective: tensor 'DistributedOptimizer.grad.w' was submitted differently by the ranks "
    assert _kinds_differ(head + '(rank 0: allgather uint8(3, 24); rank 1: allreduce float32(4, 2) '
                                'sum); every rank must submit the same op')
    assert not _kinds_differ(head + '(rank 0: allreduce float32(4, 3) sum; rank 1: allreduce '
                                    'float32(4, 2) sum); every rank must submit the same op')
    assert not _kinds_differ(head + '(rank 0: allgather uint8(3, 24); rank 1: allgather uint8(0, '
                                    '16)); every rank must submit the same op')
