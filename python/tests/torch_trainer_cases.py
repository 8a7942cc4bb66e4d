"""pushpull.torch.Trainer cases of torch_worker.py (one worker each, under
`pushpull launch -n W -s S`): W workers each taking 1/W of a batch must end k
SGD+momentum steps with the weights of one plain torch process taking the whole
batch (the loss is summed over the samples; step(batch) rescales by 1/(batch*W)).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import pushpull.kv
import pushpull.torch
from pushpull._pushpull import InvalidArgument
from torch_worker import expect_error

TOL = 1e-5
LR, MOMENTUM = 0.1, 0.9


def make_model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))


def batch(step, total):
    g = torch.Generator().manual_seed(700 + step)
    return torch.randn(total, 10, generator=g), torch.randint(0, 3, (total,), generator=g)


def equivalence(kv, rank, workers, make_trainer, label, key_base, steps=4, per_rank=6):
    model, ref = make_model(), make_model()
    if rank != 0:  # the store must hand worker 0's weights to everyone
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    trainer = make_trainer(model, key_base)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(steps):
        x, y = batch(step, workers * per_rank)
        sl = slice(rank * per_rank, (rank + 1) * per_rank)
        F.cross_entropy(model(x[sl]), y[sl], reduction='sum').backward()
        trainer.step(per_rank)
        model.zero_grad()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    print('rank %d: %s: max |w - w_ref| = %.3g, stats %s' % (rank, label, diff, trainer.stats))
    if diff > TOL:
        raise AssertionError('%s: Trainer differs from the full-batch run by %g' % (label, diff))
    if trainer.stats['hook_pushes'] != (steps - 1) * len(trainer.keys):
        raise AssertionError('%s: expected every push after the first step to come from a hook, '
                             'got %s' % (label, trainer.stats))
    return trainer


def case_trainer():
    kv = pushpull.kv.create('dist_sync')
    rank, workers = kv.rank, kv.num_workers
    # Local updates first: once a store optimizer is set it applies to every key.
    equivalence(kv, rank, workers, lambda m, kb: pushpull.torch.Trainer(
        m.parameters(), torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM), kvstore=kv,
        key_base=kb), 'local torch optimizer', 100)
    # In buckets of at most 260 bytes (parameters of 640, 64, 192 and 12 bytes:
    # 0.weight alone, the next two packed, 2.bias alone): the same weights.
    t = equivalence(kv, rank, workers, lambda m, kb: pushpull.torch.Trainer(
        m.named_parameters(), torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM),
        kvstore=kv, key_base=kb, bucket_bytes=260), 'small buckets with a torch optimizer', 500)
    if t.keys != [500, 501, 503]:
        raise AssertionError('bucket_bytes=260: expected keys 500, 501 (packed with 502) and '
                             '503; got %s' % t.keys)
    equivalence(kv, rank, workers, lambda m, kb: pushpull.torch.Trainer(
        m.named_parameters(), 'sgd', {'learning_rate': LR, 'momentum': MOMENTUM}, kvstore=kv,
        update_on_kvstore=False, key_base=kb), 'local pushpull optimizer', 200)
    # The model's 4 parameters (under 256 KiB each) travel as one packed key,
    # the first parameter's.
    t = equivalence(kv, rank, workers, lambda m, kb: pushpull.torch.Trainer(
        m.named_parameters(), 'sgd', {'learning_rate': LR, 'momentum': MOMENTUM}, kvstore=kv,
        key_base=kb), 'optimizer on the servers', 0)
    if t.keys != [0]:
        raise AssertionError('expected one packed key (key_base + 0), got %s' % t.keys)
    # Unpacked (fuse_below=0): the same weights.
    t = equivalence(kv, rank, workers, lambda m, kb: pushpull.torch.Trainer(
        m.named_parameters(), 'sgd', {'learning_rate': LR, 'momentum': MOMENTUM}, kvstore=kv,
        key_base=kb, fuse_below=0), 'one key per parameter', 400)
    if t.keys != [400, 401, 402, 403]:
        raise AssertionError('fuse_below=0: expected keys 400..403, got %s' % t.keys)
    # Misuse: a missing gradient, a wrong dtype, a second backward with hooks on.
    model = make_model()
    trainer = pushpull.torch.Trainer(model.named_parameters(), 'sgd', {'learning_rate': LR},
                                     kvstore=kv, key_base=300)
    expect_error(lambda: trainer.step(4), InvalidArgument, 'has no gradient', '0.weight')
    expect_error(lambda: pushpull.torch.Trainer([torch.zeros(2, dtype=torch.float64,
                                                             requires_grad=True)], kvstore=kv),
                 InvalidArgument, 'float32')
    x, y = batch(0, 4)
    F.cross_entropy(model(x), y, reduction='sum').backward()
    trainer.step(4)
    F.cross_entropy(model(x), y, reduction='sum').backward()
    try:
        F.cross_entropy(model(x), y, reduction='sum').backward()
    except Exception as e:  # autograd wraps errors raised in hooks
        if 'second gradient' not in str(e):
            raise
    else:
        raise AssertionError('a second backward before step() must fail')
    kv.close()
    return workers, rank


CASES = {'trainer': case_trainer}
