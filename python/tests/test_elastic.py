"""pushpull.torch.elastic (Horovod's elastic API) and `pushpull launch --min-workers ...`:
the state classes and the sampler in one process, then whole elastic jobs
(examples/python/elastic_lenet.py driven by elastic_job.py): a worker SIGKILLed mid-epoch,
the discovery script adding a slot back, and kills below --min-workers."""

import os
import sys

import pytest
import torch

import pushpull
import pushpull.torch as hvd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import elastic_job  # noqa: E402

BUILD = os.environ.get('PUSHPULL_BUILD_DIR') or (
    os.path.dirname(os.environ['PUSHPULL_BIN_DIR']) if os.environ.get('PUSHPULL_BIN_DIR')
    else os.path.join(os.path.dirname(os.path.dirname(HERE)), 'build'))


@pytest.fixture
def world_of_one():
    hvd.init()
    yield
    hvd.shutdown()


def test_horovod_names_exist():
    e = hvd.elastic
    for name in ('run', 'State', 'ObjectState', 'TorchState', 'ElasticSampler',
                 'HorovodInternalError', 'HostsUpdatedInterrupt'):
        assert hasattr(e, name), name
    assert e.HorovodInternalError is pushpull.PeerFailure


def test_torch_state_commit_restore(world_of_one):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, batch=5)
    w0 = model.weight.detach().clone()
    state.commit()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.batch = 9
    state.restore()
    assert torch.equal(model.weight, w0)
    assert state.batch == 5
    state.batch = 7
    state.commit()
    state.batch = 8
    state.restore()
    assert state.batch == 7


def test_run_loop_order(world_of_one):
    log = []

    class Recording(hvd.elastic.ObjectState):
        def save(self):
            log.append('save')
            super().save()

        def restore(self):
            log.append('restore')
            super().restore()

        def sync(self):
            log.append('sync')
            super().sync()

    state = Recording(step=0)
    state.register_reset_callbacks([lambda: log.append('cb')])
    calls = []

    def fn(state):
        log.append('fn')
        calls.append(1)
        if len(calls) == 1:
            raise pushpull.PeerFailure('a member died')
        if len(calls) == 2:
            raise hvd.elastic.HostsUpdatedInterrupt(skip_sync=True)
        return 'done'

    wrapped = hvd.elastic._run_fn(fn, lambda: log.append('reset'))
    assert wrapped(state) == 'done'
    assert log == ['sync', 'fn', 'restore', 'reset', 'cb', 'sync', 'fn', 'reset', 'cb', 'fn']


def test_elastic_sampler_repartitions_the_rest_of_the_epoch(world_of_one):
    s = hvd.elastic.ElasticSampler(range(100), shuffle=False)
    assert list(s) == list(range(100))  # a world of one
    s.record_batch(0, 40)
    state = s.state_dict()
    s2 = hvd.elastic.ElasticSampler(range(100), shuffle=False)
    s2.load_state_dict(state)
    assert list(s2) == list(range(40, 100))
    # As rank 1 of 3: every third of what is left.
    s2.num_replicas, s2.rank = 3, 1
    s2.num_samples = 20
    s2.total_size = 60
    assert list(s2) == list(range(41, 100, 3))


def _job(**kw):
    if not os.path.exists(os.path.join(BUILD, 'bin', 'pushpull')):
        pytest.skip('build/bin/pushpull not built')
    return elastic_job.run_job(BUILD, **kw)


def test_killed_worker_the_rest_continue_then_a_slot_brings_size_back_to_4():
    heartbeat_ms = 10000
    r = _job(workers=4, min_workers=2, kill_at=[20], add_at=30, max_steps=150,
             heartbeat_ms=heartbeat_ms)
    print(r)
    assert r['rc'] == 0, r
    assert len(r['kills']) == 1
    # Failure to the next completed step: within the heartbeat timeout + 5 s.
    assert r['kills'][0]['recovery_s'] <= heartbeat_ms / 1000 + 5, r
    assert [s for s, _ in r['sizes']] == [4, 3, 4], r
    assert r['final_size'] == 4
    assert r["last_step"] >= 150


