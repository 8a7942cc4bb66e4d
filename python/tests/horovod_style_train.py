"""A training script written for horovod.torch (in the style of Horovod's
pytorch_mnist.py, on synthetic data). test_torch_optimizer.py runs it with the
one import line below changed to `import pushpull.torch as hvd` and nothing else.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod.torch as hvd

hvd.init()
torch.manual_seed(42 + hvd.rank())  # different initial weights: broadcast fixes that
torch.set_num_threads(1)

# Synthetic, learnable data: 4 classes, each a Gaussian blob in 20 dimensions.
g = torch.Generator().manual_seed(7)
centers = torch.randn(4, 20, generator=g) * 3
labels = torch.randint(0, 4, (2048,), generator=g)
features = centers[labels] + torch.randn(2048, 20, generator=g)
dataset = torch.utils.data.TensorDataset(features, labels)
sampler = torch.utils.data.distributed.DistributedSampler(
    dataset, num_replicas=hvd.size(), rank=hvd.rank())
loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.5)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16, op=hvd.Average)


def metric_average(val, name):
    return hvd.allreduce(torch.tensor(val), name=name).item()


first_loss = None
for epoch in range(3):
    sampler.set_epoch(epoch)
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if first_loss is None:
            first_loss = metric_average(loss.item(), 'first_loss')

model.eval()
with torch.no_grad():
    out = model(features)
    loss = metric_average(F.nll_loss(out, labels).item(), 'final_loss')
    accuracy = metric_average((out.argmax(1) == labels).float().mean().item(), 'accuracy')

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = hvd.allgather(flat.unsqueeze(0), name='weights')
if hvd.rank() == 0:
    print('final loss %.4f first loss %.4f accuracy %.4f' % (loss, first_loss, accuracy))
    if all(torch.equal(gathered[0], gathered[k]) for k in range(hvd.size())):
        print('weights identical on every rank')
