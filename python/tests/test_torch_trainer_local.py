"""pushpull.torch.Trainer over a local store, in this process: the binding of
the C++ TrainerCore (python/src/trainer_bindings.cpp) as trainer.py uses it.
The multi-worker equivalence runs in test_torch_optimizer.py."""

import gc
import weakref

import pytest

torch = pytest.importorskip('torch')

import pushpull.kv  # noqa: E402
import pushpull.torch  # noqa: E402
from pushpull._pushpull import InvalidArgument  # noqa: E402


def _model():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _backward(model, n=5):
    g = torch.Generator().manual_seed(9)
    model(torch.randn(n, 4, generator=g)).pow(2).sum().backward()


@pytest.mark.parametrize('mode', ['store', 'local', 'torch'])
def test_steps_match_plain_sgd_and_a_failed_step_ends_its_round(mode):
    kv = pushpull.kv.create('local')
    model, ref = _model(), _model()
    if mode == 'torch':
        t = pushpull.torch.Trainer(model.named_parameters(),
                                   torch.optim.SGD(model.parameters(), lr=0.1), kvstore=kv)
    else:
        t = pushpull.torch.Trainer(model.named_parameters(), 'sgd', {'learning_rate': 0.1},
                                   kvstore=kv, update_on_kvstore=(mode == 'store'))
    assert t.keys == [0]  # four small parameters, one packed key
    with pytest.raises(InvalidArgument, match="'0.weight' .*has no gradient"):
        t.step(5)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):  # after the failed step the hooks push again
        _backward(model)
        t.step(5)
        model.zero_grad()
        _backward(ref)
        for p in ref.parameters():
            p.grad /= 5  # step(5): the sum over 5 samples, 1 worker
        ref_opt.step()
        ref_opt.zero_grad()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (p, q)
    s = t.stats
    assert (s['steps'], s['hook_pushes'], s['step_pushes']) == (3, 3, 0), s
    assert s['wait_seconds'] >= 0
    kv.close()


def test_a_trainer_is_collected_with_its_model():
    # The core keeps Python callables; none may reference the Trainer.
    kv = pushpull.kv.create('local')
    model = _model()
    t = pushpull.torch.Trainer(model.named_parameters(),
                               torch.optim.SGD(model.parameters(), lr=0.1), kvstore=kv)
    _backward(model)
    t.step(5)
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is None
    kv.close()


def test_refusals():
    kv = pushpull.kv.create('local')
    with pytest.raises(InvalidArgument, match='float32'):
        pushpull.torch.Trainer([torch.zeros(2, dtype=torch.float64, requires_grad=True)],
                               kvstore=kv)
    model = _model()
    t = pushpull.torch.Trainer(model.named_parameters(), 'sgd', {'learning_rate': 0.1},
                               kvstore=kv, key_base=10, fuse_below=0)
    assert t.keys == [10, 11, 12, 13]
    _backward(model)
    with pytest.raises(InvalidArgument, match='batch_size must be > 0'):
        t.step(0)
    t.step(5)
    _backward(model)
    with pytest.raises(Exception, match='second gradient'):
        _backward(model)
    kv.close()
