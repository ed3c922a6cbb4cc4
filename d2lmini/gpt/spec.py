"""The small GPT, specified once: its shapes, a canonical float64 draw of its parameters, a
NumPy forward pass that every framework is held to, and its size and cost in closed form.

The model is a decoder-only transformer (Radford et al. 2019, as nanoGPT writes it): token
and position embeddings, ``layers`` pre-LayerNorm blocks ``x + attn(ln1(x))``,
``x + mlp(ln2(x))`` of causal multi-head self-attention and a GELU MLP (4 x width, the exact
erf GELU; LayerNorm epsilon 1e-5), a final LayerNorm and an output head *tied* to the token
embedding (logits = h @ wte^T).  No dropout: every framework computes the same function.

Canonical names and layouts (PyTorch's: a dense weight is ``(out, in)``)::

    wte (vocab, width)   wpe (context, width)
    h.{i}.ln1.weight/bias (width,)      h.{i}.attn.qkv.weight (3 width, width), .bias (3 width,)
    h.{i}.attn.proj.weight (width, width), .bias      h.{i}.ln2.weight/bias
    h.{i}.mlp.fc.weight (4 width, width), .bias       h.{i}.mlp.proj.weight (width, 4 width), .bias
    lnf.weight/bias

``qkv``'s output rows are q, k, v in that order, each split into ``heads`` heads of
``width / heads`` consecutive rows.  Each framework module (``d2lmini.gpt.torch``, ``.jax``,
``.paddle``, ``.mxnet``) has a ``canonical_init`` that converts these layouts to its own.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["GPTConfig", "gpt_spec", "gpt_init", "param_count", "flops_per_token",
           "check_tokens", "reference_logits", "reference_loss", "GPT2_SMALL"]

LN_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The shape of one GPT.  ``vocab``: tokens (the corpus's 81 characters, or GPT-2's 50,304
    padded BPE ids); ``context``: the longest sequence, in tokens; ``width``: the model
    dimension d; ``heads`` must divide it.  Invalid shapes raise ``ValueError``."""
    vocab: int
    context: int
    layers: int
    width: int
    heads: int

    def __post_init__(self):
        for f in ("vocab", "context", "layers", "width", "heads"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"GPTConfig.{f} must be a positive integer, got {v!r}")
        if self.width % self.heads:
            raise ValueError(f"GPTConfig: heads={self.heads} does not divide width={self.width} "
                             f"(each head gets width / heads dimensions)")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @classmethod
    def from_size(cls, size, vocab: int | None = None) -> "GPTConfig":
        """From a profile's :class:`d2lmini.config.GPTSize`; ``vocab`` replaces a size whose
        vocabulary is None (the corpus's characters)."""
        v = size.vocab if size.vocab is not None else vocab
        if v is None:
            raise ValueError("this size takes its vocabulary from the corpus: pass vocab=")
        return cls(vocab=v, context=size.context, layers=size.layers, width=size.width,
                   heads=size.heads)


#: GPT-2 small's shapes (124 M parameters) with nanoGPT's vocabulary padded to 50,304 (a
#: multiple of 64) for the throughput benchmark's random token ids.
GPT2_SMALL = GPTConfig(vocab=50304, context=1024, layers=12, width=768, heads=12)


def gpt_spec(cfg: GPTConfig) -> list[tuple[str, tuple[int, ...]]]:
    """``[(name, shape), ...]`` of every parameter, in canonical order (module docstring)."""
    d = cfg.width
    spec = [("wte", (cfg.vocab, d)), ("wpe", (cfg.context, d))]
    for i in range(cfg.layers):
        p = f"h.{i}"
        spec += [(f"{p}.ln1.weight", (d,)), (f"{p}.ln1.bias", (d,)),
                 (f"{p}.attn.qkv.weight", (3 * d, d)), (f"{p}.attn.qkv.bias", (3 * d,)),
                 (f"{p}.attn.proj.weight", (d, d)), (f"{p}.attn.proj.bias", (d,)),
                 (f"{p}.ln2.weight", (d,)), (f"{p}.ln2.bias", (d,)),
                 (f"{p}.mlp.fc.weight", (4 * d, d)), (f"{p}.mlp.fc.bias", (4 * d,)),
                 (f"{p}.mlp.proj.weight", (d, 4 * d)), (f"{p}.mlp.proj.bias", (d,))]
    return spec + [("lnf.weight", (d,)), ("lnf.bias", (d,))]


