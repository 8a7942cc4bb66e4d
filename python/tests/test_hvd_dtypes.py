"""Horovod compatibility: every CPU dtype Horovod accepts (uint8, int8, int16,
int32, int64, float16, bfloat16, float32, float64, bool) through allreduce
(sum, average, min, max, product; in place and not), allgather, broadcast,
alltoall and reducescatter, and pre/postscale of integer tensors (scaled in
float, cast back), on 2 and 3 ranks."""

import pytest

from hvd_launch import run_hvd_case


@pytest.mark.parametrize('n', [2, 3])
def test_every_dtype_every_op(n):
    run_hvd_case('dtypes', n)
