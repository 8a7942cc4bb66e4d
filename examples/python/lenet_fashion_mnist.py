"""LeNet on Fashion-MNIST, data parallel from Python: the Python twin of
examples/lenet (docs/training.md).

Two ways to keep the workers in sync:

  --mode hvd  pushpull.torch.DistributedOptimizer (Horovod's API; collectives,
              no servers):
      build/bin/pushpull launch -n 2 -s 0 /usr/bin/python3 examples/python/lenet_fashion_mnist.py --mode hvd
  --mode kv   pushpull.torch.Trainer over a KVStore (MXNet's dist_sync; the
              optimizer runs on the servers unless --no-update-on-kvstore):
      build/bin/pushpull launch -n 2 -s 2 /usr/bin/python3 examples/python/lenet_fashion_mnist.py --mode kv --kvstore dist_sync

(PYTHONPATH=build/python, or the package installed.) Each worker trains on its
part of the shuffled training set (part `rank` of `workers`, reshuffled every
epoch from --seed, the same permutation on every worker) in whole batches of
--batch-size, so all workers run the same number of steps. The global batch is
batch-size x workers; the gradient is the mean over it in both modes. Worker 0
evaluates on the test set after every epoch and prints a final
"lenet summary:" line.
"""

import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rb') as f:
        magic, = struct.unpack('>I', f.read(4))
        ndim = magic & 0xff
        if magic >> 8 != 0x08:  # unsigned bytes
            raise ValueError('%s: not an unsigned-byte IDX file (magic %#x)' % (path, magic))
        dims = struct.unpack('>' + 'I' * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def find(data_dir, stem):
    for name in (stem, stem + '.gz'):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError('%s(.gz) not found in %s (Debian: dataset-fashion-mnist)'
                            % (stem, data_dir))


def load(data_dir, split):
    prefix = 'train' if split == 'train' else 't10k'
    images = read_idx(find(data_dir, prefix + '-images-idx3-ubyte'))
    labels = read_idx(find(data_dir, prefix + '-labels-idx1-ubyte'))
    # The C++ job's normalisation: Fashion-MNIST's mean and deviation.
    x = (torch.from_numpy(images.astype(np.float32) / 255.0) - 0.2860) / 0.3530
    return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


class LeNet(nn.Module):
    """conv 5x5 -> relu -> pool -> conv 5x5 -> relu -> pool -> dense -> relu -> dense 10."""

    def __init__(self, c1=20, c2=50, hidden=500):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 5)
        self.conv2 = nn.Conv2d(c1, c2, 5)
        self.fc1 = nn.Linear(c2 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def evaluate(model, x, y, limit):
    if limit:
        x, y = x[:limit], y[:limit]
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    model.train()
    return correct / len(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--mode', choices=['hvd', 'kv'], default=None,
                   help='hvd: DistributedOptimizer; kv: Trainer over a KVStore (default: kv '
                        'when --kvstore is given, else hvd)')
    p.add_argument('--kvstore', default=None, help='store type for --mode kv (default dist_sync)')
    p.add_argument('--update-on-kvstore', dest='update_on_kvstore', action='store_true',
                   default=True)
    p.add_argument('--no-update-on-kvstore', dest='update_on_kvstore', action='store_false')
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--batch-size', type=int, default=64, help='per worker')
    p.add_argument('--lr', type=float, default=0.1)
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--wd', type=float, default=0.0)
    p.add_argument('--seed', type=int, default=42)
    p.add_argument('--model', choices=['mxnet', 'small'], default='mxnet')
    p.add_argument('--data-dir', default='/usr/share/datasets/fashion-mnist')
    p.add_argument('--max-batches', type=int, default=0, help='per epoch; 0: all')
    p.add_argument('--test-limit', type=int, default=0, help='test images; 0: all')
    p.add_argument('--threads', type=int, default=1, help='torch threads per worker')
    p.add_argument('--log-every', type=int, default=200)
    args = p.parse_args()
    mode = args.mode or ('kv' if args.kvstore else 'hvd')
    torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    model = LeNet(*((20, 50, 500) if args.model == 'mxnet' else (6, 16, 120)))
    if mode == 'hvd':
        import pushpull.torch as hvd
        hvd.init()
        rank, workers = hvd.rank(), hvd.size()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                    weight_decay=args.wd)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        label = 'DistributedOptimizer over %d workers' % workers
    else:
        import pushpull.kv
        import pushpull.torch
        kv = pushpull.kv.create(args.kvstore or 'dist_sync')
        rank, workers = kv.rank, kv.num_workers
        trainer = pushpull.torch.Trainer(
            model.named_parameters(), 'sgd',
            {'learning_rate': args.lr, 'momentum': args.momentum, 'wd': args.wd}, kvstore=kv,
            update_on_kvstore=args.update_on_kvstore)
        label = 'Trainer over %s, %d workers, update_on_kvstore=%s' % (
            kv.type, workers, args.update_on_kvstore)

    train_x, train_y = load(args.data_dir, 'train')
    test_x, test_y = load(args.data_dir, 'test')
    part = len(train_x) // workers
    batches = part // args.batch_size
    if args.max_batches:
        batches = min(batches, args.max_batches)
    print('worker %d: %s, %d batches of %d per epoch, lr %g' % (
        rank, label, batches, args.batch_size, args.lr), flush=True)

    start = time.time()
    accuracy = 0.0
    for epoch in range(args.epochs):
        perm = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(
            args.seed + epoch))
        mine = perm[rank * part:(rank + 1) * part]
        t0, waited, loss_sum, correct, seen = time.time(), 0.0, 0.0, 0, 0
        for b in range(batches):
            idx = mine[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = train_x[idx], train_y[idx]
            out = model(x)
            if mode == 'hvd':
                optimizer.zero_grad()
                loss = F.cross_entropy(out, y)
                loss.backward()
                w0 = time.time()
                optimizer.step()  # waits for the allreduces the hooks started
                waited += time.time() - w0
                loss_sum += loss.item() * len(y)
            else:
                loss = F.cross_entropy(out, y, reduction='sum')
                loss.backward()
                w0 = time.time()
                trainer.step(len(y))
                waited += time.time() - w0
                model.zero_grad()
                loss_sum += loss.item()
            correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
            if args.log_every and (b + 1) % args.log_every == 0:
                print('worker %d epoch %d batch %d loss %.4f train-acc %.4f' % (
                    rank, epoch, b + 1, loss_sum / seen, correct / seen), flush=True)
        secs = time.time() - t0
        line = ('worker %d epoch %d: loss %.4f train-acc %.4f, %.0f samples/s (job %.0f), '
                '%.1f s of %.1f s in step()' % (rank, epoch, loss_sum / seen, correct / seen,
                                                seen / secs, workers * seen / secs, waited, secs))
        if rank == 0:
            accuracy = evaluate(model, test_x, test_y, args.test_limit)
            line += ', test-acc %.4f' % accuracy
        print(line, flush=True)
    if rank == 0:
        print('lenet summary: mode %s, %d workers, test accuracy %.4f, %.1f s' % (
            mode, workers, accuracy, time.time() - start), flush=True)
    if mode == 'hvd':
        hvd.shutdown()
    else:
        kv.close()


if __name__ == '__main__':
    main()
