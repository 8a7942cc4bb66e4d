"""pushpull.kv on local stores: MXNet's KVStore API and conventions."""

import threading

import numpy as np
import pytest

import pushpull

SHAPE = (2, 3)


def ones(value=1.0, dtype=np.float32, shape=SHAPE):
    return np.full(shape, value, dtype)


def test_properties(kv):
    assert (kv.type, kv.rank, kv.num_workers) == ('local', 0, 1)
    assert 'dist_sync' in pushpull.kv.types()


@pytest.mark.parametrize('key', [3, 'weight'])
def test_init_pull_single_array(kv, key):
    kv.init(key, ones(2.5))
    out = np.zeros(SHAPE, np.float32)
    kv.pull(key, out=out)
    assert (out == 2.5).all()


def test_push_of_a_device_list_is_summed_and_pulled_to_every_device(kv):
    kv.init(3, ones())
    kv.push(3, [ones(1), ones(2), ones(3)])
    outs = [np.zeros(SHAPE, np.float32) for _ in range(3)]
    kv.pull(3, out=outs)
    for o in outs:
        assert (o == 6).all()


def test_lists_of_keys_with_nested_device_lists(kv):
    keys = [5, 7, 9]
    kv.init(keys, [ones(0)] * 3)
    kv.push(keys, [[ones(1), ones(2)], ones(10), [ones(k) for k in range(4)]])
    outs = [[np.zeros(SHAPE, np.float32) for _ in range(2)], np.zeros(SHAPE, np.float32),
            [np.zeros(SHAPE, np.float32)]]
    kv.pull(keys, out=outs)
    assert (outs[0][0] == 3).all() and (outs[0][1] == 3).all()
    assert (outs[1] == 10).all()
    assert (outs[2][0] == 6).all()


def test_pushpull_with_and_without_out(kv):
    kv.init('a', ones(0))
    out = np.zeros(SHAPE, np.float32)
    kv.pushpull('a', [ones(2), ones(5)], out=out)
    assert (out == 7).all()
    value = ones(4)
    kv.pushpull('a', value)  # out=None: the result lands in value
    assert (value == 4).all()


@pytest.mark.parametrize('dtype', [np.float16, np.float64, np.int32, np.int64])
def test_other_dtypes(kv, dtype):
    kv.init(1, ones(1, dtype))
    kv.push(1, [ones(2, dtype), ones(3, dtype)])
    out = np.zeros(SHAPE, dtype)
    kv.pull(1, out=out)
    assert (out == 5).all() and out.dtype == dtype


def test_torch_tensors_and_bfloat16(kv):
    torch = pytest.importorskip('torch')
    kv.init('t', torch.ones(4, 4, dtype=torch.bfloat16))
    kv.push('t', [torch.full((4, 4), 2.0, dtype=torch.bfloat16)] * 2)
    out = torch.zeros(4, 4, dtype=torch.bfloat16)
    kv.pull('t', out=out)
    assert bool((out == 4).all())


def test_updater_like_the_mxnet_tutorial(kv):
    kv.init(3, ones())
    calls = []

    def update(key, grad, stored):
        calls.append(key)
        stored += grad * 2

    kv._set_updater(update)
    kv.push(3, [ones(), ones()])
    out = np.zeros(SHAPE, np.float32)
    kv.pull(3, out=out)
    assert (out == 5).all()  # 1 + (1 + 1) * 2
    assert calls == [3]


def test_updater_errors_reach_the_pusher(kv):
    kv.init(3, ones())

    def broken(key, grad, stored):
        raise RuntimeError('boom')

    kv.set_updater(broken)
    with pytest.raises(pushpull.InvalidArgument, match='updater raised for key 3.*boom'):
        kv.push(3, ones())


def test_set_optimizer_by_object_by_name_and_by_text(kv):
    for i, how in enumerate([
            lambda: kv.set_optimizer(pushpull.optimizer.create('sgd', learning_rate=0.5)),
            lambda: kv.set_optimizer('sgd', learning_rate=0.5),
            lambda: kv.set_optimizer('sgd:learning_rate=0.5'),
            lambda: kv.set_optimizer(pushpull.optimizer.SGD(learning_rate=0.5)),
    ]):
        kv.init(i, ones(1))
        how()
        kv.push(i, ones(2))
        out = np.zeros(SHAPE, np.float32)
        kv.pull(i, out=out)
        np.testing.assert_allclose(out, 1 - 0.5 * 2)


def test_optimizer_test_rule_closed_form(kv):
    # weight += rescale_grad * grad after each push (MXNet's test optimizer).
    kv.set_optimizer(pushpull.optimizer.create('test', rescale_grad=2))
    kv.init('w', ones(1))
    out = np.zeros(SHAPE, np.float32)
    for i in range(1, 4):
        kv.push('w', [ones(1), ones(2)])
        kv.pull('w', out=out)
        assert (out == 1 + 2 * 3 * i).all()


def test_optimizer_spec_fills_in_defaults():
    opt = pushpull.optimizer.create('adam', learning_rate=0.01)
    assert opt.name == 'adam'
    assert opt.hyperparameters['beta1'] == 0.9 and opt.learning_rate == 0.01
    assert pushpull.optimizer.Optimizer.from_string(str(opt)) == opt
    assert 'rmsprop' in pushpull.optimizer.names()
    assert pushpull.optimizer.create('sgd', multi_precision=True).multi_precision == 1.0


