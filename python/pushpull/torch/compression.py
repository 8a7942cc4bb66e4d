"""Gradient compression for DistributedOptimizer / allreduce (Horovod's Compression).

``Compression.none`` and ``Compression.fp16`` are Horovod's (compress, allreduce,
decompress). ``Compression.twobit`` / ``Compression.onebit`` are pushpull's
(MXNet's codecs with error feedback, the C++ kernels of the KVStores): codes
cannot be added on the way round a ring, so DistributedOptimizer allgathers
every rank's codes and each rank sums them in rank order (docs/python.md,
docs/collectives.md "Gradient compression").
"""

import torch

from pushpull._pushpull import GradientCompressor, InvalidArgument


class Compressor:
    """compress(tensor) -> (tensor to send, context); decompress(tensor, context) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (the engine sums them in float32)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class GatheredCompressor:
    """1bit/2bit for DistributedOptimizer: each rank's gradient plus its
    residual is encoded, the codes are allgathered and every rank sums them
    (the C++ GradientReducer does all of it, keeping one residual per
    parameter, so use one instance per optimizer). Pass the class (threshold
    0.5) or an instance: ``Compression.onebit(threshold=0.25)``. Every rank
    must use the same type and threshold (else InvalidArgument from
    synchronize() on every rank)."""
    gathers = True
    type = None  # '2bit' or '1bit' in the subclasses

    def __init__(self, threshold=0.5):
        self.threshold = float(threshold)
        # Checks the threshold now (InvalidArgument), with the stores' parser.
        self._codec = GradientCompressor({'type': self.type, 'threshold': repr(self.threshold)})

    def describe(self):
        return self._codec.describe()

    @staticmethod
    def compress(tensor):
        raise InvalidArgument('1bit/2bit compression needs an allgather of codes with a residual '
                              'per tensor: use it through DistributedOptimizer(compression=...)')

    decompress = compress


class TwoBitCompressor(GatheredCompressor):
    """MXNet's 2bit: {-t, 0, +t} (threshold t > 0) with error feedback."""
    type = '2bit'


class OneBitCompressor(GatheredCompressor):
    """MXNet 1.x's 1bit: +1 where the value with its residual is above t,
    else -1 (so scale gradients or the learning rate to suit)."""
    type = '1bit'


class Compression:
    """``Compression.none`` / ``Compression.fp16``, as in horovod.torch; and
    pushpull's ``Compression.twobit`` / ``Compression.onebit``."""
    none = NoneCompressor
    fp16 = FP16Compressor
    twobit = TwoBitCompressor
    onebit = OneBitCompressor
