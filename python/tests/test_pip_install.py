"""`pip install --no-build-isolation ./python` into a fresh venv, offline,
then the `pushpull` console script it puts on the venv's PATH: --version,
and `pushpull launch` running the venv's Python, which imports the installed
package (not the build tree's).

Skips (visibly) when a venv with pip cannot be made here (python3-venv
missing). The extension links the static libraries of the build under test
(PUSHPULL_BUILD_DIR, from PUSHPULL_BIN_DIR's parent), so nothing else is
compiled but the extension itself.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, pushpull_binary

PIP_TIMEOUT = 1200  # compiling the extension on a loaded 2-core machine


def cmake_version():
    with open(os.path.join(REPO, 'CMakeLists.txt')) as f:
        return re.search(r'project\(pushpull VERSION ([0-9.]+)', f.read()).group(1)


@pytest.fixture(scope='module')
def venv(tmp_path_factory):
    root = tmp_path_factory.mktemp('pip') / 'venv'
    made = subprocess.run(['/usr/bin/python3', '-m', 'venv', '--system-site-packages', str(root)],
                          capture_output=True, text=True, timeout=300)
    if made.returncode != 0 or not (root / 'bin' / 'pip').exists():
        pytest.skip(f'cannot create a venv with pip offline (python3-venv?): {made.stderr.strip()}')
    env = dict(os.environ)
    env.pop('PYTHONPATH', None)  # the installed package, not build/python
    env['PUSHPULL_BUILD_DIR'] = os.path.dirname(os.path.dirname(pushpull_binary()))
    env['PIP_NO_INDEX'] = '1'  # offline: never ask PyPI
    env['PIP_DISABLE_PIP_VERSION_CHECK'] = '1'
    if 'CC' not in env and subprocess.run(['which', 'ccache'], capture_output=True).returncode == 0:
        env['CC'] = 'ccache x86_64-linux-gnu-gcc'
    install = subprocess.run([str(root / 'bin' / 'pip'), 'install', '--no-build-isolation',
                              os.path.join(REPO, 'python')],
                             env=env, capture_output=True, text=True, timeout=PIP_TIMEOUT,
                             cwd=str(root.parent))
    assert install.returncode == 0, install.stdout[-4000:] + install.stderr[-4000:]
    env['PATH'] = str(root / 'bin') + os.pathsep + env['PATH']
    env.pop('PUSHPULL_BIN', None)
    env.pop('PUSHPULL_BIN_DIR', None)
    return root, env


def test_console_script_runs_the_bundled_cli(venv):
    root, env = venv
    script = root / 'bin' / 'pushpull'
    assert script.exists(), 'pip installed no pushpull console script'
    out = subprocess.run(['pushpull', '--version'], env=env, capture_output=True, text=True,
                         timeout=60, cwd=str(root))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f'pushpull {cmake_version()}'


def test_package_version_is_the_cmake_version(venv):
    root, env = venv
    out = subprocess.run([str(root / 'bin' / 'python'), '-c',
                          'import pushpull, importlib.metadata as m; '
                          'print(pushpull.__file__); print(m.version("pushpull")); '
                          'print(pushpull.__version__)'],
                         env=env, capture_output=True, text=True, timeout=60, cwd=str(root))
    assert out.returncode == 0, out.stderr
    path, dist_version, module_version = out.stdout.split()
    assert path.startswith(str(root)), f'imported {path}, not the installed package'
    assert dist_version == cmake_version() == module_version


def test_console_script_launches_a_job(venv):
    root, env = venv
    program = ('import os, pushpull.kv as kv; s = kv.create("dist_sync"); '
               'print("rank", s.rank, "of", s.num_workers)')
    job = subprocess.run(['pushpull', 'launch', '-n', '2', '-s', '1', '--timeout', '120',
                          str(root / 'bin' / 'python'), '-c', program],
                         env=env, capture_output=True, text=True, timeout=300, cwd=str(root))
    assert job.returncode == 0, job.stdout + job.stderr
    assert '[worker 0] rank 0 of 2' in job.stdout and '[worker 1] rank 1 of 2' in job.stdout


def torch_imports():
    return subprocess.run(['/usr/bin/python3', '-c', 'import torch'], capture_output=True,
                          timeout=120).returncode == 0


def test_torch_backend_is_installed_and_reduces(venv):
    """With torch importable, pip builds the torch.distributed backend too
    (pushpull._pushpull_torch_pg); a 2-rank job of the installed package
    allreduces through it."""
    if not torch_imports():
        pytest.skip('torch does not import for /usr/bin/python3: setup.py builds only the plain '
                    'extension (the torch.distributed backend needs torch)')
    root, env = venv
    program = ('import torch, torch.distributed as dist, pushpull.torch.distributed as ppd; '
               'print("ext", ppd._ext.__file__); '
               'dist.init_process_group("pushpull"); '
               't = torch.full((5,), float(dist.get_rank() + 1)); dist.all_reduce(t); '
               'print("sum", t.tolist()); dist.destroy_process_group()')
    job = subprocess.run(['pushpull', 'launch', '-n', '2', '-s', '0', '--timeout', '120',
                          str(root / 'bin' / 'python'), '-c', program],
                         env=env, capture_output=True, text=True, timeout=300, cwd=str(root))
    assert job.returncode == 0, job.stdout + job.stderr
    assert f'ext {root}' in job.stdout, f'not the installed extension: {job.stdout}'
    assert job.stdout.count('sum [3.0, 3.0, 3.0, 3.0, 3.0]') == 2, job.stdout
