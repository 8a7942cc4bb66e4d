"""python3 -m pushpull.launch: finding the binary and forwarding arguments."""

import os
import subprocess
import sys

import pytest

from conftest import job_env, pushpull_binary
from pushpull import launch


def test_pushpull_bin_wins_and_may_name_a_folder(monkeypatch):
    binary = pushpull_binary()
    monkeypatch.setenv('PUSHPULL_BIN', binary)
    assert launch.find_binary() == binary
    monkeypatch.setenv('PUSHPULL_BIN', os.path.dirname(binary))
    assert launch.find_binary() == os.path.join(os.path.dirname(binary), 'pushpull')


def test_a_bad_pushpull_bin_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv('PUSHPULL_BIN', str(tmp_path / 'missing'))
    with pytest.raises(FileNotFoundError, match='PUSHPULL_BIN='):
        launch.find_binary()


def test_build_tree_binary_is_found_next_to_the_package(monkeypatch):
    monkeypatch.delenv('PUSHPULL_BIN', raising=False)
    found = launch.find_binary()
    assert os.path.basename(found) == 'pushpull' and os.access(found, os.X_OK)


def test_module_forwards_the_arguments_and_exit_status():
    env = job_env({'PUSHPULL_BIN': pushpull_binary()})
    dry = subprocess.run([sys.executable, '-m', 'pushpull.launch', '--dry-run', '-n', '2', '-s',
                          '1', 'myprog', '--flag'], env=env, capture_output=True, text=True,
                         timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert '2 workers, 1 servers' in dry.stdout and 'myprog --flag' in dry.stdout
    bad = subprocess.run([sys.executable, '-m', 'pushpull.launch', '-n', '0', 'prog'], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2  # the launcher's own bad-input status