def test_kills_below_min_workers_fail_with_a_clear_message():
    r = _job(workers=3, min_workers=2, kill_at=[10, 20], max_steps=200, elastic_timeout=3)
    print(r)
    assert r['rc'] != 0, r
    assert len(r['kills']) == 2
    assert 'fewer than --min-workers 2' in r.get('failure', ''), r
    assert 'SIGKILL' in r['failure'], r


@pytest.mark.parametrize('args,message', [
    (['--min-workers', '3', '--max-workers', '2'], '--min-workers 3 is more than --max-workers 2'),
    (['--min-np', '1', '-s', '1'], 'collective-only'),
    (['--max-np', '2', '--elastic-timeout', '0'], '--elastic-timeout must be positive'),
    (['--host-discovery-script', 'exit 4'], 'exit code 4'),
])
def test_launcher_rejects_bad_elastic_options(args, message):
    import subprocess
    exe = os.path.join(BUILD, 'bin', 'pushpull')
    if not os.path.exists(exe):
        pytest.skip('build/bin/pushpull not built')
    r = subprocess.run([exe, 'launch'] + args + ['--', 'true'], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r
    assert message in r.stderr, r.stderr


def test_elastic_job_of_plain_commands_succeeds():
    """Any program may run elastic; workers that exit 0 end the job."""
    import subprocess
    exe = os.path.join(BUILD, 'bin', 'pushpull')
    if not os.path.exists(exe):
        pytest.skip('build/bin/pushpull not built')
    r = subprocess.run([exe, 'launch', '--min-np', '2', '--max-np', '3', '--', 'sh', '-c',
                        'echo id=$PUSHPULL_ELASTIC_ID'], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r
    assert sorted(l.split('] ')[1] for l in r.stdout.splitlines() if 'id=' in l) == \
        ['id=0', 'id=1', 'id=2']


def test_lenet_cpp_elastic_loses_a_worker_and_gets_it_back():
    """examples/lenet --mode horovod --elastic (pushpull::torch::elastic)."""
    if not os.path.exists(os.path.join(BUILD, 'bin', 'lenet')):
        pytest.skip('build/bin/lenet not built (needs libtorch)')
    r = _job(workers=4, min_workers=2, kill_at=[15], add_at=25, max_steps=90, program='lenet')
    print(r)
    assert r['rc'] == 0, r
    assert r['kills'][0]['recovery_s'] <= 10 + 5, r
    assert [s for s, _ in r['sizes']] == [4, 3, 4], r
    assert r['final_size'] == 4


def test_reformation_updates_the_rank_environment():
    """After a re-formation a survivor's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
    (and PUSHPULL_ twins), HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK and
    _CROSS_SIZE in os.environ are its new place (before: the launcher set none of them for
    an elastic worker, and nothing updated them)."""
    import json
    import signal
    import subprocess
    exe = os.path.join(BUILD, 'bin', 'pushpull')
    if not os.path.exists(exe):
        pytest.skip('build/bin/pushpull not built')
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(pushpull.__file__))] +
        [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    env.setdefault('OMP_NUM_THREADS', '1')
    proc = subprocess.Popen([exe, 'launch', '--min-np', '2', '--max-np', '3', '-n', '3',
                             '--timeout', '60', '--', sys.executable,
                             os.path.join(HERE, 'elastic_env_worker.py')],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher we started, and its workers
            proc.communicate()
    checks = [json.loads(l.split('envcheck ', 1)[1]) for l in out.splitlines()
              if 'envcheck ' in l]
    assert proc.returncode == 0, out
    assert any(c['size'] == 3 for c in checks), out
    after = [c for c in checks if c['size'] == 2]
    # The worker that was rank 2 of 3 is rank 1 of 2 now.
    moved = {c['pid'] for c in checks if c['size'] == 3 and c['rank'] == 2}
    assert any(c['pid'] in moved and c['rank'] == 1 for c in after), out
    for c in checks:
        assert c['got'] == c['want'], 'step %d, rank %d of %d: %s' % (c['step'], c['rank'],
                                                                       c['size'], c)
