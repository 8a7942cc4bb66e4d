"""``python3 -m pushpull.launch [OPTIONS] COMMAND ...`` = ``pushpull launch ...``.

Forwards every argument to the ``pushpull launch`` binary (docs/launch.md),
replacing this process. The binary is, in this order: ``$PUSHPULL_BIN``; the
one installed inside the package (``pushpull/bin/pushpull``, pip installs);
the build tree's (``build/bin/pushpull`` next to ``build/python/pushpull``);
``pushpull`` on ``PATH``.
"""

import os
import shutil
import sys

__all__ = ['find_binary', 'main']


def _is_elf(path):
    try:
        with open(path, 'rb') as f:
            return f.read(4) == b'\x7fELF'
    except OSError:
        return False


def find_binary():
    """Path of the ``pushpull`` binary; raises FileNotFoundError naming the
    places searched when there is none."""
    here = os.path.dirname(os.path.abspath(__file__))
    searched = []
    explicit = os.environ.get('PUSHPULL_BIN')
    if explicit:
        if os.path.isdir(explicit):
            explicit = os.path.join(explicit, 'pushpull')
        if os.access(explicit, os.X_OK) and os.path.isfile(explicit):
            return explicit
        raise FileNotFoundError(f'PUSHPULL_BIN={os.environ["PUSHPULL_BIN"]} is not an '
                                f'executable pushpull binary (or a folder holding one)')
    for candidate in (os.path.join(here, 'bin', 'pushpull'),
                      os.path.join(here, os.pardir, os.pardir, 'bin', 'pushpull')):
        candidate = os.path.normpath(candidate)
        searched.append(candidate)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    # On PATH, only a real binary: the `pushpull` console script (pushpull.cli)
    # is a Python file, and running it from here would loop.
    on_path = shutil.which('pushpull')
    if on_path and _is_elf(on_path):
        return on_path
    raise FileNotFoundError(
        'cannot find the pushpull binary: searched ' + ', '.join(searched) +
        ' and PATH; build it (ninja -C build pushpull_cli) or set PUSHPULL_BIN=/path/to/pushpull')


def main(argv=None):
    """Execs ``pushpull launch *argv`` (never returns on success)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        binary = find_binary()
    except FileNotFoundError as e:
        print(f'pushpull.launch: {e}', file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, [binary, 'launch'] + args)
    return 0  # not reached


if __name__ == '__main__':
    sys.exit(main())
