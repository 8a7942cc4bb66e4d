"""One worker of test_elastic.py's test_reformation_updates_the_rank_environment, under
`pushpull launch --min-np 2 --max-np 3 -n 3`: each step prints, as JSON, this worker's place
(hvd.rank() etc.) and what os.environ says; the worker of rank 1 in a round of 3 SIGKILLs
itself, so the survivors re-form (the worker of rank 2 becomes rank 1 of 2). Ends a few
steps after that re-formation (or after MAX_STEPS)."""

import json
import os
import signal
import time

import torch

import pushpull.torch as hvd

NAMES = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'PUSHPULL_RANK',
         'PUSHPULL_WORLD_SIZE', 'PUSHPULL_LOCAL_RANK', 'PUSHPULL_LOCAL_SIZE', 'HOROVOD_RANK',
         'HOROVOD_SIZE', 'HOROVOD_LOCAL_RANK', 'HOROVOD_LOCAL_SIZE', 'HOROVOD_CROSS_RANK',
         'HOROVOD_CROSS_SIZE']
MAX_STEPS = 300
seen_three = []


def expected():
    r, n, lr, ls = hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()
    place = {'RANK': r, 'WORLD_SIZE': n, 'LOCAL_RANK': lr, 'LOCAL_WORLD_SIZE': ls,
             'HOROVOD_CROSS_RANK': hvd.cross_rank(), 'HOROVOD_CROSS_SIZE': hvd.cross_size()}
    for plain, twin, hvd_name in (('RANK', 'PUSHPULL_RANK', 'HOROVOD_RANK'),
                                  ('WORLD_SIZE', 'PUSHPULL_WORLD_SIZE', 'HOROVOD_SIZE'),
                                  ('LOCAL_RANK', 'PUSHPULL_LOCAL_RANK', 'HOROVOD_LOCAL_RANK'),
                                  ('LOCAL_WORLD_SIZE', 'PUSHPULL_LOCAL_SIZE',
                                   'HOROVOD_LOCAL_SIZE')):
        place[twin] = place[hvd_name] = place[plain]
    return {k: str(v) for k, v in place.items()}


def main():
    torch.set_num_threads(1)
    hvd.init()
    state = hvd.elastic.ObjectState(step=0, after=0)

    @hvd.elastic.run
    def train(state):
        while state.step < MAX_STEPS:
            hvd.allreduce(torch.ones(1), op=hvd.Sum, name='tick')
            if hvd.size() == 3:
                seen_three.append(state.step)
                if hvd.rank() == 1 and len(seen_three) >= 3:
                    os.kill(os.getpid(), signal.SIGKILL)
            print('envcheck %s' % json.dumps({
                'pid': os.getpid(), 'step': state.step, 'rank': hvd.rank(),
                'size': hvd.size(), 'want': expected(),
                'got': {k: os.environ.get(k) for k in NAMES}}), flush=True)
            state.step += 1
            if seen_three and hvd.size() == 2:
                state.after += 1
                if state.after >= 5:
                    break
            state.commit()
            time.sleep(0.02)

    train(state)
    hvd.shutdown()


if __name__ == '__main__':
    main()
