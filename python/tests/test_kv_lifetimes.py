"""Array lifetimes of asynchronous KVStore operations: a timed-out wait, then
dropping the handle and the array, must not let the network write into freed
memory. The arrays are parked (kept alive) until the operation is over; here a
pull is still waiting at the server for worker 1's push when worker 0 gives up
on it, drops everything and fills the heap with other arrays."""

import textwrap

from conftest import launch

SCRIPT = textwrap.dedent('''
    import gc, sys, time
    import numpy as np
    import pushpull
    from pushpull import _pushpull

    N = 4096
    kv = pushpull.kv.create('dist_sync')
    kv.init(0, np.zeros(N, np.float32))
    kv.barrier()
    if kv.rank == 0:
        pushed = kv.push_async(0, np.ones(N, np.float32))  # round 1 needs worker 1 too
        out = np.zeros(N, np.float32)
        pulled = kv.pull_async(0, out)  # answered only after round 1
        try:
            pulled.wait()
            raise AssertionError('the pull should still be waiting for worker 1')
        except pushpull.Timeout:
            pass
        del pulled, out  # the handle's destructor waits once more, then parks the array
        gc.collect()
        assert _pushpull._parked_operations() >= 1, 'the pull output was not kept alive'
        junk = [np.full(N, 7.0, np.float32) for _ in range(200)]  # reuse freed memory
        deadline = time.monotonic() + 30
        while _pushpull._parked_operations() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _pushpull._parked_operations() == 0, 'the parked pull never finished'
        pushed.wait()
        assert all((j == 7.0).all() for j in junk), 'a late reply wrote into freed memory'
    else:
        time.sleep(3)  # longer than worker 0's two timed-out waits
        kv.push(0, np.full(N, 2.0, np.float32))
    result = np.zeros(N, np.float32)
    kv.pull(0, result)
    assert (result == 3.0).all(), result[:4]  # no optimizer: the round's sum
    kv.barrier()
    print(f'worker {kv.rank}: lifetimes ok', flush=True)
''')


def test_timed_out_pull_keeps_its_array_until_the_reply(tmp_path):
    script = tmp_path / 'lifetimes.py'
    script.write_text(SCRIPT)
    job = launch(2, 1, str(script), extra_env={'PUSHPULL_KVSTORE_WAIT_TIMEOUT_MS': '500'})
    assert job.returncode == 0, job
    for rank in range(2):
        assert f'worker {rank}: lifetimes ok' in job.output, job
