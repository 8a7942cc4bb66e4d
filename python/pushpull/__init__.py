"""pushpull: data-parallel training with MXNet's KVStore and Horovod's API.

    import pushpull
    kv = pushpull.kv.create('local')          # or 'dist_sync' under `pushpull launch`
    kv.init('w', numpy.zeros((2, 3), numpy.float32))

Modules: ``pushpull.kv`` (MXNet's KVStore API), ``pushpull.optimizer``
(optimizer specs for KVStore.set_optimizer), ``pushpull.timeline`` (your own
spans on the timeline), ``pushpull.torch`` (Horovod's
PyTorch API; imported on demand because it imports torch), ``pushpull.launch``
(``python3 -m pushpull.launch`` = ``pushpull launch``).

Arrays: any numpy array or CPU torch tensor (C-contiguous; float32, float16,
bfloat16, float64, int32, int64, int8, uint8). pushpull reads and writes their
memory in place, never copying them at the boundary. Errors are
``pushpull.Error`` subclasses (see docs/python.md).
"""

from ._pushpull import (AlreadyExists, Error, Internal, InvalidArgument, IoError, NotFound,
                        PeerFailure, ProtocolError, Timeout, __version__, build_info)
from . import kv, optimizer, timeline

__all__ = [
    'AlreadyExists', 'Error', 'Internal', 'InvalidArgument', 'IoError', 'NotFound', 'PeerFailure',
    'ProtocolError', 'Timeout', '__version__', 'build_info', 'kv', 'optimizer', 'timeline'
]
