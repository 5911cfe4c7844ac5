"""Data-parallel training of a small classifier on scikit-learn's handwritten digits.

    hvdrun -np 4 /usr/bin/python3 examples/python/train.py

Every rank trains on its own shard of each epoch (DistributedSampler), gradients are averaged
by hvd.torch.DistributedOptimizer while backward runs, and rank 0 prints progress. The global
batch size is fixed (each rank takes --batch-size / size samples a step) and so is the learning
rate, so -np 1, 2 and 4 train the same way and reach the same test accuracy within noise.
The last line is `test_accuracy=<v>` (rank 0).
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hvd.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (all ranks)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fp16-allreduce", action="store_true", help="Compression.fp16")
    return p.parse_args()


def load_data(seed):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=seed, stratify=y)
    return TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10))


def evaluate(model, test_set):
    """Each rank scores every size-th test sample; the counts are summed over ranks."""
    x, y = test_set.tensors
    mine = slice(hvd.rank(), None, hvd.size())
    model.eval()
    with torch.no_grad():
        correct = (model(x[mine]).argmax(1) == y[mine]).sum()
    model.train()
    counts = hvd.allreduce(torch.tensor([float(correct), float(y[mine].numel())]),
                           name="eval.counts", op=hvd.Sum)
    return (counts[0] / counts[1]).item()


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    torch.manual_seed(args.seed + hvd.rank())  # different on purpose: broadcast fixes it

    train_set, test_set = load_data(args.seed)
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                 shuffle=True, seed=args.seed)
    per_rank = max(1, args.batch_size // hvd.size())
    loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler)

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    if hvd.rank() == 0:
        print("ranks=%d train=%d test=%d batch=%d (%d per rank)"
              % (hvd.size(), len(train_set), len(test_set), per_rank * hvd.size(), per_rank),
              flush=True)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(y), float(len(y))])
        total = hvd.allreduce(total, name="train.loss", op=hvd.Sum)
        accuracy = evaluate(model, test_set)
        if hvd.rank() == 0:
            print("epoch %2d  loss %.4f  test accuracy %.4f  (%.1fs)"
                  % (epoch + 1, (total[0] / total[1]).item(), accuracy,
                     time.perf_counter() - start), flush=True)
    accuracy = evaluate(model, test_set)
    if hvd.rank() == 0:
        print("test_accuracy=%.4f" % accuracy, flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
