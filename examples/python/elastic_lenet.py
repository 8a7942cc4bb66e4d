"""LeNet on Fashion-MNIST with Horovod's elastic API: workers may die and join mid-training
(docs/elastic.md).

    build/bin/pushpull launch --min-workers 2 --max-workers 4 \\
        --host-discovery-script ./discover.sh /usr/bin/python3 examples/python/elastic_lenet.py

(discover.sh prints `127.0.0.1:4`; PYTHONPATH=build/python, or the package installed.)
Written as a Horovod elastic script: replacing the import with ``import horovod.torch as
hvd`` runs it under horovodrun. State: the model, the optimizer, an ElasticSampler (the
position in the epoch, re-partitioned by the new size after every reset), the epoch and the
step, committed every --commit-every steps. Every completed step prints a line
``elastic step N size S rank R t=T`` (--log-every), rank 0 prints the test accuracy at the end
of every epoch and a final ``elastic summary:`` line.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import pushpull.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lenet_fashion_mnist import LeNet, evaluate, load  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--batch-size', type=int, default=32, help='per worker')
    p.add_argument('--lr', type=float, default=0.05)
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--commit-every', type=int, default=10, help='steps between commits')
    p.add_argument('--max-steps', type=int, default=0, help='per epoch; 0: the whole epoch')
    p.add_argument('--data-dir', default='/usr/share/datasets/fashion-mnist')
    p.add_argument('--test-limit', type=int, default=0)
    p.add_argument('--log-every', type=int, default=1)
    p.add_argument('--seed', type=int, default=42)
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    hvd.init()
    print('elastic worker pid %d rank %d size %d' % (os.getpid(), hvd.rank(), hvd.size()),
          flush=True)

    x_train, y_train = load(args.data_dir, 'train')
    x_test, y_test = load(args.data_dir, 'test')
    model = LeNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(len(x_train)), shuffle=True, seed=args.seed)

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0,
                                   step=0, epoch_step=0)

    def on_reset():
        print('elastic reset: rank %d of %d' % (hvd.rank(), hvd.size()), flush=True)

    state.register_reset_callbacks([on_reset])
    start = time.time()

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            indices = list(iter(state.sampler))
            for i in range(0, len(indices), args.batch_size):
                if args.max_steps and state.epoch_step >= args.max_steps:
                    break
                batch = torch.tensor(indices[i:i + args.batch_size])
                optimizer.zero_grad()
                loss = F.cross_entropy(state.model(x_train[batch]), y_train[batch])
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(i, len(batch))
                state.step += 1
                state.epoch_step += 1
                if state.step % args.log_every == 0:
                    print('elastic step %d size %d rank %d t=%.3f loss %.4f'
                          % (state.step, hvd.size(), hvd.rank(), time.time(), loss.item()),
                          flush=True)
                if state.step % args.commit_every == 0:
                    state.commit()
            if hvd.rank() == 0:
                acc = evaluate(state.model, x_test, y_test, args.test_limit)
                print('elastic epoch %d test accuracy %.4f size %d' % (state.epoch, acc,
                                                                      hvd.size()), flush=True)
            state.epoch += 1
            state.epoch_step = 0
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        acc = evaluate(model, x_test, y_test, args.test_limit)
        print('elastic summary: test accuracy %.4f steps %d size %d time %.1f s'
              % (acc, state.step, hvd.size(), time.time() - start), flush=True)
    hvd.shutdown()


if __name__ == '__main__':
    main()
