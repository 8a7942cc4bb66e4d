"""One worker of the chaos suite's Python jobs, run under `pushpull launch`:

    pushpull launch -n 2 -s 2 python3 tests/chaos/py_worker.py ps --steps 600
    pushpull launch -n 3 -s 0 python3 tests/chaos/py_worker.py collective --steps 600

`ps`: a dist_sync store (the parameter-server engine), one push and pull of a
few keys per step. `collective`: pushpull.torch (the collectives engine), one
allreduce per step. A step also sleeps a little, so a job of a few hundred
steps trains for about ten seconds: long enough for the chaos driver to
inject a fault in the middle. Prints "TRAINING rank R" once training starts
(the driver waits for it), then exits 0 after the last step, or non-zero
with the error the library raised (a failed peer).
"""

import argparse
import sys
import time


def run_ps(steps, sleep_s):
    import numpy as np

    import pushpull
    kv = pushpull.kv.create('dist_sync')
    keys = ['w0', 'w1', 'w2']
    kv.init(keys, [np.zeros(4096, np.float32) for _ in keys])
    print(f'TRAINING rank {kv.rank}', flush=True)
    grads = [np.full(4096, kv.rank + 1, np.float32) for _ in keys]
    outs = [np.zeros(4096, np.float32) for _ in keys]
    for step in range(steps):
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
        if step % 100 == 0:
            print(f'rank {kv.rank} step {step}', flush=True)
        time.sleep(sleep_s)
    kv.barrier()
    print(f'DONE rank {kv.rank}', flush=True)
    kv.close()


def run_collective(steps, sleep_s):
    import torch

    import pushpull.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    grad = torch.ones(4096)
    print(f'TRAINING rank {hvd.rank()}', flush=True)
    for step in range(steps):
        hvd.allreduce(grad, name='grad')
        if step % 100 == 0:
            print(f'rank {hvd.rank()} step {step}', flush=True)
        time.sleep(sleep_s)
    print(f'DONE rank {hvd.rank()}', flush=True)
    hvd.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument('engine', choices=['ps', 'collective'])
    p.add_argument('--steps', type=int, default=600)
    p.add_argument('--sleep-ms', type=float, default=15)
    a = p.parse_args()
    (run_ps if a.engine == 'ps' else run_collective)(a.steps, a.sleep_ms / 1000)
    return 0


if __name__ == '__main__':
    sys.exit(main())
