"""DistributedOptimizer / broadcast cases of torch_worker.py (one rank each).

The equivalence cases compare W ranks, each taking its share of a batch, with
one plain torch process taking the whole batch from the same initial weights:
averaging the ranks' mean-loss gradients is the full batch's mean-loss gradient,
so after k SGD steps the weights must agree to float32 rounding.
"""

import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import pushpull.torch as hvd
from torch_worker import check, expect_error
from pushpull._pushpull import InvalidArgument

TOL = 1e-5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 16)
        self.bn = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 3)
        self.unused = nn.Linear(2, 2)  # never gets a gradient: synchronize() covers it

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


def make_model(seed):
    torch.manual_seed(seed)
    return Net()


def batch(step, total):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(total, 10, generator=g), torch.randint(0, 3, (total,), generator=g)


def max_param_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def equivalence(n, r, compression, passes, tol, steps=4, per_rank=8):
    model, ref = make_model(0), make_model(0)
    # Evaluation-mode BatchNorm: train-mode statistics of a half batch differ
    # from the full batch's, which is a property of BatchNorm, not of us.
    model.bn.eval()
    ref.bn.eval()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, backward_passes_per_step=passes)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch(step, n * per_rank)
        mine_x, mine_y = x[r * per_rank:(r + 1) * per_rank], y[r * per_rank:(r + 1) * per_rank]
        opt.zero_grad()
        micro = per_rank // passes
        for k in range(passes):
            sl = slice(k * micro, (k + 1) * micro)
            (F.cross_entropy(model(mine_x[sl]), mine_y[sl]) / passes).backward()
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    diff = max_param_diff(model, ref)
    moved = max_param_diff(ref, make_model(0))
    print('rank %d: compression=%s passes=%d: max |w - w_ref| = %.3g (weights moved %.3g)'
          % (r, compression.__name__, passes, diff, moved))
    if moved < 1e-3:
        raise AssertionError('the reference did not train; the comparison would be vacuous')
    if diff > tol:
        raise AssertionError('DistributedOptimizer differs from the full-batch run by %g > %g'
                             % (diff, tol))


def case_optimizer(n, r):
    equivalence(n, r, hvd.Compression.none, 1, TOL)
    equivalence(n, r, hvd.Compression.none, 2, TOL)
    equivalence(n, r, hvd.Compression.fp16, 1, 2e-3)
    # Misuse is reported, not silently wrong.
    model = make_model(0)
    expect_error(lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                  named_parameters=[('a', model.fc1.weight)]),
                 InvalidArgument, 'not in it')
    expect_error(lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                  op=hvd.Adasum), InvalidArgument, 'Adasum')
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    if not isinstance(opt, torch.optim.SGD):
        raise AssertionError('DistributedOptimizer must stay an instance of the wrapped class')
    x, y = batch(0, 4)
    F.cross_entropy(model(x), y).backward()
    # The hooks started every used gradient's allreduce during backward().
    started = opt._reducer.stats()['hook_reductions']
    if started != 6:
        raise AssertionError('allreduces started from hooks: %d, not 6' % started)
    expect_error(opt.zero_grad, InvalidArgument, 'zero_grad')
    opt.step()
    opt.zero_grad()


def all_equal_across_ranks(tensors, what):
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    rows = hvd.allgather(flat.unsqueeze(0), name='equal.' + what)
    for k in range(1, rows.shape[0]):
        check(rows[k], rows[0], '%s: rank %d vs rank 0' % (what, k))


