"""The array bridge: numpy and torch without copies, dtypes, and its errors."""

import numpy as np
import pytest

import pushpull
from pushpull._pushpull import _array_info

torch = pytest.importorskip('torch')

NUMPY_DTYPES = {
    np.float32: 'float32', np.float16: 'float16', np.float64: 'float64', np.int32: 'int32',
    np.int64: 'int64', np.int8: 'int8', np.uint8: 'uint8'
}
TORCH_DTYPES = {
    torch.float32: 'float32', torch.float16: 'float16', torch.bfloat16: 'bfloat16',
    torch.float64: 'float64', torch.int32: 'int32', torch.int64: 'int64', torch.int8: 'int8',
    torch.uint8: 'uint8'
}


@pytest.mark.parametrize('dtype', list(NUMPY_DTYPES))
def test_numpy_views_alias_the_array(dtype):
    a = np.zeros((3, 4, 5), dtype)
    name, shape, address = _array_info(a, True)
    assert (name, shape, address) == (NUMPY_DTYPES[dtype], (3, 4, 5), a.ctypes.data)


@pytest.mark.parametrize('dtype', list(TORCH_DTYPES))
def test_torch_views_alias_the_tensor(dtype):
    t = torch.zeros(6, 7, dtype=dtype)
    name, shape, address = _array_info(t, True)
    assert (name, shape, address) == (TORCH_DTYPES[dtype], (6, 7), t.data_ptr())


def test_offsets_of_contiguous_slices_are_kept():
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    assert _array_info(a[1:3])[2] == a.ctypes.data + 5 * 4
    t = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    assert _array_info(t[2:])[2] == t.data_ptr() + 10 * 4


def test_tensors_that_require_grad_are_viewed_through_detach():
    p = torch.nn.Parameter(torch.ones(3))
    assert _array_info(p, True)[2] == p.data_ptr()


def test_scalars_and_empty_arrays():
    assert _array_info(np.float32(2.5))[:2] == ('float32', ())
    assert _array_info(np.zeros((0, 3), np.float32))[:2] == ('float32', (0, 3))
    assert _array_info(torch.zeros(0))[:2] == ('float32', (0,))


def test_other_buffer_and_array_interface_objects():
    assert _array_info(bytearray(8), True)[:2] == ('uint8', (8,))

    class Interface:
        def __init__(self, a):
            self.a = a
            self.__array_interface__ = a.__array_interface__

    a = np.ones((2, 2), np.float64)
    assert _array_info(Interface(a), True) == ('float64', (2, 2), a.ctypes.data)
    with pytest.raises(pushpull.InvalidArgument, match='not contiguous'):
        _array_info(Interface(np.ones((2, 3)).T))


def test_pull_writes_into_numpy_and_torch_outputs_in_place(kv):
    kv.init(0, np.full((2, 3), 4.0, np.float32))
    a = np.zeros((2, 3), np.float32)
    t = torch.zeros(2, 3)
    before = (a.ctypes.data, t.data_ptr())
    kv.pull(0, out=[a, t])
    assert (a.ctypes.data, t.data_ptr()) == before
    assert (a == 4).all() and bool((t == 4).all())


@pytest.mark.parametrize('make', [
    lambda: np.zeros((4, 6), np.float32)[:, ::2],
    lambda: np.zeros((4, 6), np.float32).T,
    lambda: torch.zeros(4, 6).t(),
    lambda: torch.zeros(4, 6)[:, 1:3],
], ids=['numpy-strided', 'numpy-transposed', 'torch-transposed', 'torch-sliced'])
def test_non_contiguous_arrays_are_rejected(make):
    with pytest.raises(pushpull.InvalidArgument, match='not contiguous.*contiguous'):
        _array_info(make())


@pytest.mark.parametrize('make, name', [
    (lambda: np.zeros(3, np.complex64), 'complex64'),
    (lambda: np.zeros(3, bool), 'bool'),
    (lambda: np.zeros(3, np.uint32), 'uint32'),
    (lambda: np.zeros(3, '>f4'), '>f4'),
    (lambda: torch.zeros(3, dtype=torch.bool), 'torch.bool'),
    (lambda: torch.zeros(3, dtype=torch.int16), 'torch.int16'),
    (lambda: torch.zeros(3, dtype=torch.complex64), 'torch.complex64'),
])
def test_unsupported_dtypes_are_named(make, name):
    with pytest.raises(pushpull.InvalidArgument) as e:
        _array_info(make())
    assert 'unsupported dtype ' + name in str(e.value)
    assert 'float32, float16, bfloat16' in str(e.value)


def test_read_only_outputs_are_rejected(kv):
    kv.init(1, np.zeros(3, np.float32))
    ro = np.zeros(3, np.float32)
    ro.setflags(write=False)
    _array_info(ro, False)  # reading is fine (push, init)
    kv.push(1, ro)
    with pytest.raises(pushpull.InvalidArgument, match='read-only'):
        kv.pull(1, out=ro)


def test_gpu_tensors_are_rejected_with_a_hint():

    class FakeCuda:  # what a CUDA tensor reports, without needing a GPU

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, stream=None):
            raise AssertionError('must not be exported')

    with pytest.raises(pushpull.InvalidArgument,
                       match=r'CUDA tensors are not supported yet; call \.cpu\(\)'):
        _array_info(FakeCuda())

    class CudaArrayInterface:
        __cuda_array_interface__ = {}

    with pytest.raises(pushpull.InvalidArgument, match='CUDA tensors are not supported yet'):
        _array_info(CudaArrayInterface())


def test_non_arrays_are_rejected():
    for bad in (None, [1.0, 2.0], 3.0, 'text'):
        with pytest.raises(pushpull.InvalidArgument, match='expected a numpy array or torch'):
            _array_info(bad)


def test_too_many_dimensions():
    with pytest.raises(pushpull.InvalidArgument, match='9 dimensions; pushpull arrays have at '
                       'most 8'):
        _array_info(np.zeros((1,) * 9, np.float32))


def test_async_handles_keep_arrays_alive(kv):
    import gc
    import weakref
    kv.init(5, np.ones(1000, np.float32))

    class Owned(np.ndarray):
        pass

    base = np.zeros(1000, np.float32)
    out = base.view(Owned)  # a separate object aliasing `base`
    ref = weakref.ref(out)
    handle = kv.pull_async(5, out=out)
    del out
    gc.collect()
    assert ref() is not None  # the handle holds it until done
    handle.wait()
    assert (base == 1).all()
    gc.collect()
    assert ref() is None  # released once waited for
