"""Horovod compatibility: process sets (ProcessSet, add/remove_process_set,
global_process_set, process_set= on the ops, DistributedOptimizer,
broadcast_parameters, broadcast_optimizer_state, broadcast_object,
allgather_object, barrier; non-members never blocked; errors at once for
non-members, unregistered or duplicate sets, ranks out of range, a root
outside the set, ranks adding different sets), on 2 and 3 ranks."""

import pytest

from hvd_launch import run_hvd_case


@pytest.mark.parametrize('n', [2, 3])
def test_process_sets(n):
    run_hvd_case('process_sets', n)


def test_init_registers_process_sets():
    run_hvd_case('init_process_sets', 3)
