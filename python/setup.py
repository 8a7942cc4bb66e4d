"""The extension build of the `pushpull` Python package (metadata, the
`pushpull` console script and the build backend are in pyproject.toml).
pip install, offline, with Debian's setuptools and pybind11 headers (no PyPI
access needed):

    python3 -m venv --system-site-packages /tmp/pp-venv          # Debian's numpy/torch visible
    /tmp/pp-venv/bin/pip install --no-build-isolation ./python   # from the repository root

--no-build-isolation keeps pip from fetching setuptools/wheel from PyPI; the
venv is needed because Debian marks its own Python as externally managed
(PEP 668; or use `pip install --user --break-system-packages ...`).

The extension is compiled from python/src/*.cpp and linked against the static
pushpull libraries of a CMake build: $PUSHPULL_BUILD_DIR when set, else
<repo>/build when it has them, else this setup runs CMake itself (targets
pushpull_kvstore, pushpull_collective, pushpull_cli only) in a temporary
build folder. The `pushpull` CLI is installed inside the package
(pushpull/bin/pushpull) so `python3 -m pushpull.launch` works.

When torch imports in the installing interpreter (Debian's python3-torch
with libtorch-dev, or a pip torch), a second extension is built too:
`pushpull._pushpull_torch_pg`, the torch.distributed backend "pushpull"
(integrations/torch/process_group/, pushpull.torch.distributed), compiled
against that torch's headers and libraries so it matches the torch it runs
with. PUSHPULL_TORCH_PG=0 skips it (numpy-only installs never need it; the
plain extension `_pushpull` never links libtorch).
"""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# Link order: a static library before the ones it uses.
TORCH_PG_DIR = os.path.join(REPO, 'integrations', 'torch', 'process_group')
LAYERS = ['frontend', 'kvstore', 'ps', 'collective', 'compress', 'optim', 'cluster', 'transport', 'base']
CMAKE_TARGETS = ['pushpull_frontend', 'pushpull_kvstore', 'pushpull_collective', 'pushpull_cli']


def version():
    with open(os.path.join(REPO, 'CMakeLists.txt')) as f:
        for line in f:
            if line.startswith('project(pushpull VERSION'):
                return line.split()[2]
    return '0.0.0'


def has_libs(build_dir):
    return all(os.path.exists(os.path.join(build_dir, 'lib', f'libpushpull_{l}.a')) for l in LAYERS)


class BuildExt(build_ext):
    """Finds (or makes) the CMake build, then compiles and links the extension."""

    def cmake_build_dir(self):
        explicit = os.environ.get('PUSHPULL_BUILD_DIR')
        if explicit:
            if not has_libs(explicit):
                sys.exit(f'setup.py: PUSHPULL_BUILD_DIR={explicit} lacks lib/libpushpull_*.a; build '
                         f'it first: cmake --build {explicit} --target {" ".join(CMAKE_TARGETS)}')
            return os.path.abspath(explicit)
        default = os.path.join(REPO, 'build')
        if has_libs(default) and os.path.exists(os.path.join(default, 'bin', 'pushpull')):
            return default
        build_dir = os.path.abspath(os.path.join(self.build_temp, 'cmake'))
        cmake = shutil.which('cmake')
        if cmake is None:
            sys.exit('setup.py: no pushpull CMake build found and cmake is not installed; run '
                     '`make build` (or set PUSHPULL_BUILD_DIR) first')
        generator = ['-G', 'Ninja'] if shutil.which('ninja') else []
        subprocess.check_call([
            cmake, '-S', REPO, '-B', build_dir, *generator, '-DCMAKE_BUILD_TYPE=Release',
            '-DPUSHPULL_BUILD_TESTS=OFF', '-DPUSHPULL_BUILD_EXAMPLES=OFF',
            '-DPUSHPULL_BUILD_BENCHMARKS=OFF', '-DPUSHPULL_BUILD_TORCH=OFF',
            '-DPUSHPULL_BUILD_PYTHON=OFF'
        ])
        subprocess.check_call([cmake, '--build', build_dir, '-j', str(os.cpu_count() or 2),
                               '--target', *CMAKE_TARGETS])
        return build_dir

    def build_extensions(self):
        build_dir = self.cmake_build_dir()
        for ext in self.extensions:
            if ext.name == 'pushpull._pushpull_torch_pg':
                ext.sources = sorted(glob.glob(os.path.join(TORCH_PG_DIR, '*.cpp')))
            ext.include_dirs += [os.path.join(build_dir, 'generated')]
            ext.extra_objects = [os.path.join(build_dir, 'lib', f'libpushpull_{l}.a')
                                 for l in LAYERS]
            # setuptools relinks only when a source or a dependency is newer
            # than the extension: the static libraries must count, or a stale
            # in-tree python/build/ keeps an extension linked against old code.
            ext.depends = ext.depends + ext.extra_objects
        # Build warnings from -Wstrict-prototypes etc. are C-only: drop them for C++.
        if '-Wstrict-prototypes' in self.compiler.compiler_so:
            self.compiler.compiler_so.remove('-Wstrict-prototypes')
        super().build_extensions()
        # The CLI for `python3 -m pushpull.launch`, inside the package.
        cli = os.path.join(build_dir, 'bin', 'pushpull')
        if os.path.exists(cli):
            target = os.path.join(self.build_lib, 'pushpull', 'bin', 'pushpull')
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(cli, target)


