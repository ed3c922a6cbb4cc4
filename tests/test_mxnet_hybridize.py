"""d2lmini.mxnet with hybridized models (the concise chapter's ``train`` hybridizes).

A hybridized graph holds the BatchNorm momentum it was traced with, so
``recalibrate_batchnorm`` must run such a net imperatively (it sets the momentum per batch)
and leave it hybridized.  MXNet runs in its own interpreter, as in tests/test_backends.py.
"""
import json
import os
import subprocess
import sys

CODE = r"""
import json
import numpy as np
import d2lmini
from d2lmini import mxnet as d2l
import mxnet as mx
from mxnet import autograd, gluon, nd

devices = [mx.cpu(0), mx.cpu(1)]
rng = np.random.default_rng(0)
X = rng.random((36, 1, 28, 28), dtype=np.float32)
y = rng.integers(0, 10, 36)
calibration = [(X[i:i + 12], y[i:i + 12]) for i in range(0, 36, 12)]

def fresh():
    net = d2l.canonical_init(d2l.resnet18(num_classes=10, width=4),
                             d2lmini.resnet18_init(width=4, seed=0))
    net.collect_params().reset_ctx(devices)
    return net

hybrid = fresh()
hybrid.hybridize(static_alloc=True)
trainer = gluon.Trainer(hybrid.collect_params(), "sgd", {"learning_rate": 0.1})
loss = gluon.loss.SoftmaxCrossEntropyLoss()
X_shards, y_shards = d2l.split_batch(X[:24], y[:24], devices)
with autograd.record():                  # one step: the graph is traced with momentum 0.9
    losses = [loss(hybrid(Xs), ys) for Xs, ys in zip(X_shards, y_shards)]
autograd.backward(losses)
trainer.step(24)

imperative = fresh()                     # the same weights, never hybridized
for a, b in zip(imperative.collect_params().values(), hybrid.collect_params().values()):
    a.set_data(b.data(devices[0]))
for net in (imperative, hybrid):
    d2l.recalibrate_batchnorm(net, calibration, devices[0])
stats = {name: [p.data(c).asnumpy() for n, p in net.collect_params().items()
                if "running" in n for c in devices]
         for name, net in (("imperative", imperative), ("hybrid", hybrid))}
logits = {name: [net(nd.array(X[:6], ctx=c)).asnumpy() for c in devices]
          for name, net in (("imperative", imperative), ("hybrid", hybrid))}
blocks = []
hybrid.apply(blocks.append)
print("RESULT " + json.dumps({
    "stats_equal": all(np.array_equal(a, b)
                       for a, b in zip(stats["imperative"], stats["hybrid"])),
    "logits_close": all(np.allclose(a, b, rtol=1e-5, atol=1e-5)
                        for a, b in zip(logits["imperative"], logits["hybrid"])),
    "still_hybridized": all(b._active for b in blocks if hasattr(b, "_active"))}))
"""


def test_recalibrate_batchnorm_of_a_hybridized_net_equals_the_imperative_one():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", D2LMINI_NUM_DEVICES="2")
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, r.stdout + r.stderr
    result = json.loads(line[-1][len("RESULT "):])
    assert result == {"stats_equal": True, "logits_close": True, "still_hybridized": True}