def case_broadcast_state(n, r):
    model = make_model(100 + r)  # different weights on every rank
    opt = torch.optim.SGD(model.parameters(), lr=0.1 if r == 0 else 0.5, momentum=0.9)
    if r == 0:  # only rank 0 has momentum buffers and BatchNorm statistics
        x, y = batch(99, 6)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    state = model.state_dict()
    hvd.broadcast_parameters(state, root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    all_equal_across_ranks(list(state.values()), 'state_dict')
    if opt.param_groups[0]['lr'] != 0.1:
        raise AssertionError('lr not broadcast: %s' % opt.param_groups[0]['lr'])
    bufs = [opt.state[p]['momentum_buffer'] for p in model.parameters()
            if p in opt.state and opt.state[p].get('momentum_buffer') is not None]
    if len(bufs) != 6:  # weight and bias of fc1, bn, fc2 (not the unused layer)
        raise AssertionError('rank %d has %d momentum buffers after the broadcast, want 6'
                             % (r, len(bufs)))
    all_equal_across_ranks(bufs, 'momentum')
    # named_parameters() (a generator) from rank 1 to everyone.
    other = make_model(200 + r)
    hvd.broadcast_parameters(other.named_parameters(), root_rank=1)
    all_equal_across_ranks(list(other.parameters()), 'named_parameters')
    check(other.fc1.weight.detach(), make_model(201).fc1.weight.detach(), 'root 1 weights')
    # Replicas stay identical through distributed training on different data.
    dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for step in range(3):
        x, y = batch(10 * r + step, 8)
        dopt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        dopt.step()
    all_equal_across_ranks(list(model.parameters()), 'after training')


def case_optimizer_join(n, r):
    """Uneven data: rank r has 2 + r batches, then joins. Each step's gradient
    is the sum over the ranks that still had data divided by size() (as Horovod:
    a joined rank contributes zeros)."""
    model = make_model(0)
    model.bn.eval()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    for step in range(2 + r):
        active = [k for k in range(n) if 2 + k > step]
        grads = []
        for k in active:  # every active rank's local gradient (same weights everywhere)
            replica = copy.deepcopy(model)
            x, y = batch(100 * k + step, 6)
            F.cross_entropy(replica(x), y).backward()
            grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                          for p in replica.parameters()])
        opt.zero_grad()
        x, y = batch(100 * r + step, 6)
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
        for i, p in enumerate(model.parameters()):
            want = sum(g[i] for g in grads) / n
            check(p.grad, want, 'step %d param %d, %d ranks active' % (step, i, len(active)), TOL)
        with opt.skip_synchronize():
            opt.step()
    hvd.join()


def codes_grad(r, s, numel):
    """Rank r's gradient at step s: every code of both types shows up."""
    i = np.arange(numel)
    return ((i * 7 + r * 3 + s * 5) % 11 - 5).astype(np.float32) * np.float32(0.15)


def codes_model(kind, t, n, steps, numel):
    """SGD (lr 1) from zeros on the average of every rank's codes, in float32:
    each rank's residual r += g; 2bit sends +t/-t/0 past +-t, 1bit +1 above t
    else -1; r -= what was sent (docs/kvstore.md "Gradient compression")."""
    t = np.float32(t)
    res = [np.zeros(numel, np.float32) for _ in range(n)]
    w = np.zeros(numel, np.float32)
    for s in range(steps):
        total = np.zeros(numel, np.float32)
        for k in range(n):  # rank order, as every rank sums
            res[k] += codes_grad(k, s, numel)
            if kind == '2bit':
                q = np.where(res[k] >= t, t, np.where(res[k] <= -t, -t, np.float32(0)))
            else:
                q = np.where(res[k] > t, np.float32(1), np.float32(-1))
            res[k] -= q.astype(np.float32)
            total += q.astype(np.float32)
        w -= total / np.float32(n)
    return torch.from_numpy(w)


def case_optimizer_codes(n, r):
    """Compression.twobit / onebit: the gradient of sum(w * c) is c whatever w
    is, so after 3 steps w follows from the codecs' model alone, every rank's
    residual carried across steps; every rank holds the same bits; ranks with
    different thresholds are refused on every rank."""
    numel = 101
    for comp, kind, t in ((hvd.Compression.twobit, '2bit', 0.5),
                          (hvd.Compression.onebit(threshold=0.25), '1bit', 0.25)):
        w = torch.zeros(numel, requires_grad=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0),
                                       named_parameters=[('w_' + kind, w)], compression=comp)
        for s in range(3):
            opt.zero_grad()
            (w * torch.from_numpy(codes_grad(r, s, numel))).sum().backward()
            opt.step()
        want = codes_model(kind, t, n, 3, numel)
        check(w.detach(), want, '%s weights' % kind, 1e-6)
        if not want.abs().max() > 0:
            raise AssertionError('%s: the model moved nothing (a vacuous check)' % kind)
        rows = hvd.allgather(w.detach().reshape(1, -1), name='codes.w.' + kind)
        for k in range(n):
            check(rows[k], rows[0], '%s: rank %d differs from rank 0' % (kind, k))
    w = torch.zeros(40, requires_grad=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[('w_bad', w)],
                                   compression=hvd.Compression.onebit(threshold=0.5 + r))
    w.sum().backward()
    expect_error(opt.step, InvalidArgument, 'different gradient compression')
    expect_error(lambda: hvd.Compression.twobit(threshold=0), InvalidArgument, 'threshold')
    expect_error(lambda: hvd.allreduce(w, compression=hvd.Compression.onebit), InvalidArgument,
                 'DistributedOptimizer')


CASES = {'optimizer': case_optimizer, 'broadcast_state': case_broadcast_state,
         'optimizer_join': case_optimizer_join, 'optimizer_codes': case_optimizer_codes}
