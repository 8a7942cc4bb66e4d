"""pushpull.torch collective ops on 2 and 3 ranks through `pushpull launch -s 0`.

Each case lives in torch_worker.py; the ranks check their results against torch
references computed locally and print PASS lines that are checked here.
"""

import pytest

from torch_launch import run_case


@pytest.mark.parametrize('n', [2, 3])
def test_ops_against_torch_references(n):
    # allreduce sum/average/min/max x 8 dtypes (in place and not), allgather
    # (equal and variable first dims), broadcast from root 1, async + poll +
    # synchronize, scaling, grouped, reducescatter, objects.
    run_case('ops', n)


def test_different_submission_orders_complete():
    # rank 0 submits a, b, c; rank 1 c, b, a (and mixed op types).
    run_case('orders', 2)


def test_errors_are_invalid_argument_on_every_rank():
    # wrong dtype, non-contiguous, not a tensor, Adasum, a CUDA device (fake
    # __dlpack_device__), and shapes/dtypes that differ across ranks.
    out = run_case('errors', 2)
    assert 'Traceback' not in out


def test_join_with_uneven_batches():
    out = run_case('join', 3)
    assert 'rank 0 joined after 2 of 6 batches' in out


def test_blocking_calls_release_the_gil_and_handles_keep_tensors_alive():
    out = run_case('gil', 2)
    assert 'the other thread ran' in out
