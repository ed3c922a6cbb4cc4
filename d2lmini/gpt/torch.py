"""The small GPT in PyTorch: :class:`GPT` (attention by ``F.scaled_dot_product_attention`` with
``is_causal=True``, which picks a fused kernel, or ``attention="eager"``: softmax(q k^T /
sqrt(d)) v written out, which keeps the (T x T) attention weights for the backward pass),
:func:`canonical_init` and :func:`loss`.  The shapes and the canonical draw are
:mod:`d2lmini.gpt.spec`'s."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .spec import LN_EPS, GPTConfig, check_tokens, gpt_spec

__all__ = ["GPT", "canonical_init", "loss"]


class Block(nn.Module):
    """``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, cfg: GPTConfig, attention: str = "fused"):
        super().__init__()
        if attention not in ("fused", "eager"):
            raise ValueError(f"attention must be 'fused' or 'eager', got {attention!r}")
        d = cfg.width
        self.heads, self.attention = cfg.heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=LN_EPS), nn.LayerNorm(d, eps=LN_EPS)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        if attention == "eager":     # True above the diagonal: the future, masked out
            self.register_buffer("mask", torch.ones(cfg.context, cfg.context, dtype=torch.bool)
                                 .triu(1), persistent=False)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.attention == "fused":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, hd)
        else:
            s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])         # (B, heads, T, T)
            y = s.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))           # exact (erf) GELU


class GPT(nn.Module):
    """Token ids ``(batch, T)``, T <= ``cfg.context`` -> logits ``(batch, T, vocab)``.
    ``attention``: ``"fused"`` (``F.scaled_dot_product_attention``) or ``"eager"``."""

    def __init__(self, cfg: GPTConfig, attention: str = "fused"):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.wpe = nn.Embedding(cfg.context, cfg.width)
        self.h = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.layers))
        self.lnf = nn.LayerNorm(cfg.width, eps=LN_EPS)

    def hidden(self, idx):
        """The final LayerNorm's output ``(batch, T, width)``: what the tied head multiplies."""
        check_tokens(self.cfg, idx.shape)
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lnf(x)

    def forward(self, idx):
        return self.hidden(idx) @ self.wte.weight.T                       # the tied head


def _tensor(net: GPT, name: str):
    """The parameter of ``net`` that holds canonical ``name`` (layouts equal PyTorch's)."""
    if not name.startswith("h."):
        return getattr(net, name) if "." not in name else getattr(net.lnf, name.split(".")[1])
    _, i, *rest = name.split(".")
    block = net.h[int(i)]
    layer = {"ln1": "ln1", "ln2": "ln2", "attn.qkv": "qkv", "attn.proj": "proj",
             "mlp.fc": "fc", "mlp.proj": "fc_proj"}[".".join(rest[:-1])]
    return getattr(getattr(block, layer), rest[-1])


def canonical_init(net: GPT, arrays: dict) -> GPT:
    """Copy the canonical ``arrays`` (:func:`d2lmini.gpt.gpt_init`) into ``net``, keeping the
    net's dtype and device; returns ``net``.  Missing or misshapen arrays raise ``ValueError``."""
    with torch.no_grad():
        for name, shape in gpt_spec(net.cfg):
            if name not in arrays or tuple(arrays[name].shape) != shape:
                raise ValueError(f"canonical_init: {name} should be an array of shape {shape}")
            t = net.wte.weight if name == "wte" else (
                net.wpe.weight if name == "wpe" else _tensor(net, name))
            t.copy_(torch.as_tensor(arrays[name], dtype=t.dtype))
    return net


def loss(net: GPT, x, y):
    """Mean cross-entropy in nats of ``net(x)`` against the next tokens ``y``."""
    logits = net(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