def torch_pg_extension():
    """The torch.distributed backend's extension, or None when torch does not
    import here (or PUSHPULL_TORCH_PG=0)."""
    if os.environ.get('PUSHPULL_TORCH_PG', '1') == '0':
        return None
    try:
        import torch  # noqa: F401
        from torch.utils import cpp_extension
    except Exception as e:  # ImportError, or a broken torch install
        print(f'setup.py: torch does not import ({e}); building without the torch.distributed '
              f'backend (pushpull._pushpull_torch_pg)', file=sys.stderr)
        return None
    lib_dirs = cpp_extension.library_paths()
    return Extension(
        'pushpull._pushpull_torch_pg',
        # Set by BuildExt: setuptools refuses sources outside this directory
        # as setup() arguments (they are in the repository, next to python/).
        sources=[],
        # src/: meet.cpp wraps torch's c10d store as the group's Store (collective/store.h).
        include_dirs=[os.path.join(REPO, 'include'), TORCH_PG_DIR,
                      os.path.join(REPO, 'integrations', 'torch', 'src'), os.path.join(REPO, 'src'),
                      sysconfig.get_paths()['include'], *cpp_extension.include_paths()],
        # The ABI of the torch it is built for (checked again at import).
        define_macros=[('_GLIBCXX_USE_CXX11_ABI', str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))],
        extra_compile_args=['-std=c++20', '-fvisibility=hidden', '-O2'],
        library_dirs=lib_dirs,
        runtime_library_dirs=lib_dirs,  # a pip torch keeps libtorch in site-packages
        libraries=['torch_python', 'torch', 'torch_cpu', 'c10', 'fmt', 'ssl', 'crypto', 'pthread'],
        language='c++',
    )


extension = Extension(
    'pushpull._pushpull',
    sources=sorted(glob.glob(os.path.join('src', '*.cpp'))),
    include_dirs=[os.path.join(REPO, 'include'), os.path.join(HERE, 'src'),
                  sysconfig.get_paths()['include']],
    define_macros=[('PUSHPULL_PYTHON_COLLECTIVE', '1')]
    if os.path.exists(os.path.join(HERE, 'src', 'collective_bindings.cpp')) else [],
    extra_compile_args=['-std=c++20', '-fvisibility=hidden', '-O2'],
    libraries=['fmt', 'ssl', 'crypto', 'pthread'],
    language='c++',
)

# Name, description, dependencies and the console script: pyproject.toml.
setup(
    version=version(),
    packages=['pushpull'] + [f'pushpull.{p}' for p in ('torch',)
                             if os.path.isdir(os.path.join(HERE, 'pushpull', p))],
    ext_modules=[e for e in (extension, torch_pg_extension()) if e is not None],
    cmdclass={'build_ext': BuildExt},
)
