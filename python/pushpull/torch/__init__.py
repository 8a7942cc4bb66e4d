"""pushpull.torch: Horovod's PyTorch API over pushpull's collectives engine.

    import pushpull.torch as hvd     # was: import horovod.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Run under ``pushpull launch -n N -s 0 python3 train.py`` (or torchrun, mpirun
with MASTER_ADDR/MASTER_PORT, srun; see docs/collectives.md "Bootstrap").
CPU tensors only for now. ``pushpull.torch.Trainer`` is the parameter-server
(KVStore) trainer. See docs/python.md.
"""

import atexit

from pushpull._pushpull import collective as _c

from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .ops import (Adasum, Average, Handle, Max, Min, Product, Sum, allgather, allgather_async,
                  allreduce, allreduce_, allreduce_async, allreduce_async_, barrier, broadcast,
                  broadcast_, broadcast_async, broadcast_async_, grouped_allreduce, join, poll,
                  reducescatter, synchronize)
from .optimizer import DistributedOptimizer


def init(comm=None, process_sets=None):
    """Joins the workers' group, found from the environment (blocks until every
    rank arrived, at most the startup timeout). A second call does nothing."""
    if comm is not None or process_sets is not None:
        from pushpull._pushpull import InvalidArgument
        raise InvalidArgument(
            'pushpull.torch.init(): comm= and process_sets= are not supported; the group is '
            'every worker of the job')
    _c.init()
    # Leave the group while the interpreter still works (as Horovod does),
    # rather than from the C++ static destructors after it finalised.
    atexit.unregister(_c.shutdown)
    atexit.register(_c.shutdown)


def shutdown():
    """Leaves the group (local; peers with pending ops see PeerFailure)."""
    _c.shutdown()


def is_initialized():
    return _c.is_initialized()


def size():
    """Number of ranks."""
    return _c.size()


def rank():
    """This process's rank, 0..size()-1."""
    return _c.rank()


def local_rank():
    """Rank among the ranks on this host."""
    return _c.local_rank()


def local_size():
    """Number of ranks on this host."""
    return _c.local_size()


def cross_size():
    """Number of hosts, assuming the same number of ranks on each (as Horovod's
    homogeneous case)."""
    return max(1, _c.size() // max(1, _c.local_size()))


def cross_rank():
    """This host's index, assuming the same number of ranks on each host."""
    return _c.rank() // max(1, _c.local_size())


def is_homogeneous():
    return _c.size() % max(1, _c.local_size()) == 0


# Build facts Horovod scripts sometimes check: no MPI, NCCL, Gloo or CUDA here
# (pushpull's own TCP engine; CPU tensors).
def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return 0


def cuda_built():
    return False


def rocm_built():
    return False


def __getattr__(name):
    # The parameter-server trainer imports pushpull.kv; load it on first use.
    if name == 'Trainer':
        from .trainer import Trainer
        return Trainer
    if name == 'elastic':  # hvd.elastic.run, hvd.elastic.TorchState (docs/elastic.md)
        import importlib
        return importlib.import_module('.elastic', __name__)
    raise AttributeError("module 'pushpull.torch' has no attribute %r" % name)


__all__ = [
    'init', 'shutdown', 'is_initialized', 'size', 'rank', 'local_rank', 'local_size',
    'cross_rank', 'cross_size', 'is_homogeneous', 'Average', 'Sum', 'Min', 'Max', 'Product',
    'Adasum', 'Handle', 'allreduce', 'allreduce_', 'allreduce_async', 'allreduce_async_',
    'grouped_allreduce', 'allgather', 'allgather_async', 'broadcast', 'broadcast_',
    'broadcast_async', 'broadcast_async_', 'reducescatter', 'barrier', 'join', 'poll',
    'synchronize', 'broadcast_parameters', 'broadcast_optimizer_state', 'broadcast_object',
    'allgather_object', 'DistributedOptimizer', 'Compression', 'Compressor', 'NoneCompressor',
    'FP16Compressor', 'Trainer', 'elastic', 'mpi_threads_supported', 'mpi_enabled', 'mpi_built',
    'gloo_enabled', 'gloo_built', 'nccl_built', 'cuda_built', 'rocm_built',
]
