"""The small GPT in JAX with Flax **linen**: :func:`gpt` (a linen module), :func:`canonical_init`
(the canonical draw as linen's ``{"params": ...}`` tree) and :func:`loss`.

Why linen and not NNX: the book's JAX backend (``d2lmini.jax``) writes its ResNet-18 in linen,
and every JAX lesson handles parameters as an explicit pytree -- ``jax.grad`` of a pure
``net.apply``, replicated or sharded with ``device_put``/``NamedSharding``, averaged with
``lax.pmean`` inside ``shard_map``.  Linen keeps the parameters outside the module, which is
that pytree; NNX keeps them inside mutable objects and needs ``nnx.split``/``nnx.merge`` at
every transform boundary, one more idea on every data-parallel page.

Attention is written out (scores, causal mask, softmax, weighted sum; XLA fuses it) unless
``fused=True``: ``jax.nn.dot_product_attention(..., is_causal=True)`` computes its softmax in
float32 whatever the inputs' dtype (2.6e-7 off a float64 reference, measured), so it cannot
take part in a float64 proof; it is the option for bfloat16 throughput on a GPU (cuDNN's fused
kernel).  Float64 needs ``jax.config.update("jax_enable_x64", True)`` before any array is made.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .spec import LN_EPS, GPTConfig, check_tokens, gpt_spec

__all__ = ["gpt", "canonical_init", "loss"]


class Block(nn.Module):
    cfg: GPTConfig
    dtype: object = jnp.float32
    fused: bool = False
    compute_dtype: object = None    # the matrix products' dtype (None: dtype)

    @nn.compact
    def __call__(self, x):
        B, T, d = x.shape
        nh, dt = self.cfg.heads, self.dtype
        cd = self.compute_dtype or dt
        h = nn.LayerNorm(epsilon=LN_EPS, dtype=dt, param_dtype=dt, name="ln1")(x)
        qkv = nn.Dense(3 * d, dtype=cd, param_dtype=dt, name="qkv")(h)
        q, k, v = (t.reshape(B, T, nh, d // nh) for t in jnp.split(qkv, 3, axis=-1))
        if self.fused:
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        else:
            s = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d // nh).astype(cd)
            s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, jnp.finfo(s.dtype).min)
            a = jax.nn.softmax(s.astype(jnp.promote_types(cd, jnp.float32)), axis=-1)
            y = jnp.einsum("bhts,bshd->bthd", a.astype(cd), v)
        y = y.reshape(B, T, d)
        x = x + nn.Dense(d, dtype=cd, param_dtype=dt, name="proj")(y)      # the residual: dt
        h = nn.LayerNorm(epsilon=LN_EPS, dtype=dt, param_dtype=dt, name="ln2")(x)
        h = nn.gelu(nn.Dense(4 * d, dtype=cd, param_dtype=dt, name="fc")(h), approximate=False)
        return x + nn.Dense(d, dtype=cd, param_dtype=dt, name="fc_proj")(h)


class GPT(nn.Module):
    """Token ids ``(batch, T)``, T <= ``cfg.context`` -> logits ``(batch, T, vocab)``;
    ``head=False``: the final LayerNorm's output ``(batch, T, width)`` instead, for a loss that
    applies the tied head itself (``params['wte']['embedding']``), a chunk of positions at a
    time."""
    cfg: GPTConfig
    dtype: object = jnp.float32
    fused: bool = False             # jax.nn.dot_product_attention (float32 softmax)
    compute_dtype: object = None    # the matrix products' dtype (None: dtype)

    @nn.compact
    def __call__(self, idx, head: bool = True):
        check_tokens(self.cfg, idx.shape)
        c, dt = self.cfg, self.dtype
        wte = nn.Embed(c.vocab, c.width, dtype=dt, param_dtype=dt, name="wte")
        wpe = nn.Embed(c.context, c.width, dtype=dt, param_dtype=dt, name="wpe")
        x = wte(idx) + wpe(jnp.arange(idx.shape[1]))
        for i in range(c.layers):
            x = Block(c, dt, self.fused, self.compute_dtype, name=f"h_{i}")(x)
        x = nn.LayerNorm(epsilon=LN_EPS, dtype=dt, param_dtype=dt, name="lnf")(x)
        if not head:
            return x
        if self.compute_dtype is None:
            return wte.attend(x)                                          # the tied head
        return x.astype(self.compute_dtype) @ wte.embedding.astype(self.compute_dtype).T


def gpt(cfg: GPTConfig, dtype=jnp.float32, fused: bool = False, compute_dtype=None) -> GPT:
    """The linen module; its parameters come from :func:`canonical_init`.  ``fused``: attention
    by ``jax.nn.dot_product_attention`` (see the module docstring).  ``compute_dtype``
    (``jnp.bfloat16``: mixed precision): the dtype of the matrix products -- every Dense layer's
    ``dtype``, its kernel and input cast on the fly, and the tied head -- while the parameters
    (``param_dtype``), embeddings, LayerNorms, the softmax and the residual stream stay in
    ``dtype``, as PyTorch's autocast keeps them in float32."""
    return GPT(cfg, dtype, fused, compute_dtype)


_LAYER = {"ln1": "ln1", "ln2": "ln2", "attn.qkv": "qkv", "attn.proj": "proj", "mlp.fc": "fc",
          "mlp.proj": "fc_proj"}
_LEAF = {("ln", "weight"): "scale", ("ln", "bias"): "bias", ("dense", "weight"): "kernel",
         ("dense", "bias"): "bias"}


def canonical_init(net: GPT, arrays: dict) -> dict:
    """The canonical ``arrays`` as ``{"params": ...}`` for ``net.apply``, in ``net``'s dtype:
    dense weights transposed to linen's ``(in, out)``, LayerNorm weights named ``scale``.
    Missing or misshapen arrays raise ``ValueError``."""
    params: dict = {}
    for name, shape in gpt_spec(net.cfg):
        if name not in arrays or tuple(arrays[name].shape) != shape:
            raise ValueError(f"canonical_init: {name} should be an array of shape {shape}")
        a = np.asarray(arrays[name])
        if name in ("wte", "wpe"):
            params[name] = {"embedding": a}
            continue
        if name.startswith("h."):
            _, i, *rest = name.split(".")
            scope, layer = params.setdefault(f"h_{i}", {}), _LAYER[".".join(rest[:-1])]
        else:
            scope, layer, rest = params, "lnf", name.split(".")
        kind = "ln" if layer.startswith("ln") else "dense"
        if kind == "dense" and rest[-1] == "weight":
            a = a.T
        scope.setdefault(layer, {})[_LEAF[kind, rest[-1]]] = a
    return {"params": jax.tree.map(lambda a: jnp.asarray(a, dtype=net.dtype), params)}


def loss(net: GPT, variables, x, y):
    """Mean cross-entropy in nats of ``net.apply(variables, x)`` against the next tokens ``y``
    (a pure function of ``variables``: differentiate it with ``jax.grad``)."""
    logits = net.apply(variables, x)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, y[..., None], axis=-1).mean()
