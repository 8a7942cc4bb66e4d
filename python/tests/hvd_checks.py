"""What the Horovod-compatibility worker's cases check against
(hvd_worker.py, hvd_op_cases.py): Horovod's CPU dtypes, tolerances, each
rank's inputs, the reference reductions computed locally with plain torch,
and the check that a misuse fails at once.
"""

import time

import torch

from torch_worker import data, expect_error

# Horovod's CPU dtypes.
ALL_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.bool]


def tol(dtype, n):
    return {torch.float16: 0.02 * n, torch.bfloat16: 0.05 * n, torch.float32: 1e-5,
            torch.float64: 1e-12}.get(dtype, 0.0)


def inputs_of(n, shape, dtype, salt):
    if dtype == torch.bool:
        return [data(k, shape, torch.int32, salt) % 2 == 1 for k in range(n)]
    return [data(k, shape, dtype, salt) for k in range(n)]


def reduce_ref(op, xs, n):
    """Horovod's results: Average = sum / n in float, cast back; an integer
    average truncates toward zero, as Horovod's C++ and its 0.28 suite."""
    dtype = xs[0].dtype
    st = torch.stack([x.double() for x in xs])
    if op == 'sum':
        r = st.sum(0) if dtype != torch.bool else st.max(0).values
    elif op == 'average':
        r = st.sum(0) / n
        if not dtype.is_floating_point:
            r = r.trunc()
    elif op == 'min':
        r = st.min(0).values
    elif op == 'max':
        r = st.max(0).values
    else:
        r = st.prod(0) if dtype != torch.bool else st.min(0).values
    return r.to(dtype)


def quickly(fn, cls, *needles, limit=2.0):
    """The error comes at once on the misusing rank (generous bound: a shared machine)."""
    t0 = time.time()
    msg = expect_error(fn, cls, *needles)
    if time.time() - t0 > limit:
        raise AssertionError('the error took %.2f s' % (time.time() - t0))
    return msg


