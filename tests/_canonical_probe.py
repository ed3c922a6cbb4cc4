"""Run by tests/test_canonical_init.py in a fresh process: build one backend's ResNet-18 from
d2lmini.resnet18_init's draw and save its logits on a fixed batch (inference mode and training
mode) to an .npz file.   python tests/_canonical_probe.py FRAMEWORK OUT.npz"""
import sys

import numpy as np

import d2lmini

fw, out = sys.argv[1], sys.argv[2]
WIDTH = 4
X = np.random.default_rng(1).random((6, 1, 28, 28), dtype=np.float32)
arrays = d2lmini.resnet18_init(num_classes=10, in_channels=1, width=WIDTH, seed=0)

if fw == "torch":
    import torch
    from d2lmini import torch as d2l
    net = d2l.canonical_init(d2l.resnet18(10, 1, width=WIDTH), arrays)
    with torch.no_grad():
        net.eval()
        infer = net(torch.from_numpy(X)).numpy()
        net.train()
        train = net(torch.from_numpy(X)).numpy()
elif fw == "mxnet":
    from d2lmini import mxnet as d2l
    from mxnet import autograd, nd
    net = d2l.canonical_init(d2l.resnet18(10, 1, width=WIDTH), arrays)
    infer = net(nd.array(X)).asnumpy()
    with autograd.train_mode():
        train = net(nd.array(X)).asnumpy()
elif fw == "jax":
    from d2lmini import jax as d2l
    net = d2l.resnet18(10, 1, width=WIDTH)
    variables = d2l.canonical_init(net, arrays)
    infer = np.asarray(net.apply(variables, X, train=False))
    train = np.asarray(net.apply(variables, X, train=True, mutable=["batch_stats"])[0])
elif fw == "paddle":
    import paddle
    from d2lmini import paddle as d2l
    net = d2l.canonical_init(d2l.resnet18(10, 1, width=WIDTH), arrays)
    with paddle.no_grad():
        net.eval()
        infer = net(paddle.to_tensor(X)).numpy()
        net.train()
        train = net(paddle.to_tensor(X)).numpy()
else:
    raise SystemExit(f"unknown framework {fw}")
np.savez(out, infer=infer, train=train)
