"""A Horovod PyTorch script that uses join with uneven data, sparse embeddings and Adasum.

    hvdrun -np 2 /usr/bin/python3 examples/python/horovod_features.py [--adasum]

Written against horovod.torch; it runs on hvd by changing its import line only. A bag-of-words
classifier (nn.EmbeddingBag with sparse gradients) learns whether a document has more "low"
tokens than "high" ones. Each rank has a different number of batches; a rank that runs out
calls hvd.join() and the others go on, the joined rank taking part in their allreduces with
zeros. With --adasum the ranks' updates are combined with Adasum (a power-of-two number of
ranks); otherwise the gradients are averaged, sparse ones made dense (allgather, which sparse
gradients use by default, does not run while a rank has joined). The last line, on rank 0, is
`test_accuracy=<v> last_joined=<rank>`.
"""

import argparse

import torch

import hvd.torch as hvd  # was: import horovod.torch as hvd

VOCAB, LENGTH = 64, 8


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (n, LENGTH), generator=g)
    labels = ((tokens < VOCAB // 2).sum(1) > LENGTH // 2).long()
    return tokens, labels


class BagOfWords(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(VOCAB, 16, mode="mean", sparse=True)
        self.out = torch.nn.Linear(16, 2)

    def forward(self, tokens):
        return self.out(torch.tanh(self.embed(tokens)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--adasum", action="store_true")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--lr", type=float, default=0.5)
    args = p.parse_args()

    hvd.init()
    torch.manual_seed(1234)
    # Uneven data: rank r has 256 + 96 r samples, so the ranks run out at different steps.
    tokens, labels = make_data(256 + 96 * hvd.rank(), seed=hvd.rank())
    test_tokens, test_labels = make_data(512, seed=10_000)

    model = BagOfWords()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    # Horovod scales the learning rate by the number of ranks when averaging, not with Adasum.
    lr = args.lr if args.adasum else args.lr * hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        op=hvd.Adasum if args.adasum else hvd.Average, sparse_as_dense=not args.adasum)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    batch = 32
    last_joined = -1
    for epoch in range(args.epochs):
        model.train()
        for start in range(0, len(tokens), batch):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(tokens[start:start + batch]),
                                                     labels[start:start + batch])
            loss.backward()
            optimizer.step()
        # This rank is out of data for the epoch; the others may still be training.
        last_joined = hvd.join()
        model.eval()
        with torch.no_grad():
            correct = (model(test_tokens).argmax(1) == test_labels).float().mean()
        accuracy = hvd.allreduce(correct, name="accuracy")  # averaged over ranks
        if hvd.rank() == 0:
            print("epoch %d loss %.4f test_accuracy %.3f" % (epoch, loss.item(), accuracy.item()),
                  flush=True)
    if hvd.rank() == 0:
        print("test_accuracy=%.3f last_joined=%d" % (accuracy.item(), last_joined), flush=True)


if __name__ == "__main__":
    main()
