"""The concise chapter's recipe in MXNet Gluon on k devices (one process): ResNet-18 on
Fashion-MNIST.  The devices: d2l.try_all_gpus() (how many: D2LMINI_NUM_DEVICES).

    D2LMINI_NUM_DEVICES=2 python mxnet_dp.py [--epochs E --batch-size B --lr LR ...]
"""
import time

import d2lmini
from d2lmini import mxnet as d2l            # before mxnet: installs the NumPy 2 shim
from d2lmini import recipe
from mxnet import autograd, gluon, nd

loss = gluon.loss.SoftmaxCrossEntropyLoss()    # one loss per sample


def train_step(net, trainer, X, y, devices):
    """One SGD step on the batch (X, y); returns its mean loss (on the first device)."""
    X_shards = gluon.utils.split_and_load(X, devices)   # one shard per device
    y_shards = gluon.utils.split_and_load(y, devices)
    with autograd.record():                    # records the graph; BatchNorm in training mode
        ls = [loss(net(Xs), ys) for Xs, ys in zip(X_shards, y_shards)]   # each on its device
    autograd.backward(ls)                      # each replica: the gradient of its shard's SUM
    trainer.step(len(y))                       # the update divides it by len(y)
    return nd.add_n(*(l.sum().as_in_context(devices[0]) for l in ls)) / len(y)  # no asscalar()


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
    devices = d2l.try_all_gpus()
    k = len(devices)
    if args.batch_size % k:                    # each of the k devices gets batch_size // k
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by {k} devices")
    net = d2l.resnet18(10, 1, width=args.width)
    d2l.canonical_init(net, d2lmini.resnet18_init(width=args.width, seed=args.seed))
    net.collect_params().reset_ctx(devices)    # one replica of every parameter per device
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': args.lr},
                            kvstore='device')  # sums the replicas' gradients at every step
    batches = d2lmini.BatchIterator(data.X_train, data.y_train, args.batch_size,
                                    shuffle=True, seed=args.seed, drop_last=True)
    for epoch in range(args.epochs):           # a new order every epoch
        start = time.time()
        losses = [train_step(net, trainer, X, y, devices) for X, y in batches]
        loss = nd.concat(*losses, dim=0).mean().asscalar()   # one wait, for the last step
        seconds = time.time() - start
        recipe.report(args, epoch, loss, evaluate(net, data, devices[0]),
                      devices=k, framework=d2l.FRAMEWORK, seconds=seconds)


if __name__ == "__main__":
    main()
