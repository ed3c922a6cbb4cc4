"""The small GPT in MXNet Gluon: :class:`GPT` (hybridizable), :func:`canonical_init` and
:func:`loss`.

MXNet 1.9.1 has no fused attention: attention is written with ``batch_dot`` over
``batch x heads`` matrices and a causal mask made inside the graph
(``contrib.arange_like``), so ``net.hybridize()`` compiles one graph for every sequence
length.  The output head shares the token embedding's parameter, which the top block owns
(``wte_weight``) and uses twice, as ``Embedding`` and as ``FullyConnected``.  Float64: call
``net.cast("float64")`` before :func:`canonical_init`.
"""
from __future__ import annotations

import math

from .. import _mxnet_compat

_mxnet_compat.install()

import mxnet as mx  # noqa: E402
from mxnet import nd  # noqa: E402
from mxnet.gluon import nn  # noqa: E402

from .spec import LN_EPS, GPTConfig, check_tokens, gpt_spec  # noqa: E402

__all__ = ["GPT", "AdamW", "canonical_init", "loss"]


class Block(nn.HybridBlock):
    """``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, cfg: GPTConfig, **kwargs):
        super().__init__(**kwargs)
        d = cfg.width
        self.heads, self.scale = cfg.heads, (d // cfg.heads) ** -0.5
        with self.name_scope():
            self.ln1 = nn.LayerNorm(epsilon=LN_EPS, in_channels=d)
            self.ln2 = nn.LayerNorm(epsilon=LN_EPS, in_channels=d)
            self.qkv = nn.Dense(3 * d, flatten=False, in_units=d)
            self.proj = nn.Dense(d, flatten=False, in_units=d)
            self.fc = nn.Dense(4 * d, flatten=False, in_units=d)
            self.fc_proj = nn.Dense(d, flatten=False, in_units=4 * d)

    def hybrid_forward(self, F, x):
        nh = self.heads
        q, k, v = F.split(self.qkv(self.ln1(x)), num_outputs=3, axis=-1)
        # (B, T, d) -> (B, T, nh, hd) -> (B, nh, T, hd) -> (B * nh, T, hd)
        q, k, v = (t.reshape((0, 0, nh, -1)).transpose((0, 2, 1, 3)).reshape((-3, 0, 0))
                   for t in (q, k, v))
        s = F.batch_dot(q, k, transpose_b=True) * self.scale            # (B * nh, T, T)
        rows = F.contrib.arange_like(s, axis=1).reshape((-1, 1))
        cols = F.contrib.arange_like(s, axis=2).reshape((1, -1))
        future = F.broadcast_greater(cols, rows)                         # (T, T): keys after the query
        mask = F.where(future, F.ones_like(future) * float("-inf"), F.zeros_like(future))
        s = F.broadcast_add(s, F.expand_dims(mask, 0))                   # -inf there, + 0 elsewhere
        y = F.batch_dot(F.softmax(s, axis=-1), v)                        # (B * nh, T, hd)
        y = y.reshape((-4, -1, nh, 0, 0)).transpose((0, 2, 1, 3)).reshape((0, 0, -3))
        x = x + self.proj(y)
        h = self.fc(self.ln2(x))
        # the exact GELU, written out: LeakyReLU(act_type="gelu") rounds a constant to float32
        # (1e-7 off in float64, measured)
        return x + self.fc_proj(0.5 * h * (1 + F.erf(h * 0.7071067811865476)))


class GPT(nn.HybridBlock):
    """Token ids ``(batch, T)``, T <= ``cfg.context`` -> logits ``(batch, T, vocab)``."""

    def __init__(self, cfg: GPTConfig, **kwargs):
        super().__init__(**kwargs)
        self.cfg = cfg
        with self.name_scope():
            self.wte_weight = self.params.get("wte_weight", shape=(cfg.vocab, cfg.width))
            self.wpe = nn.Embedding(cfg.context, cfg.width)
            self.h = nn.HybridSequential()
            for _ in range(cfg.layers):
                self.h.add(Block(cfg))
            self.lnf = nn.LayerNorm(epsilon=LN_EPS, in_channels=cfg.width)

    def forward(self, idx, *args):
        check_tokens(self.cfg, idx.shape)    # a hybridized graph would clip positions silently
        return super().forward(idx, *args)

    def hybrid_forward(self, F, idx, wte_weight):
        c = self.cfg
        tok = F.Embedding(idx, wte_weight, input_dim=c.vocab, output_dim=c.width)
        pos = self.wpe(F.contrib.arange_like(idx, axis=1))               # (T, d)
        x = self.h(F.broadcast_add(tok, F.expand_dims(pos, 0)))
        return F.FullyConnected(self.lnf(x), wte_weight, num_hidden=c.vocab, no_bias=True,
                                flatten=False)                           # the tied head


_LAYER = {"ln1": "ln1", "ln2": "ln2", "attn.qkv": "qkv", "attn.proj": "proj", "mlp.fc": "fc",
          "mlp.proj": "fc_proj"}


def _parameter(net: GPT, name: str):
    if name == "wte":
        return net.wte_weight
    if name == "wpe":
        return net.wpe.weight
    if name.startswith("h."):
        _, i, *rest = name.split(".")
        layer, leaf = getattr(net.h[int(i)], _LAYER[".".join(rest[:-1])]), rest[-1]
    else:
        layer, leaf = net.lnf, name.split(".")[1]
    if isinstance(layer, nn.LayerNorm):
        leaf = {"weight": "gamma", "bias": "beta"}[leaf]
    return getattr(layer, leaf)


def canonical_init(net: GPT, arrays: dict, ctx=None) -> GPT:
    """Load the canonical ``arrays`` into ``net`` on ``ctx`` (default: the CPU), initialising it
    first if needed; Gluon's ``Dense`` keeps ``(out, in)`` like the canonical layout.  Missing
    or misshapen arrays raise ``ValueError``; returns ``net``."""
    ctx = ctx or mx.cpu()
    for name, shape in gpt_spec(net.cfg):
        if name not in arrays or tuple(arrays[name].shape) != shape:
            raise ValueError(f"canonical_init: {name} should be an array of shape {shape}")
    if any(p._data is None for p in net.collect_params().values()):
        net.initialize(ctx=ctx)
    for name, _ in gpt_spec(net.cfg):
        p = _parameter(net, name)
        p.set_data(nd.array(arrays[name], dtype=p.dtype, ctx=ctx))
    return net


def loss(net: GPT, x, y):
    """Mean cross-entropy in nats of ``net(x)`` against the next tokens ``y`` (record it under
    ``autograd.record()`` to differentiate)."""
    logits = net(x)
    logp = nd.log_softmax(logits, axis=-1)
    return -nd.pick(logp, y, axis=-1).mean()



@mx.optimizer.register
class AdamW(mx.optimizer.Optimizer):
    """AdamW as ``torch.optim.AdamW`` computes it (decoupled weight decay, default 0.01, and
    Adam's bias correction), registered as Gluon's ``'adamw'``: MXNet 1.9.1 registers no AdamW,
    only the operator ``nd.contrib.adamw_update``, which has no bias correction.  The correction
    is folded into the operator's arguments: with ``c1 = 1 - beta1^t``, ``c2 = 1 - beta2^t``,
    ``lr sqrt(c2) / c1 * m / (sqrt(v) + eps sqrt(c2)) == lr (m / c1) / (sqrt(v / c2) + eps)``.
    The operator takes its scalars as float32 (1e-7 relative off PyTorch's step in float64):
    train with it, prove with plain SGD.  ``multi_precision=True`` keeps float32 master weights
    of float16 ones (the base class's ``update_multi_precision``)."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, wd=0.01,
                 **kwargs):
        super().__init__(learning_rate=learning_rate, wd=wd, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def create_state(self, index, weight):
        return (nd.zeros(weight.shape, weight.context, dtype=weight.dtype),   # m
                nd.zeros(weight.shape, weight.context, dtype=weight.dtype))   # v

    def update(self, index, weight, grad, state):
        self._update_count(index)
        t = self._index_update_count[index]
        c1, c2 = 1 - self.beta1 ** t, 1 - self.beta2 ** t
        mean, var = state
        rescale = nd.full((1,), self.rescale_grad, ctx=weight.context)    # float32 only
        nd.contrib.adamw_update(weight, grad, mean, var, rescale, lr=math.sqrt(c2) / c1,
                                eta=self._get_lr(index), wd=self._get_wd(index),
                                beta1=self.beta1, beta2=self.beta2,
                                epsilon=self.epsilon * math.sqrt(c2),
                                clip_gradient=self.clip_gradient or -1, out=weight)
