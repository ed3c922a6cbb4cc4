"""The concise chapter's recipe in PyTorch: ResNet-18 on Fashion-MNIST with plain SGD, from
d2lmini's canonical initial weights, on one device (a GPU if there is one).

    python pytorch_one.py [--epochs N --batch-size B ...]    # defaults: the profile's
"""
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

import d2lmini
from d2lmini import recipe
from d2lmini import torch as d2l


def train_step(model, loss_fn, optimizer, X, y):
    """One SGD step on the batch (X, y); returns its mean loss (on the device)."""
    optimizer.zero_grad()
    loss = loss_fn(model(X), y)
    loss.backward()
    optimizer.step()
    return loss.detach()                  # no .item(): the host does not wait for every step


@torch.no_grad()
def evaluate(net, X, y, device, batch_size=256):
    """Accuracy on the whole test set (X, y), in inference mode."""
    net.eval()                            # BatchNorm: the running statistics
    correct = 0
    for i in range(0, len(y), batch_size):
        y_hat = net(torch.from_numpy(X[i:i + batch_size]).to(device))
        correct += (y_hat.argmax(1).cpu() == torch.from_numpy(y[i:i + batch_size])).sum()
    return correct.item() / len(y)


def main():
    args = recipe.parse_args()
    data = recipe.load_data(args)
    device, k = d2l.try_gpu(), 1
    if args.batch_size % k:
        raise ValueError(f"the global batch size {args.batch_size} is not divisible by k = {k}")
    batch_size = args.batch_size // k     # each of the k devices gets 1/k of the global batch
    net = d2l.resnet18(10, 1, width=args.width)
    d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    model = net.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    train_set = TensorDataset(torch.from_numpy(data.X_train), torch.from_numpy(data.y_train))
    sampler = RandomSampler(train_set, generator=torch.Generator())
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.generator.manual_seed(args.seed + epoch)  # a new order each epoch, seeded
        model.train()
        start, losses = time.perf_counter(), []
        for X, y in loader:
            losses.append(train_step(model, loss_fn, optimizer, X.to(device), y.to(device)))
        loss = torch.stack(losses).mean().item()          # one wait, for the last step
        seconds = time.perf_counter() - start
        test_acc = evaluate(net, data.X_test, data.y_test, device)
        recipe.report(args, epoch, loss, test_acc, devices=k,
                      framework=d2l.FRAMEWORK, seconds=seconds)


if __name__ == "__main__":
    main()
