"""Run by tests/test_canonical_init.py in a fresh process: build one backend's ResNet-18 from
d2lmini.resnet18_init's draw and save its logits on a fixed batch (inference mode, training
mode, and inference after d2l.recalibrate_batchnorm on the same batches) to an .npz file.   python tests/_canonical_probe.py FRAMEWORK OUT.npz"""
import sys

import numpy as np

import d2lmini

fw, out = sys.argv[1], sys.argv[2]
WIDTH = 4
X = np.random.default_rng(1).random((6, 1, 28, 28), dtype=np.float32)
arrays = d2lmini.resnet18_init(num_classes=10, in_channels=1, width=WIDTH, seed=0)
# the book's evaluation rule: running statistics re-estimated on the same whole batches
rng = np.random.default_rng(2)
Xc = rng.random((96, 1, 28, 28), dtype=np.float32)
calib = d2lmini.calibration_batches(Xc, np.zeros(96, np.int64), batch_size=32, num_batches=3)

if fw == "torch":
    import torch
    from d2lmini import torch as d2l
    net = d2l.canonical_init(d2l.resnet18(10, 1, width=WIDTH), arrays)
    with torch.no_grad():
        net.eval()
        infer = net(torch.from_numpy(X)).numpy()
        net.train()
        train = net(torch.from_numpy(X)).numpy()
    d2l.recalibrate_batchnorm(net, calib)
    with torch.no_grad():
        net.eval()
        recal = net(torch.from_numpy(X)).numpy()
elif fw == "mxnet":
    from d2lmini import mxnet as d2l
    from mxnet import autograd, nd
    net = d2l.canonical_init(d2l.resnet18(10, 1, width=WIDTH), arrays)
    infer = net(nd.array(X)).asnumpy()
    with autograd.train_mode():
        train = net(nd.array(X)).asnumpy()
    d2l.recalibrate_batchnorm(net, calib)
    recal = net(nd.array(X)).asnumpy()
elif fw == "jax":
    from d2lmini import jax as d2l
    net = d2l.resnet18(10, 1, width=WIDTH)
    variables = d2l.canonical_init(net, arrays)
    infer = np.asarray(net.apply(variables, X, train=False))
    train = np.asarray(net.apply(variables, X, train=True, mutable=["batch_stats"])[0])
    recal = np.asarray(net.apply(d2l.recalibrate_batchnorm(net, variables, calib), X,
                                 train=False))
elif fw == "paddle":
    import paddle
    from d2lmini import paddle as d2l
    net = d2l.canonical_init(d2l.resnet18(10, 1, width=WIDTH), arrays)
    with paddle.no_grad():
        net.eval()
        infer = net(paddle.to_tensor(X)).numpy()
        net.train()
        train = net(paddle.to_tensor(X)).numpy()
    d2l.recalibrate_batchnorm(net, calib)
    with paddle.no_grad():
        net.eval()
        recal = net(paddle.to_tensor(X)).numpy()
else:
    raise SystemExit(f"unknown framework {fw}")
np.savez(out, infer=infer, train=train, recal=recal)
