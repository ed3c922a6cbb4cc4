"""The small GPT in PaddlePaddle: :class:`GPT`, :func:`canonical_init` and :func:`loss`.

Attention is written out (scores, causal mask, softmax, weighted sum), as in the MXNet
version.  ``GPT(cfg, fused=True)`` calls ``paddle.nn.functional.scaled_dot_product_attention``
(layout ``(batch, T, heads, head_dim)``) instead: flash attention on a GPU, a plain
computation on the CPU that is exact in float64 (4e-16 from the written-out one, measured
with Paddle 3.3.1).  ``nn.TransformerEncoderLayer`` with a causal mask would do too, but its
``normalize_before`` block hides the per-head reshapes the other frameworks show, and
``TransformerDecoderLayer`` wants cross-attention memory.  Paddle's ``nn.Linear`` keeps its
weight as ``(in, out)``: the canonical ``(out, in)`` arrays are transposed on loading.
"""
from __future__ import annotations

import logging
import math

_level = logging.getLogger().level
import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from paddle import nn  # noqa: E402

logging.getLogger().setLevel(_level)     # importing paddle sets the root logger to INFO

from .spec import LN_EPS, GPTConfig, check_tokens, gpt_spec  # noqa: E402

__all__ = ["GPT", "canonical_init", "loss"]


class Block(nn.Layer):
    """``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, cfg: GPTConfig, fused: bool = False):
        super().__init__()
        d = cfg.width
        self.heads, self.fused = cfg.heads, fused
        self.ln1, self.ln2 = nn.LayerNorm(d, epsilon=LN_EPS), nn.LayerNorm(d, epsilon=LN_EPS)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, d = x.shape
        nh = self.heads
        q, k, v = (t.reshape([B, T, nh, d // nh])
                   for t in paddle.split(self.qkv(self.ln1(x)), 3, axis=-1))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            q, k, v = (t.transpose([0, 2, 1, 3]) for t in (q, k, v))          # (B, nh, T, hd)
            s = paddle.matmul(q, k, transpose_y=True) / math.sqrt(d // nh)     # (B, nh, T, T)
            future = paddle.triu(paddle.ones([T, T], dtype="bool"), diagonal=1)
            s = paddle.where(future, paddle.full_like(s, float("-inf")), s)
            y = paddle.matmul(F.softmax(s, axis=-1), v).transpose([0, 2, 1, 3])
        x = x + self.proj(y.reshape([B, T, d]))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate=False))


class GPT(nn.Layer):
    """Token ids ``(batch, T)``, T <= ``cfg.context`` -> logits ``(batch, T, vocab)``;
    ``fused``: attention by ``F.scaled_dot_product_attention`` (module docstring)."""

    def __init__(self, cfg: GPTConfig, fused: bool = False):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.wpe = nn.Embedding(cfg.context, cfg.width)
        self.h = nn.LayerList([Block(cfg, fused) for _ in range(cfg.layers)])
        self.lnf = nn.LayerNorm(cfg.width, epsilon=LN_EPS)

    def forward(self, idx):
        check_tokens(self.cfg, idx.shape)
        x = self.wte(idx) + self.wpe(paddle.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return paddle.matmul(self.lnf(x), self.wte.weight, transpose_y=True)   # the tied head


_LAYER = {"ln1": "ln1", "ln2": "ln2", "attn.qkv": "qkv", "attn.proj": "proj", "mlp.fc": "fc",
          "mlp.proj": "fc_proj"}


def canonical_init(net: GPT, arrays: dict) -> GPT:
    """Copy the canonical ``arrays`` into ``net`` in its dtype (``net.to(dtype="float64")``
    first for float64); dense weights are transposed to Paddle's ``(in, out)``.  Missing or
    misshapen arrays raise ``ValueError``; returns ``net``."""
    for name, shape in gpt_spec(net.cfg):
        if name not in arrays or tuple(arrays[name].shape) != shape:
            raise ValueError(f"canonical_init: {name} should be an array of shape {shape}")
        a = arrays[name]
        if name in ("wte", "wpe"):
            p = getattr(net, name).weight
        elif name.startswith("h."):
            _, i, *rest = name.split(".")
            layer = getattr(net.h[int(i)], _LAYER[".".join(rest[:-1])])
            p = getattr(layer, rest[-1])
            if rest[-1] == "weight" and not isinstance(layer, nn.LayerNorm):
                a = a.T
        else:
            p = getattr(net.lnf, name.split(".")[1])
        p.set_value(a.astype(p.numpy().dtype))
    return net


def loss(net: GPT, x, y):
    """Mean cross-entropy in nats of ``net(x)`` against the next tokens ``y``."""
    logits = net(x)
    return F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), y.reshape([-1]))
