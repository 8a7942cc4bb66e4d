"""pushpull.torch.distributed: the torch.distributed backend ``pushpull``.

    import pushpull.torch.distributed            # registers the backend
    torch.distributed.init_process_group('pushpull')   # was: 'gloo'
    model = torch.nn.parallel.DistributedDataParallel(model)

Importing this module registers ``pushpull`` with
``torch.distributed.Backend.register_backend``; ``init_process_group`` then
runs DDP and the ``torch.distributed`` calls on pushpull's collectives engine
(its transports, algorithms, fusion, authentication and failure detection).
Start the processes with ``pushpull launch -n N -s 0`` or torchrun (env://);
the job secret comes from the launcher's environment (PUSHPULL_JOB_SECRET), or
under torchrun from the per-user secret file (~/.config/pushpull/secret), as
for every pushpull job (docs/security.md). CPU tensors only. See docs/python.md, "Using pushpull
from DDP".

The backend is a second extension, ``pushpull._pushpull_torch_pg``, linked
against the libtorch it was built with; this module checks at import that
the running torch is that one (version, C++ ABI, pybind11 ABI, one libtorch
loaded) and says so clearly otherwise.
"""

import atexit
import os
import weakref

import torch
import torch.distributed as dist

BACKEND = 'pushpull'

__all__ = ['BACKEND', 'ProcessGroupPushpull', 'is_registered']


def _torch_version():
    parts = []
    for p in torch.__version__.split('+')[0].split('.')[:3]:
        digits = ''
        for ch in p:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def _loaded_libtorch_paths():
    """Distinct real paths of every libtorch_cpu mapped into this process."""
    paths = set()
    try:
        with open('/proc/self/maps') as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and os.path.basename(fields[5]).startswith('libtorch_cpu.'):
                    paths.add(os.path.realpath(fields[5]))
    except OSError:
        pass
    return paths


def _abi_problem(ext):
    """Why `ext` does not fit the running torch, or None."""
    built = tuple(ext.torch_version)
    running = _torch_version()
    if built != running:
        return (f'it was built against libtorch {".".join(map(str, built))} but torch '
                f'{torch.__version__} is running')
    if bool(ext.cxx11_abi) != bool(torch._C._GLIBCXX_USE_CXX11_ABI):
        return (f'it was built with _GLIBCXX_USE_CXX11_ABI={int(ext.cxx11_abi)} but torch uses '
                f'{int(torch._C._GLIBCXX_USE_CXX11_ABI)}')
    theirs = tuple(
        getattr(torch._C, name, None)
        for name in ('_PYBIND11_COMPILER_TYPE', '_PYBIND11_STDLIB', '_PYBIND11_BUILD_ABI'))
    if None not in theirs and tuple(ext.pybind11_abi) != theirs:
        return f'its pybind11 ABI {tuple(ext.pybind11_abi)} differs from torch\'s {theirs}'
    libs = _loaded_libtorch_paths()
    if len(libs) > 1:
        return f'two different libtorch libraries are loaded: {sorted(libs)}'
    return None


def _rebuild_hint():
    return ('Rebuild pushpull against the torch you run (cmake -DPUSHPULL_BUILD_PYTHON=ON '
            '-DPUSHPULL_BUILD_TORCH=ON with that torch\'s libtorch; Debian: libtorch-dev for '
            'python3-torch), or use the gloo backend.')


try:
    from pushpull import _pushpull_torch_pg as _ext
except ImportError as e:
    raise ImportError(
        f'pushpull.torch.distributed: the extension pushpull._pushpull_torch_pg cannot be loaded '
        f'with torch {torch.__version__} ({e}). It is built only when CMake finds libtorch '
        f'(-DPUSHPULL_BUILD_TORCH=ON) and works only with the torch it was built against. '
        f'{_rebuild_hint()}') from e

_problem = _abi_problem(_ext)
if _problem is not None:
    raise ImportError(f'pushpull.torch.distributed: pushpull._pushpull_torch_pg does not match '
                      f'the running torch: {_problem}. {_rebuild_hint()}')

ProcessGroupPushpull = _ext.ProcessGroupPushpull

# Every group made here, to leave them in order at exit (while the interpreter
# still works) rather than from C++ static destructors after it finalised.
_groups = weakref.WeakSet()


def _create(store, rank, world_size, timeout):
    pg = ProcessGroupPushpull.create(store, rank, world_size, timeout)
    _groups.add(pg)
    return pg


def _shutdown_all():
    for pg in list(_groups):
        pg.shutdown()


def is_registered():
    """True once the backend is known to torch.distributed."""
    return BACKEND.upper() in dist.Backend._plugins


if not is_registered():
    dist.Backend.register_backend(BACKEND, _create)
    atexit.register(_shutdown_all)
