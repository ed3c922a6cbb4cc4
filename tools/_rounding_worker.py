"""One run of tools/rounding.py, in its own process: the concise chapter's one-device training
(the profile's width, data, batch, learning rate and epochs; the shared initial weights; the
batches of d2lmini.BatchIterator with seed 0) in one framework, printing JSON: the loss of every
step and, after the last epoch, the test accuracy by the book's BatchNorm rule.  Each step is
the recipe's own ``train_step`` (chapters/concise/recipe/<framework>_one.py), so the runs
compared are the chapter's code, not a copy of it.

    cd chapters/concise/recipe && python -m tools._rounding_worker FRAMEWORK THREADS STEPS|all

(run from the recipes' folder, which ``python -m`` puts first on the path, with the repository
on ``PYTHONPATH``: tools/rounding.py does).
"""
import json
import sys

import numpy as np

import d2lmini

fw, threads, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hp = d2lmini.get_profile("cpu").concise
data = d2lmini.load_fashion_mnist(hp.train_samples, hp.test_samples)
arrays = d2lmini.resnet18_init(width=hp.width, seed=0)
it = d2lmini.BatchIterator(data.X_train, data.y_train, hp.batch_size, shuffle=True, seed=0)
epochs = hp.epochs                     # a trajectory stops after `steps` steps
limit = None if steps == "all" else int(steps)
calibration = d2lmini.calibration_batches(data.X_train, data.y_train, hp.batch_size, 5)
losses, test_acc = [], None


def batches():
    for _ in range(epochs):
        for X, y in it:
            if limit is not None and len(losses) >= limit:
                return
            yield X, y


if fw == "torch":
    import torch
    from torch import nn
    from d2lmini import torch as d2l
    torch.set_num_threads(threads)
    net = d2l.canonical_init(d2l.resnet18(10, 1, width=hp.width), arrays).train()
    opt = torch.optim.SGD(net.parameters(), lr=hp.lr)
    loss_fn = nn.CrossEntropyLoss()
    from pytorch_one import train_step
    for X, y in batches():
        losses.append(float(train_step(net, loss_fn, opt, torch.from_numpy(X), torch.from_numpy(y))))
    if steps == "all":
        d2l.recalibrate_batchnorm(net, calibration)
        net.eval()
        with torch.no_grad():
            test_acc = d2l.evaluate_accuracy(net, d2lmini.BatchIterator(data.X_test, data.y_test, 256),
                                             [torch.device("cpu")])
elif fw == "mxnet":
    from d2lmini import mxnet as d2l
    from mxnet import gluon
    from mxnet_one import train_step
    net = d2l.canonical_init(d2l.resnet18(10, 1, width=hp.width), arrays)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": hp.lr})
    device = d2l.get_devices(1)[0]
    for X, y in batches():
        losses.append(float(train_step(net, trainer, X, y, device)))
    if steps == "all":
        d2l.recalibrate_batchnorm(net, calibration)
        test_acc = d2l.evaluate_accuracy(net, d2lmini.BatchIterator(data.X_test, data.y_test, 256),
                                         d2l.get_devices(1))
elif fw == "jax":
    from d2lmini import jax as d2l
    import jax
    import optax
    net = d2l.resnet18(10, 1, width=hp.width)
    variables = d2l.canonical_init(net, arrays)
    tx = optax.sgd(hp.lr)
    state = {"params": variables["params"], "batch_stats": variables["batch_stats"],
             "opt_state": tx.init(variables["params"])}
    from jax_one import train_step
    for X, y in batches():
        state, loss = train_step(net, tx, state, X, y.astype(np.int32))
        losses.append(float(loss))
    if steps == "all":
        v = d2l.recalibrate_batchnorm(net, {"params": state["params"],
                                            "batch_stats": state["batch_stats"]}, calibration)
        predict = jax.jit(lambda v, X: net.apply(v, X, train=False))
        correct = sum(int((np.asarray(predict(v, X)).argmax(1) == y).sum())
                      for X, y in d2lmini.BatchIterator(data.X_test, data.y_test, 256))
        test_acc = correct / len(data.y_test)
else:
    raise SystemExit(f"unknown framework {fw}")
print("RESULT " + json.dumps({"framework": fw, "threads": threads, "losses": losses,
                              "test_acc": test_acc}))
