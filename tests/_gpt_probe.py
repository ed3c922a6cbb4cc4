"""Run by tests/test_gpt_model.py in a fresh process: build one framework's GPT
(d2lmini.gpt.<fw>) in float64, load the canonical arrays from IN.npz, and save to OUT.npz its
logits on the batches, the losses of a few plain-SGD steps and the errors it raises.
    python tests/_gpt_probe.py FRAMEWORK IN.npz OUT.npz"""
import sys

import numpy as np

from d2lmini.gpt import GPTConfig

fw, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
d = dict(np.load(src))
cfg = GPTConfig(*(int(v) for v in d["cfg"]))
names = [str(n) for n in d["names"]]
canonical = {n: d[f"canonical/{n}"] for n in names}
perturbed = {n: d[f"perturbed/{n}"] for n in names}
X, Xshort, XS, YS, lr = d["x"], d["x_short"], d["xs"], d["ys"], float(d["lr"])


def errors(forward, make_net):
    """The messages of the errors the framework's model raises on bad input."""
    msgs = []
    try:
        forward(make_net(canonical), np.zeros((2, cfg.context + 1), np.int64))
    except ValueError as e:
        msgs.append(str(e))
    try:
        make_net({**canonical, "wte": canonical["wte"][:-1]})
    except ValueError as e:
        msgs.append(str(e))
    return msgs


if fw == "torch":
    import torch
    from d2lmini.gpt import torch as G

    def make_net(arrays):
        return G.canonical_init(G.GPT(cfg).double(), arrays)

    def forward(net, x):
        with torch.no_grad():
            return net(torch.as_tensor(x)).numpy()

    net, losses = make_net(canonical), []
    for x, y in zip(XS, YS):
        net.zero_grad()
        loss = G.loss(net, torch.as_tensor(x), torch.as_tensor(y))
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
        losses.append(loss.item())

elif fw == "jax":
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from d2lmini.gpt import jax as G
    model = G.gpt(cfg, jnp.float64)
    apply = jax.jit(model.apply)

    def make_net(arrays):
        return G.canonical_init(model, arrays)

    def forward(variables, x):
        return np.asarray(apply(variables, jnp.asarray(x)))

    @jax.jit
    def step(variables, x, y):
        loss, g = jax.value_and_grad(lambda v: G.loss(model, v, x, y))(variables)
        return jax.tree.map(lambda p, gp: p - lr * gp, variables, g), loss

    net, losses = make_net(canonical), []
    for x, y in zip(XS, YS):
        net, loss = step(net, jnp.asarray(x), jnp.asarray(y))
        losses.append(float(loss))

elif fw == "paddle":
    import paddle
    from d2lmini.gpt import paddle as G

    def make_net(arrays):
        net = G.GPT(cfg)
        net.to(dtype="float64")
        return G.canonical_init(net, arrays)

    def forward(net, x):
        with paddle.no_grad():
            return net(paddle.to_tensor(x)).numpy()

    net, losses = make_net(canonical), []
    opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
    for x, y in zip(XS, YS):
        loss = G.loss(net, paddle.to_tensor(x), paddle.to_tensor(y))
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))

elif fw == "mxnet":
    from d2lmini.gpt import mxnet as G      # first: it lets MXNet import under NumPy 2
    from mxnet import autograd, gluon, nd

    def make_net(arrays):
        net = G.GPT(cfg)
        net.cast("float64")
        net = G.canonical_init(net, arrays)
        net.hybridize()
        return net

    def forward(net, x):
        return net(nd.array(x, dtype="float64")).asnumpy()

    net, losses = make_net(canonical), []
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr})
    for x, y in zip(XS, YS):
        x, y = nd.array(x, dtype="float64"), nd.array(y, dtype="float64")
        with autograd.record():
            loss = G.loss(net, x, y)
        loss.backward()
        trainer.step(1)                     # the loss is already the mean
        losses.append(loss.asscalar())

else:
    raise SystemExit(f"unknown framework {fw}")

extra = {}
if fw == "paddle":                      # its fused attention (a plain computation on the CPU)
    fused = G.GPT(cfg, fused=True)
    fused.to(dtype="float64")
    extra["perturbed_fused"] = forward(G.canonical_init(fused, perturbed), X)
np.savez(out, canonical=forward(make_net(canonical), X),
         perturbed=forward(make_net(perturbed), X),
         short=forward(make_net(perturbed), Xshort),
         losses=np.array(losses), after=forward(net, X),
         errors=np.array(errors(forward, make_net)), **extra)