def test_optimizer_states_round_trip(kv, tmp_path):
    kv.set_optimizer('sgd', learning_rate=0.1, momentum=0.9)
    kv.init(0, ones(1, shape=100))
    g = ones(1, shape=100)
    kv.push(0, g)
    kv.push(0, g)
    path = tmp_path / 'opt.states'
    kv.save_optimizer_states(path)
    after_two = np.zeros(100, np.float32)
    kv.pull(0, out=after_two)
    kv.push(0, g)
    after_three = np.zeros(100, np.float32)
    kv.pull(0, out=after_three)

    other = pushpull.kv.create('local')
    other.set_optimizer('sgd', learning_rate=0.1, momentum=0.9)
    other.init(0, after_two)
    other.load_optimizer_states(str(path))
    other.push(0, g)
    out = np.zeros(100, np.float32)
    other.pull(0, out=out)
    np.testing.assert_array_equal(out, after_three)  # needs the loaded momentum
    other.close()


def test_row_sparse_pull(kv):
    value = np.arange(40, dtype=np.float32).reshape(10, 4)
    kv.init('emb', value)
    rows = np.array([7, 2, 7, 0], np.int64)
    outs = [np.full((10, 4), -1, np.float32) for _ in range(2)]
    kv.row_sparse_pull('emb', out=outs, row_ids=rows)
    for out in outs:
        for r in range(10):
            expect = value[r] if r in (0, 2, 7) else 0
            np.testing.assert_array_equal(out[r], expect)
    # one row_ids array per device, int32 and empty
    a, b = np.zeros((10, 4), np.float32), np.ones((10, 4), np.float32)
    kv.row_sparse_pull('emb', out=[a, b], row_ids=[np.array([1], np.int32), np.array([], np.int64)])
    np.testing.assert_array_equal(a[1], value[1])
    assert a.sum() == value[1].sum() and (b == 0).all()


def test_gradient_compression_is_refused_locally(kv):
    # Nothing leaves the process: the C++ parser's errors, then a clear refusal.
    with pytest.raises(pushpull.InvalidArgument, match='nothing leaves this process'):
        kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    with pytest.raises(pushpull.InvalidArgument, match="type '3bit' is unknown"):
        kv.set_gradient_compression({'type': '3bit'})
    with pytest.raises(pushpull.InvalidArgument, match='must be positive'):
        kv.set_gradient_compression({'type': '2bit', 'threshold': -1})
    kv.set_gradient_compression({'type': 'none'})


def test_async_variants(kv):
    kv.init([1, 2], [ones(0), ones(0)])
    h = kv.push_async([1, 2], [ones(1), ones(2)])
    h.wait()
    assert h.done()
    outs = [np.zeros(SHAPE, np.float32), np.zeros(SHAPE, np.float32)]
    kv.pull_async([1, 2], out=outs).wait()
    assert (outs[0] == 1).all() and (outs[1] == 2).all()
    value = ones(3)
    kv.pushpull_async(1, value).wait()
    assert (value == 3).all()
    kv.wait_all()
    kv.barrier()


def test_blocking_calls_release_the_gil(kv):
    # A Python updater runs on the store's threads and needs the GIL: a push
    # that kept the GIL while waiting would deadlock (and hit the deadline).
    kv.init(0, ones())
    seen = []
    kv.set_updater(lambda k, g, s: seen.append(threading.current_thread().name))
    kv.push(0, ones())
    assert seen and seen[0] != threading.current_thread().name


def test_bad_input_gives_the_documented_exceptions(kv):
    kv.init(0, ones())
    with pytest.raises(pushpull.NotFound):
        kv.push(99, ones())
    with pytest.raises(pushpull.InvalidArgument, match='float64'):
        kv.push(0, ones(dtype=np.float64))
    with pytest.raises(pushpull.InvalidArgument, match=r'\(3, 2\)'):
        kv.push(0, ones(shape=(3, 2)))
    with pytest.raises(pushpull.InvalidArgument, match='not contiguous'):
        kv.push(0, np.ones((3, 2), np.float32).T)
    with pytest.raises(pushpull.InvalidArgument, match='key must be an int or a str'):
        kv.push(1.5, ones())
    with pytest.raises(pushpull.InvalidArgument, match='2 keys need a list of 2'):
        kv.push([0, 1], ones())
    with pytest.raises(pushpull.InvalidArgument, match='out= is required'):
        kv.pull(0)
    with pytest.raises(pushpull.InvalidArgument):
        kv.push('string-key', ones())  # mixing int and str keys
    # nothing changed
    out = np.zeros(SHAPE, np.float32)
    kv.pull(0, out=out)
    assert (out == 1).all()


def test_closed_store_raises(kv):
    kv.close()
    with pytest.raises(pushpull.InvalidArgument, match='closed'):
        kv.init(0, ones())
    kv.close()  # twice is fine


def test_two_stores_in_one_process_are_independent():
    with pushpull.kv.create('local') as a, pushpull.kv.create('device') as b:
        a.init(0, ones(1))
        b.init(0, ones(2))
        out = np.zeros(SHAPE, np.float32)
        a.pull(0, out=out)
        assert (out == 1).all()
        b.pull(0, out=out)
        assert (out == 2).all()
