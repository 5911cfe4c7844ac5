"""Elastic data-parallel training of a small classifier on scikit-learn's handwritten digits:
a Horovod Elastic PyTorch script that runs unchanged but for its import line.

    hvdrun -np 4 --min-np 2 --max-np 6 --host-discovery-script ./discover_hosts.sh \\
        /usr/bin/python3 examples/python/elastic_train.py

The job keeps training when a rank dies (the others roll back to the last commit and go on
without it) and grows when the discovery script lists a new host (new ranks join at the next
commit). ElasticSampler resumes the epoch where the last commit left it, so no sample is
skipped and none is trained on twice. The learning rate follows the world size (reset
callback). Rank 0 prints one line per epoch with the world size, and `test_accuracy=<v>` last.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

import hvd.torch as hvd  # was: import horovod.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="per rank: scaled by the world size")
    p.add_argument("--batches-per-commit", type=int, default=5)
    p.add_argument("--epoch-sleep", type=float, default=0.0,
                   help="seconds to pause after each epoch (to watch a job change size)")
    return p.parse_args()


def load_data():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=y)
    return TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)


def evaluate(model, test_set):
    x, y = test_set.tensors
    mine = slice(hvd.rank(), None, hvd.size())
    with torch.no_grad():
        correct = (model(x[mine]).argmax(1) == y[mine]).sum()
    counts = hvd.allreduce(torch.tensor([float(correct), float(y[mine].numel())]),
                           name="eval.counts", op=hvd.Sum)
    return (counts[0] / counts[1]).item()


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(0)
    train_set, test_set = load_data()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    def on_reset():
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            for batch, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                sampler.record_batch(batch, args.batch_size)
                if (batch + 1) % args.batches_per_commit == 0:
                    state.commit()
            accuracy = evaluate(model, test_set)
            if hvd.rank() == 0:
                print("epoch %2d  ranks %d  test accuracy %.4f" % (state.epoch + 1, hvd.size(),
                                                                   accuracy), flush=True)
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()
            time.sleep(args.epoch_sleep)

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
    state.register_reset_callbacks([on_reset])
    train(state)
    accuracy = evaluate(model, test_set)
    if hvd.rank() == 0:
        print("test_accuracy=%.4f" % accuracy, flush=True)


if __name__ == "__main__":
    main()
