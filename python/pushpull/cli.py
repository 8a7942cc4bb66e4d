"""The ``pushpull`` console script (``pip install ./python`` puts it on PATH).

``pushpull ARGS...`` runs the bundled ``pushpull`` CLI with the same
arguments (``pushpull launch ...``, ``pushpull info``, ``pushpull bench ...``;
docs/launch.md), replacing this process, so signals and the exit status are
the CLI's own. The binary is found as for ``python3 -m pushpull.launch``
(:func:`pushpull.launch.find_binary`).
"""

import os
import sys

from .launch import find_binary

__all__ = ['main']


def main(argv=None):
    """Execs the ``pushpull`` binary with ``argv`` (default ``sys.argv[1:]``);
    returns 2 when there is no binary."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        binary = find_binary()
    except FileNotFoundError as e:
        print(f'pushpull: {e}', file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, [binary] + args)
    return 0  # not reached


if __name__ == '__main__':
    sys.exit(main())
