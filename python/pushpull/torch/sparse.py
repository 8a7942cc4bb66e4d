"""Sparse allreduce (Horovod's sparse_allreduce_async): every rank's sparse COO
tensor's nonzeros (indices and values packed into one row of bytes each) are
allgathered under the op's name; the result is their (uncoalesced)
concatenation, which torch sums on coalescing."""

import math

import torch

from pushpull._pushpull import InvalidArgument

from . import ops


def sparse_allreduce_async(tensor, name=None, op=None, process_set=None):
    """Starts the allreduce of a sparse COO tensor (op Average or Sum). The
    handle works with ``synchronize`` and may also be called (as Horovod's).
    One allgather under the op's name itself (as a dense allreduce would be
    named), so a rank that allreduces a dense tensor under the same name
    meets it and both fail at once, instead of waiting until the timeout."""
    reduction = ops._resolve_op(None, op)
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise InvalidArgument('sparse_allreduce_async: expected a sparse COO tensor')
    if reduction not in (ops.Average, ops.Sum):
        raise InvalidArgument('sparse_allreduce_async: op must be Average or Sum')
    _, prefix, _ = ops._scope(process_set, 'sparse_allreduce')
    base = ops._auto_name('sparse_allreduce', name, prefix)[len(prefix):]
    return _gather_rows_async(tensor, base, reduction, process_set, tensor.sparse_dim(),
                              'sparse_allreduce')


class _SparseHandle(ops.Handle):
    __slots__ = ()

    def __call__(self):
        return ops.synchronize(self)


def _gather_rows_async(tensor, name, op, process_set, sparse_dim, who='DistributedOptimizer'):
    """sparse_allreduce_async's and the DistributedOptimizer's sparse
    reduction: one allgather under ``name`` itself (each nonzero's indices and
    values packed into one row of bytes), the name a dense allreduce has. A
    rank that contributes a dense tensor where another contributes a sparse
    one then meets it under one name, and the negotiation fails both at once
    ("submitted differently") instead of each waiting for the other's op
    until the timeout. ``who`` names the caller in errors. ``tensor``: sparse COO
    with ``sparse_dim`` sparse dimensions (no rows: an empty contribution)."""
    reduction = ops._resolve_op(None, op)
    _, _, n = ops._scope(process_set, who)
    dense_shape = tuple(tensor.shape[sparse_dim:])
    dtype = tensor.dtype
    nnz = tensor._nnz()
    value_bytes = tensor.element_size() * math.prod(dense_shape)

    def as_bytes(t, width):  # flat first: a view to bytes needs a unit last stride
        return t.contiguous().reshape(-1).view(torch.uint8).reshape(nnz, width)
    packed = torch.cat([as_bytes(tensor._indices().t(), sparse_dim * 8),
                        as_bytes(tensor._values(), value_bytes)], dim=1)
    h = ops.allgather_async(packed, name, process_set)
    index_bytes = sparse_dim * 8

    def finish(op_, timeout):
        rows = ops.synchronize(h, timeout)
        total = rows.shape[0]
        idx = rows[:, :index_bytes].contiguous().reshape(-1).view(torch.int64)
        val = rows[:, index_bytes:].contiguous().reshape(-1).view(dtype)
        idx, val = idx.reshape(total, sparse_dim), val.reshape((total,) + dense_shape)
        if reduction == ops.Average:
            val = val / n if val.dtype.is_floating_point else torch.div(val, n,
                                                                          rounding_mode='trunc')
        return torch.sparse_coo_tensor(idx.t(), val, tensor.size())
    return _SparseHandle(h._op, None, finish)
