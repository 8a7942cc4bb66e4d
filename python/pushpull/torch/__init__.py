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
import os

from pushpull._pushpull import InvalidArgument, PeerFailure
from pushpull._pushpull import collective as _c

from .alltoall import alltoall, alltoall_async
from .compression import (Compression, Compressor, FP16Compressor, NoneCompressor,
                          OneBitCompressor, TwoBitCompressor)
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .grouped import (grouped_allgather, grouped_allgather_async, grouped_allreduce,
                      grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                      grouped_reducescatter, grouped_reducescatter_async)
from .ops import (Adasum, Average, Handle, Max, Min, Product, Sum, allgather, allgather_async,
                  allreduce, allreduce_, allreduce_async, allreduce_async_, barrier, broadcast,
                  broadcast_, broadcast_async, broadcast_async_, join, poll, synchronize)
from .optimizer import DistributedOptimizer
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .reducescatter import reducescatter, reducescatter_async
from .sparse import sparse_allreduce_async

# Horovod's exception names. HorovodInternalError is what a collective raises
# when a peer failed (Horovod's elastic mode catches it): pushpull's
# PeerFailure. Every pushpull error is a pushpull.Error (a RuntimeError).
HorovodInternalError = PeerFailure


def init(comm=None, process_sets=None):
    """Joins the workers' group, found from the environment (blocks until every
    rank arrived, at most the startup timeout). A second call does nothing.
    ``process_sets``: a list of ProcessSets (or rank lists) to register, or
    "dynamic" (accepted; sets may always be added later here)."""
    if comm is not None:
        raise InvalidArgument(
            'pushpull.torch.init(): comm= (an MPI communicator) is not supported; the group is '
            'every worker of the job (use process sets for subsets)')
    _c.init()
    # Leave the group while the interpreter still works (as Horovod does),
    # rather than from the C++ static destructors after it finalised.
    atexit.unregister(_c.shutdown)
    atexit.register(_c.shutdown)
    if _c.mode() == 'elastic':
        _mirror_round_environment()
    if process_sets is not None and process_sets != 'dynamic':
        for ps in process_sets:
            add_process_set(ps)


def _mirror_round_environment():
    """An elastic round's ranks, which the C++ bootstrap has set in the process
    environment (setenv, before the round's threads start), into os.environ:
    Python copied the environment at start-up (docs/elastic.md, "Ranks in the
    environment")."""
    for name, value in _c.rank_environment():
        if os.environ.get(name) != value:
            os.environ[name] = value


def shutdown():
    """Leaves the group (local; peers with pending ops see PeerFailure)."""
    from .process_sets import _reset
    from . import ops
    _reset()
    with ops._dropped_lock:
        ops._dropped.clear()
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


# Build facts Horovod scripts check: pushpull has its own TCP engine (no MPI,
# Gloo, NCCL, oneCCL, DDL) and runs CPU tensors (no CUDA, ROCm).
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


def ddl_built():
    return False


def ccl_built():
    return False


def sycl_built():
    """Intel's Horovod fork (intel-optimization-for-horovod) asks whether
    oneCCL runs on SYCL (XPU) devices: pushpull runs CPU tensors."""
    return False


def cuda_built():
    return False


def rocm_built():
    return False


class SyncBatchNorm:
    """Horovod's SyncBatchNorm needs CUDA tensors (its statistics kernels are
    GPU-only); pushpull runs CPU tensors, so constructing one is refused."""

    def __init__(self, *args, **kwargs):
        raise InvalidArgument(
            'pushpull.torch.SyncBatchNorm: not supported (Horovod\'s needs CUDA tensors; '
            'pushpull runs CPU tensors); use torch.nn.BatchNorm*d, whose statistics stay local')


def start_timeline(file_path, mark_cycles=False):
    """Horovod starts its timeline at run time; pushpull's is set before the
    job starts (PUSHPULL_TIMELINE or HOROVOD_TIMELINE, docs/timeline.md)."""
    raise InvalidArgument(
        'pushpull.torch.start_timeline(): not supported at run time; set PUSHPULL_TIMELINE '
        '(or HOROVOD_TIMELINE) to a file path when starting the job')


def stop_timeline():
    raise InvalidArgument(
        'pushpull.torch.stop_timeline(): not supported at run time; the timeline set by '
        'PUSHPULL_TIMELINE ends with the job')


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
    'grouped_allreduce', 'grouped_allreduce_', 'grouped_allreduce_async',
    'grouped_allreduce_async_', 'allgather', 'allgather_async', 'grouped_allgather',
    'grouped_allgather_async', 'broadcast', 'broadcast_', 'broadcast_async', 'broadcast_async_',
    'reducescatter', 'reducescatter_async', 'grouped_reducescatter',
    'grouped_reducescatter_async', 'alltoall', 'alltoall_async', 'sparse_allreduce_async',
    'barrier', 'join', 'poll', 'synchronize', 'broadcast_parameters',
    'broadcast_optimizer_state', 'broadcast_object', 'allgather_object', 'DistributedOptimizer',
    'Compression', 'Compressor', 'NoneCompressor', 'FP16Compressor', 'OneBitCompressor',
    'TwoBitCompressor', 'Trainer', 'ProcessSet',
    'add_process_set', 'remove_process_set', 'global_process_set', 'HorovodInternalError',
    'mpi_threads_supported', 'mpi_enabled', 'mpi_built', 'gloo_enabled', 'gloo_built',
    'nccl_built', 'ddl_built', 'ccl_built', 'sycl_built', 'cuda_built', 'rocm_built',
    'start_timeline', 'stop_timeline', 'elastic', 'SyncBatchNorm',
]
