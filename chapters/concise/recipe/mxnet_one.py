"""The concise chapter's recipe in MXNet Gluon on one device: ResNet-18 on
Fashion-MNIST.  The device: the first GPU, else the CPU.

    python mxnet_one.py [--epochs E --batch-size B --lr LR ...]
"""
import time

import d2lmini
from d2lmini import mxnet as d2l            # before mxnet: installs the NumPy 2 shim
from d2lmini import recipe
from mxnet import autograd, gluon, nd

loss = gluon.loss.SoftmaxCrossEntropyLoss()    # one loss per sample


def train_step(net, trainer, X, y, device):
    """One SGD step on the batch (X, y); returns its mean loss (on the device)."""
    X, y = nd.array(X, ctx=device), nd.array(y, ctx=device)
    with autograd.record():                    # records the graph; BatchNorm in training mode
        l = loss(net(X), y)
    l.backward()                               # the gradient of the SUM of the losses
    trainer.step(len(y))                       # the update divides it by len(y)
    return l.sum() / len(y)                    # no asscalar(): the host does not wait


def evaluate(net, data, device):
    """Test accuracy of the model on `device`; outside autograd.record(), BatchNorm uses
    its running statistics."""
    correct = 0
    for X, y in d2lmini.BatchIterator(data.X_test, data.y_test, 256):
        correct += d2l.accuracy(net(nd.array(X, ctx=device)), nd.array(y, ctx=device))
    return correct / len(data.y_test)


def main():
    args = recipe.parse_args()
    data = recipe.load_data(args)
    device = d2l.try_gpu()
    net = d2l.resnet18(10, 1, width=args.width)
    d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    net.collect_params().reset_ctx(device)     # the parameters move to the device
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': args.lr})
    batches = d2lmini.BatchIterator(data.X_train, data.y_train, args.batch_size,
                                    shuffle=True, seed=args.seed, drop_last=True)
    for epoch in range(args.epochs):           # a new order every epoch
        start = time.time()
        losses = [train_step(net, trainer, X, y, device) for X, y in batches]
        loss = nd.concat(*losses, dim=0).mean().asscalar()   # one wait, for the last step
        seconds = time.time() - start
        recipe.report(args, epoch, loss, evaluate(net, data, device),
                      devices=1, framework=d2l.FRAMEWORK, seconds=seconds)


if __name__ == "__main__":
    main()