def gpt_init(cfg: GPTConfig, seed: int = 0, dtype=np.float64) -> dict[str, np.ndarray]:
    """One draw of every tensor of :func:`gpt_spec` (float64 by default), in canonical layout.

    GPT-2's scheme, as nanoGPT draws it: embeddings and dense weights ~ N(0, 0.02^2), the two
    projections into the residual stream (``attn.proj``, ``mlp.proj``) ~ N(0, (0.02 /
    sqrt(2 layers))^2); biases 0; LayerNorm weight 1, bias 0.  The draw depends only on
    ``seed`` and the shapes, never on the framework."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in gpt_spec(cfg):
        if name.endswith(("ln1.weight", "ln2.weight", "lnf.weight")):
            a = np.ones(shape)
        elif name.endswith(".bias"):
            a = np.zeros(shape)
        else:
            std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") else 0.02
            a = rng.standard_normal(shape) * std
        out[name] = a.astype(dtype)
    return out


def param_count(cfg: GPTConfig, position: bool = True) -> int:
    """Parameters of the model (the tied head counted once): embeddings ``(vocab + context)
    width``, per block ``12 width^2 + 13 width`` (qkv, proj, fc, proj weights and biases, two
    LayerNorms), the final LayerNorm ``2 width``.  ``position=False`` leaves out the position
    embedding, as nanoGPT's printed count does."""
    d = cfg.width
    n = cfg.vocab * d + cfg.layers * (12 * d * d + 13 * d) + 2 * d
    return n + (cfg.context * d if position else 0)


def flops_per_token(cfg: GPTConfig, context: int | None = None, training: bool = True) -> float:
    """Floating-point operations per token of a step on sequences of ``context`` tokens
    (default: the config's), counting a multiply-add as 2 FLOPs (the PaLM paper's appendix B
    and nanoGPT's ``estimate_mfu``):

    * ``6 N`` for training (2 N forward, 4 N backward), ``2 N`` for a forward pass, where N is
      :func:`param_count` without the position embedding (a lookup, no arithmetic); the token
      embedding counts once, as the tied output head's matrix product;
    * attention's two products (q k^T and the weighted sum of v): ``2 * 2 * context * width``
      per layer forward, times 3 for training: ``12 * layers * context * width``.  The causal
      mask's skipped half is counted, as the formula's sources do.

    LayerNorm, GELU, softmax and the loss are left out (a few percent at these shapes).
    Returns FLOPs per token (multiply by tokens per second for FLOP/s)."""
    t = cfg.context if context is None else context
    n = param_count(cfg, position=False)
    factor = 3 if training else 1
    return float(factor * (2 * n + 4 * cfg.layers * t * cfg.width))


def check_tokens(cfg: GPTConfig, shape, what: str = "tokens") -> None:
    """Raise ``ValueError`` unless ``shape`` is ``(batch, T)`` with 1 <= T <= cfg.context.
    (A longer sequence has no position embedding; MXNet's and JAX's lookups would silently
    clip the index instead of failing.)"""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2:
        raise ValueError(f"{what} must be (batch, sequence) token ids, got shape {shape}")
    if not 1 <= shape[1] <= cfg.context:
        raise ValueError(f"{what}: sequences of {shape[1]} tokens, but the model's context is "
                         f"{cfg.context} (position embeddings exist for 0..{cfg.context - 1}); "
                         f"cut the windows to at most {cfg.context} tokens")


# --- the NumPy reference: what every framework must compute ---------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)


def _layer_norm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + LN_EPS) * w + b


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))


def reference_logits(arrays: dict, cfg: GPTConfig, tokens) -> np.ndarray:
    """Logits ``(batch, T, vocab)`` of the canonical ``arrays`` on ``tokens`` ``(batch, T)``,
    computed in NumPy in the arrays' dtype (slow: for the tests' tiny shapes)."""
    tokens = np.asarray(tokens)
    check_tokens(cfg, tokens.shape)
    B, T = tokens.shape
    nh, hd = cfg.heads, cfg.head_dim
    a = arrays
    x = a["wte"][tokens] + a["wpe"][:T]
    mask = np.triu(np.ones((T, T), bool), 1)
    for i in range(cfg.layers):
        p = f"h.{i}"
        h = _layer_norm(x, a[f"{p}.ln1.weight"], a[f"{p}.ln1.bias"])
        qkv = h @ a[f"{p}.attn.qkv.weight"].T + a[f"{p}.attn.qkv.bias"]
        q, k, v = (t.reshape(B, T, nh, hd).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, -1))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        s = np.where(mask, -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        att = (s / s.sum(-1, keepdims=True)) @ v
        att = att.transpose(0, 2, 1, 3).reshape(B, T, cfg.width)
        x = x + att @ a[f"{p}.attn.proj.weight"].T + a[f"{p}.attn.proj.bias"]
        h = _layer_norm(x, a[f"{p}.ln2.weight"], a[f"{p}.ln2.bias"])
        h = _gelu(h @ a[f"{p}.mlp.fc.weight"].T + a[f"{p}.mlp.fc.bias"])
        x = x + h @ a[f"{p}.mlp.proj.weight"].T + a[f"{p}.mlp.proj.bias"]
    return _layer_norm(x, a["lnf.weight"], a["lnf.bias"]) @ a["wte"].T


def reference_loss(logits: np.ndarray, targets) -> float:
    """Mean cross-entropy in nats over every position of ``targets`` ``(batch, T)``."""
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    t = np.asarray(targets)
    return float(-np.take_along_axis(logp, t[..., None], -1).mean())
