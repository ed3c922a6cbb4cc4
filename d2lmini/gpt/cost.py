"""What the GPT costs, in closed form (NumPy only): where its parameters are, the bytes one
block keeps for its backward pass, the logits' bytes, the training state per device at each
ZeRO stage, what a gradient all-reduce sends, and the model FLOPs utilisation (MFU).

The chapter's neutral page (``chapters/gpt/model.ipynb``) shows these formulas; the four labs
measure the same quantities in their framework and compare.  Everything that is not specific
to the GPT is reused: the training state per ZeRO stage is :func:`d2lmini.sharding.state_bytes`,
Korthikanti et al.'s activation formula :func:`d2lmini.sharding.transformer_activation_bytes`,
the FLOPs per token :func:`d2lmini.gpt.spec.flops_per_token`.

Notation of the docstrings (Korthikanti et al.'s): s the sequence length (``cfg.context``),
b the sequences of a batch, h the width, a the attention heads, L the layers, V the vocabulary.
"""
from __future__ import annotations

import dataclasses
import math

from ..sharding import FP32_ADAM, MIXED_ADAM, Precision, zero_stage
from ..sharding import state_bytes as _state_bytes
from ..sharding import transformer_activation_bytes
from .spec import GPTConfig, flops_per_token, param_count

__all__ = ["param_breakdown", "block_activation_elements", "korthikanti_bytes", "logits_bytes",
           "state_bytes", "grad_bytes", "mfu", "ATTENTION_KINDS", "TERM_FORMULAS",
           "chapter_models", "param_table", "plot_param_breakdown", "attention_share",
           "flops_table", "plot_attention_share", "batch_table", "state_table", "plot_state",
           "head_activation_elements", "activation_table", "plot_block_activations",
           "step_memory", "memory_levers", "step_memory_table", "plot_step_memory", "logits_table", "comm_links",
           "comm_rows", "comm_table", "plot_comm", "REFERENCE_POINTS", "mfu_table", "plot_mfu",
           "loss_floor_table", "plot_loss_floor"]

#: the two ways of computing attention :func:`block_activation_elements` knows
ATTENTION_KINDS = ("eager", "fused")


def _positive(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")


def param_breakdown(cfg: GPTConfig) -> dict:
    """Where the parameters are: ``{'token embedding', 'position embedding', 'attention',
    'MLP', 'LayerNorm', 'total'}`` (counts).  The output head is tied to the token embedding,
    so it has no entry of its own; ``attention`` is every block's qkv and proj weights and
    biases (``4 h^2 + 4 h`` a block), ``MLP`` the fc and proj (``8 h^2 + 5 h``), ``LayerNorm``
    the two of every block and the final one (``(4 L + 2) h``).  The total is
    :func:`d2lmini.gpt.param_count` with the position embedding.  GPT-2 small with nanoGPT's
    padded vocabulary of 50,304 tokens and 1,024 positions has 124,475,904 parameters
    (124,439,808 with GPT-2's own 50,257 tokens, the count Karpathy's nanoGPT README quotes as
    124 M):

    >>> from d2lmini.gpt import GPT2_SMALL
    >>> from d2lmini.gpt.cost import param_breakdown
    >>> p = param_breakdown(GPT2_SMALL)
    >>> p['total'], p['token embedding'], p['attention'] + p['MLP'] + p['LayerNorm']
    (124475904, 38633472, 85056000)
    """
    d, L = cfg.width, cfg.layers
    out = {"token embedding": cfg.vocab * d, "position embedding": cfg.context * d,
           "attention": L * (4 * d * d + 4 * d), "MLP": L * (8 * d * d + 5 * d),
           "LayerNorm": (4 * L + 2) * d}
    out["total"] = sum(out.values())
    assert out["total"] == param_count(cfg), "param_breakdown disagrees with param_count"
    return out


def block_activation_elements(cfg: GPTConfig, batch: int, *, attention: str = "eager",
                              recompute: bool = False) -> dict:
    """The elements one block of this book's GPT keeps for its backward pass, on ``batch``
    sequences of ``cfg.context`` tokens: ``{name: elements, ..., 'total': ...}``.

    The block is pre-LayerNorm without dropout: ``ln1 -> qkv Linear -> causal attention ->
    proj Linear -> + residual``, then ``ln2 -> fc Linear -> exact GELU -> proj Linear -> +
    residual``.  A standard autograd keeps, per operation (parameters are not counted: they
    are kept anyway; nor are buffers shared by every step, such as a causal mask):

    ==================  ============  =====================================================
    term                elements      kept by
    ==================  ============  =====================================================
    ln1 input           s b h         LayerNorm (its input x, the block's input)
    ln1 mean, ln1 rstd  s b each      LayerNorm (per-row mean and 1/sqrt(var + eps))
    qkv input           s b h         the qkv Linear (ln1's output)
    q, k, v             s b h each    q k^T keeps q and k; the product with v keeps v
    softmax output      a s^2 b       eager only: softmax keeps its output, which the
                                      product with v keeps too (one tensor)
    attention output    s b h         fused only: the kernel keeps its output ...
    log-sum-exp         a s b         ... and each row's log-sum-exp, instead of the
                                      (s x s) probabilities, which its backward recomputes
    proj input          s b h         the attention proj Linear (the heads' outputs)
    ln2 input           s b h         LayerNorm (x + attention, the residual sum)
    ln2 mean, ln2 rstd  s b each
    fc input            s b h         the fc Linear (ln2's output)
    GELU input          4 s b h       GELU (the fc output)
    mlp proj input      4 s b h       the MLP's proj Linear (GELU's output)
    ==================  ============  =====================================================

    The residual additions keep nothing.  Eager attention: ``16 s b h + a s^2 b + 4 s b``;
    fused (SDPA's flash and memory-efficient kernels, FlashAttention): ``17 s b h + a s b +
    4 s b`` (PyTorch's proj reads a (b, s, h) copy of the kernel's (b, a, s, h/a) output, so
    both are kept; a framework whose proj reads the kernel's output keeps one ``s b h`` less).
    ``recompute=True`` (activation checkpointing of the whole block) keeps only the block's
    input, ``s b h``, and runs the block's forward pass again during the backward pass.

    Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer Models",
    section 4.1, equation 1) count ``s b h (34 + 5 a s / h)`` *bytes* for a layer with 16-bit
    activations and dropout: attention ``11 s b h + 5 a s^2 b`` (2-byte tensors, and 1-byte
    masks for the two dropouts), MLP ``19 s b h``, LayerNorms ``4 s b h``.  Without dropout
    the three masks (``s b h``, ``s b h``, ``a s^2 b``) and the dropped-out probabilities
    (``2 a s^2 b``) go, leaving ``32 s b h + 2 a s^2 b`` bytes, i.e. ``16 s b h + a s^2 b``
    *elements*: exactly the eager count above, less the LayerNorms' ``4 s b`` statistics the
    paper neglects.  In float32 that is ``64 s b h + 4 a s^2 b`` bytes.

    >>> from d2lmini.gpt import GPTConfig
    >>> from d2lmini.gpt.cost import block_activation_elements, korthikanti_bytes
    >>> cfg = GPTConfig(vocab=50304, context=2048, layers=96, width=12288, heads=96)   # GPT-3
    >>> s, b, h, a = 2048, 1, 12288, 96
    >>> eager = block_activation_elements(cfg, b)
    >>> eager['total'] == 16 * s * b * h + a * s * s * b + 4 * s * b
    True
    >>> korthikanti_bytes(cfg, b) - 2 * (eager['total'] - 4 * s * b) == 2 * s * b * h + 3 * a * s * s * b
    True
    >>> block_activation_elements(cfg, b, attention="fused")['total'] == 17 * s * b * h + a * s * b + 4 * s * b
    True
    >>> block_activation_elements(cfg, b, recompute=True)
    {'block input': 25165824, 'total': 25165824}
    """
    _positive("batch", batch)
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
    s, h, a = cfg.context, cfg.width, cfg.heads
    sbh, sb = s * batch * h, s * batch
    if recompute:
        return {"block input": sbh, "total": sbh}
    out = {"ln1 input": sbh, "ln1 mean": sb, "ln1 rstd": sb, "qkv input": sbh,
           "q": sbh, "k": sbh, "v": sbh}
    if attention == "eager":
        out["softmax output"] = a * s * s * batch
    else:
        out["attention output"] = sbh
        out["log-sum-exp"] = a * sb
    out.update({"proj input": sbh, "ln2 input": sbh, "ln2 mean": sb, "ln2 rstd": sb,
                "fc input": sbh, "GELU input": 4 * sbh, "mlp proj input": 4 * sbh})
    out["total"] = sum(out.values())
    return out


def korthikanti_bytes(cfg: GPTConfig, batch: int, recompute: str = "none") -> float:
    """Korthikanti et al.'s activation bytes of *one* block (16-bit activations, with dropout;
    :func:`d2lmini.sharding.transformer_activation_bytes` with ``layers=1``) on ``batch``
    sequences of ``cfg.context`` tokens: ``s b h (34 + 5 a s / h)``; ``recompute="selective"``
    (attention's ``s^2`` tensors recomputed) ``34 s b h``; ``"full"`` ``2 s b h``.  Times
    ``cfg.layers`` for the model.  The paper's GPT-3 example (s = 2,048, h = 12,288, a = 96):

    >>> from d2lmini.gpt import GPTConfig
    >>> from d2lmini.gpt.cost import korthikanti_bytes
    >>> gpt3 = GPTConfig(vocab=50304, context=2048, layers=96, width=12288, heads=96)
    >>> [korthikanti_bytes(gpt3, 1, r) / (2048 * 12288) for r in ("none", "selective", "full")]
    [114.0, 34.0, 2.0]
    """
    return transformer_activation_bytes(cfg.context, batch, cfg.width, cfg.heads, layers=1,
                                        recompute=recompute)


def logits_bytes(cfg: GPTConfig, batch: int, *, itemsize: int = 4, with_grad: bool = True,
                 chunks: int = 1) -> int:
    """Bytes of the logits ``(batch, context, vocab)`` of one step, and of their gradient
    (``with_grad``: the loss's backward pass writes a tensor of the same shape).  With
    ``chunks`` > 1 the cross-entropy is computed over the ``batch * context`` positions in
    that many pieces (sizes differ by at most one), each piece's logits and gradient made and
    freed before the next: the bytes are the largest piece's.  ``itemsize`` 2 for bf16
    logits.  GPT-2 small (vocabulary 50,304) at batch 16 x 1,024 in float32: 3.07 GiB of
    logits, 6.14 GiB with their gradient:

    >>> from d2lmini.gpt import GPT2_SMALL
    >>> from d2lmini.gpt.cost import logits_bytes
    >>> logits_bytes(GPT2_SMALL, 16, with_grad=False) == 16 * 1024 * 50304 * 4 == 3296722944
    True
    >>> round(logits_bytes(GPT2_SMALL, 16) / 2**30, 2), logits_bytes(GPT2_SMALL, 16, chunks=8)
    (6.14, 824180736)
    """
    _positive("batch", batch)
    _positive("itemsize", itemsize)
    _positive("chunks", chunks)
    positions = batch * cfg.context
    piece = -(-positions // chunks)
    return piece * cfg.vocab * itemsize * (2 if with_grad else 1)


def state_bytes(cfg: GPTConfig, k: int, stage, precision: Precision = FP32_ADAM) -> list[dict]:
    """Bytes of parameters, gradients and AdamW state (m and v) each of ``k`` devices keeps
    between steps at ZeRO ``stage`` (0-3 or a name, :func:`d2lmini.sharding.zero_stage`):
    :func:`d2lmini.sharding.state_bytes` of :func:`d2lmini.gpt.param_count` (position
    embedding included: it is held and updated).  One dict per device, ``{'params', 'grads',
    'optimizer', 'total'}``.  GPT-2 small with float32 AdamW needs 16 bytes a parameter,
    1.99 GB on one device; the ZeRO paper's example (Rajbhandari et al. 2020, figure 1: 7.5 B
    parameters, 64 devices, mixed-precision Adam, 2 + 2 + 12 bytes) gives 120, 31.4, 16.6
    and 1.9 GB per device at stages 0-3:

    >>> from d2lmini.gpt import GPT2_SMALL
    >>> from d2lmini.gpt.cost import state_bytes
    >>> from d2lmini.sharding import MIXED_ADAM, state_bytes as per_n
    >>> state_bytes(GPT2_SMALL, 1, 0)[0]['total'] == 16 * 124475904
    True
    >>> [round(per_n(7_500_000_000, 64, s, MIXED_ADAM)[0]['total'] / 1e9, 1) for s in range(4)]
    [120.0, 31.4, 16.6, 1.9]
    """
    return _state_bytes(param_count(cfg), k, zero_stage(stage), precision)


def grad_bytes(cfg: GPTConfig, itemsize: int = 4) -> int:
    """Bytes of the gradient one data-parallel all-reduce sums (its payload): one value per
    parameter, the tied head's gradient added into the token embedding's.  What each device
    *sends* in a ring all-reduce is ``2 (k - 1) / k`` times this (its time over a link:
    :func:`d2lmini.commcost.collective_time`).

    >>> from d2lmini.gpt import GPT2_SMALL
    >>> from d2lmini.gpt.cost import grad_bytes
    >>> grad_bytes(GPT2_SMALL), grad_bytes(GPT2_SMALL, itemsize=2)
    (497903616, 248951808)
    """
    _positive("itemsize", itemsize)
    return param_count(cfg) * itemsize


def mfu(tokens_per_s: float, cfg: GPTConfig, peak_flops: float,
        context: int | None = None) -> float:
    """Model FLOPs utilisation (Chowdhery et al. 2022, PaLM, appendix B): the model FLOPs a
    second of training performs, ``tokens_per_s * flops_per_token``, over the device's peak
    FLOP/s.  :func:`d2lmini.gpt.flops_per_token`'s convention is PaLM's ``6 N + 12 L H Q T``
    per token (H Q = h, T = ``context``, default ``cfg.context``) with nanoGPT's N: every
    parameter but the position embedding, the tied head counted once; a multiply-add is 2
    FLOPs; recomputation is not counted (that is the "model" in MFU).  GPT-2 small at 1,024
    tokens: 855,383,040 FLOPs per token; at 471,000 tokens/s (llm.c's figure for one H100)
    against the H100 SXM's 989 TFLOP/s of dense bf16 that is 40.7 % by this convention:

    >>> from d2lmini.gpt import GPT2_SMALL, flops_per_token, param_count
    >>> from d2lmini.gpt.cost import mfu
    >>> n = param_count(GPT2_SMALL, position=False)
    >>> flops_per_token(GPT2_SMALL) == 6 * n + 12 * 12 * 12 * 64 * 1024 == 855383040
    True
    >>> round(mfu(471_000, GPT2_SMALL, 989e12), 3)
    0.407
    """
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops!r}")
    return tokens_per_s * flops_per_token(cfg, context) / peak_flops


# --- the neutral page's tables and figures, from the formulas above ---------------------------

GIB = 2**30
MIB = 2**20

#: what each term of :func:`block_activation_elements` is, in Korthikanti et al.'s letters
TERM_FORMULAS = {"ln1 input": "s b h", "ln1 mean": "s b", "ln1 rstd": "s b", "qkv input": "s b h",
                 "q": "s b h", "k": "s b h", "v": "s b h", "softmax output": "a s² b",
                 "attention output": "s b h", "log-sum-exp": "a s b", "proj input": "s b h",
                 "ln2 input": "s b h", "ln2 mean": "s b", "ln2 rstd": "s b", "fc input": "s b h",
                 "GELU input": "4 s b h", "mlp proj input": "4 s b h", "block input": "s b h"}


def _md(header, rows) -> str:
    from ..tables import markdown
    return markdown(header, rows)


def chapter_models() -> dict[str, GPTConfig]:
    """The chapter's models by name: the one trained with the CPU settings, the one trained
    with the GPU settings (both on the corpus's 81 characters) and GPT-2 small, the shape the
    chapter's throughput is measured at (vocabulary 50,304)."""
    from ..config import get_profile
    from . import GPT2_SMALL, profile_config
    return {"CPU settings": profile_config(get_profile("cpu")),
            "GPU settings": profile_config(get_profile("gpu")), "GPT-2 small": GPT2_SMALL}


def param_table(models: dict) -> str:
    """Markdown: the parameters of each model (``{name: GPTConfig}``) by part, with each
    part's share of the total (:func:`param_breakdown`)."""
    parts = {name: param_breakdown(cfg) for name, cfg in models.items()}
    header = ["part"] + [f"{name} ({c.layers} x {c.width}, vocab. {c.vocab:,})"
                         for name, c in models.items()]
    rows = []
    for part in next(iter(parts.values())):
        cells = []
        for p in parts.values():
            cells.append(f"{p[part]:,}" if part == "total"
                         else f"{p[part]:,} ({p[part] / p['total']:.1%})")
        rows.append([f"**{part}**" if part == "total" else part] + cells)
    return _md(header, rows)


def plot_param_breakdown(models: dict, ax=None):
    """Each model's parameters by part, as shares of its total (horizontal stacked bars).
    Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 2.6))
    names = list(models)
    parts = [param_breakdown(models[n]) for n in names]
    left = [0.0] * len(names)
    for part in [p for p in parts[0] if p != "total"]:
        share = [100 * p[part] / p["total"] for p in parts]
        ax.barh(names, share, left=left, label=part)
        left = [a + b for a, b in zip(left, share)]
    ax.set(xlabel="share of the parameters (%)", xlim=(0, 100))
    ax.invert_yaxis()
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return ax


def attention_share(cfg: GPTConfig, context: int | None = None) -> float:
    """The share of attention's products (``12 L T h``) in :func:`d2lmini.gpt.flops_per_token`
    at ``context`` tokens (default ``cfg.context``)."""
    t = cfg.context if context is None else context
    return 12 * cfg.layers * t * cfg.width / flops_per_token(cfg, t)


def flops_table(models: dict) -> str:
    """Markdown: FLOPs per trained token of each model at its own context, ``6 N`` and
    attention's ``12 L T h`` (:func:`d2lmini.gpt.flops_per_token`)."""
    rows = []
    for name, c in models.items():
        n = param_count(c, position=False)
        att = 12 * c.layers * c.context * c.width
        rows.append([name, f"{c.context:,}", f"{n:,}", f"{6 * n:,}", f"{att:,}",
                     f"{int(flops_per_token(c)):,}", f"{attention_share(c):.1%}"])
    return _md(["model", "context T", "N (no positions)", "6 N", "12 L T h", "FLOPs per token",
                "attention"], rows)


def plot_attention_share(models: dict, contexts=(64, 128, 256, 512, 1024, 2048, 4096, 8192),
                         ax=None):
    """Attention's share of the FLOPs per token against the context (log scale) for each
    model's layers and width; a dot at the model's own context.  Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.4))
    for name, c in models.items():
        line, = ax.plot(contexts, [100 * attention_share(c, t) for t in contexts], "-", label=name)
        ax.plot([c.context], [100 * attention_share(c)], "o", color=line.get_color())
    ax.set(xscale="log", xlabel="context T (tokens)", ylabel="attention's share of FLOPs (%)",
           ylim=(0, 100))
    ax.set_xticks(list(contexts), [f"{t:,}" for t in contexts])
    ax.xaxis.set_minor_formatter(_null_formatter())
    ax.legend(fontsize=8)
    return ax


def batch_table(batch: int, context: int, counts) -> str:
    """Markdown: a global batch of ``batch`` sequences of ``context`` tokens split by sequence
    over each device count in ``counts`` (:func:`d2lmini.gpt.lab.token_shards`)."""
    from .lab import token_shards
    rows = []
    for k in counts:
        tokens = token_shards(batch, context, k)
        seqs = [t // context for t in tokens]
        rows.append([k, " ".join(str(s) for s in seqs), f"{min(tokens):,}", f"{max(tokens):,}",
                     "yes" if min(seqs) == max(seqs) else "no"])
    return _md(["devices", "sequences on each device", "fewest tokens", "most tokens", "even"],
               rows)


def state_table(cfg: GPTConfig, counts, precision: Precision = FP32_ADAM) -> str:
    """Markdown: GiB of training state (parameters, gradients, optimizer state) on the device
    that holds the most, replicated and at each ZeRO stage, for each device count
    (:func:`state_bytes`)."""
    from ..sharding import STAGE_NAMES, STAGES
    rows = [[STAGE_NAMES[s]] + [f"{max(d['total'] for d in state_bytes(cfg, k, s, precision)) / GIB:.3f}"
                                for k in counts] for s in STAGES]
    return _md([f"GiB per device, {precision.name}"] + [f"k = {k}" for k in counts], rows)


def plot_state(cfg: GPTConfig, counts, precisions=(FP32_ADAM,), ax=None):
    """GiB of training state per device against the device count, one line per ZeRO stage
    (solid: the first precision, dashed: the second).  Returns the axes."""
    import matplotlib.pyplot as plt
    from ..sharding import STAGE_NAMES, STAGES
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.4))
    for j, prec in enumerate(precisions):
        for s in STAGES:
            ax.plot(counts, [max(d["total"] for d in state_bytes(cfg, k, s, prec)) / GIB
                             for k in counts], "o-" if j == 0 else "s--", ms=3,
                    color=f"C{s}", label=f"{STAGE_NAMES[s]}, {prec.name}")
    ax.set(xlabel="devices k", ylabel="GiB of training state per device", ylim=(0, None))
    ax.set_xticks(list(counts))
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return ax


def head_activation_elements(cfg: GPTConfig, batch: int) -> dict:
    """What the model keeps outside its blocks, before the logits: the final LayerNorm's input
    (``s b h``) and statistics (``2 s b``) and the tied head's input (``s b h``).  The token
    and position lookups keep only the token ids."""
    _positive("batch", batch)
    sbh, sb = cfg.context * batch * cfg.width, cfg.context * batch
    out = {"lnf input": sbh, "lnf mean": sb, "lnf rstd": sb, "head input": sbh}
    out["total"] = sum(out.values())
    return out


def activation_table(cfg: GPTConfig, batch: int, itemsize: int = 4) -> str:
    """Markdown: the terms of :func:`block_activation_elements` for eager and fused attention,
    in MiB of ``itemsize``-byte elements, and the block's total with each, and recomputed."""
    eager = block_activation_elements(cfg, batch)
    fused = block_activation_elements(cfg, batch, attention="fused")
    full = block_activation_elements(cfg, batch, recompute=True)
    mib = lambda e: f"{e * itemsize / MIB:,.2f}" if e else "--"
    rows = [[t, TERM_FORMULAS[t], mib(eager.get(t, 0)), mib(fused.get(t, 0))]
            for t in TERM_FORMULAS if t in eager or t in fused]
    rows.append(["**one block**", "", mib(eager["total"]), mib(fused["total"])])
    rows.append(["**recomputed** (its input)", TERM_FORMULAS["block input"], mib(full["total"]),
                 mib(full["total"])])
    return _md(["kept for the backward pass", "elements", "eager, MiB", "fused, MiB"], rows)


def _null_formatter():
    from matplotlib.ticker import NullFormatter
    return NullFormatter()


def plot_block_activations(cfg: GPTConfig, batch: int, contexts, itemsize: int = 4, ax=None):
    """Bytes one block keeps against the context (log-log): eager and fused attention and
    recomputation (``itemsize``-byte elements, :func:`block_activation_elements`), and
    Korthikanti et al.'s 16-bit formula with dropout (dotted).  Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    cfgs = [dataclasses.replace(cfg, context=t) for t in contexts]
    for label, kw in (("eager attention", {}), ("fused attention", {"attention": "fused"}),
                      ("recomputed (block input)", {"recompute": True})):
        ax.plot(contexts, [block_activation_elements(c, batch, **kw)["total"] * itemsize / GIB
                           for c in cfgs], "o-", ms=3, label=f"{label}, {8 * itemsize}-bit")
    ax.plot(contexts, [korthikanti_bytes(c, batch) / GIB for c in cfgs], "k:",
            label="Korthikanti et al., 16-bit with dropout")
    ax.set(xscale="log", yscale="log", xlabel="context T (tokens)",
           ylabel=f"GiB one block keeps (batch {batch})")
    ax.set_xticks(list(contexts), [f"{t:,}" for t in contexts])
    ax.xaxis.set_minor_formatter(_null_formatter())
    ax.legend(fontsize=8)
    return ax


def step_memory(cfg: GPTConfig, batch: int, *, attention: str = "eager", recompute: bool = False,
                itemsize: int = 4, chunks: int = 1, k: int = 1, stage=0,
                precision: Precision = FP32_ADAM) -> dict:
    """Bytes of the three parts of a training step's peak on one device, on
    ``batch`` sequences per device: ``state`` (:func:`state_bytes`, the device that holds the
    most), ``activations`` (every block's :func:`block_activation_elements` and
    :func:`head_activation_elements`, ``itemsize`` bytes each; recomputed, every block's input
    plus one block's own while it is recomputed) and ``logits`` (:func:`logits_bytes`, with
    their gradient, ``chunks`` pieces); and ``total``.  A lower bound: a framework's
    temporaries (the cross-entropy's log-probabilities, workspaces) come on top."""
    blocks = cfg.layers * block_activation_elements(cfg, batch, attention=attention,
                                                    recompute=recompute)["total"]
    if recompute:
        blocks += block_activation_elements(cfg, batch, attention=attention)["total"]
    out = {"state": max(d["total"] for d in state_bytes(cfg, k, stage, precision)),
           "activations": (blocks + head_activation_elements(cfg, batch)["total"]) * itemsize,
           "logits": logits_bytes(cfg, batch, itemsize=itemsize, chunks=chunks)}
    out["total"] = sum(out.values())
    return out


def memory_levers(cfg: GPTConfig, batch: int, chunks: int = 8) -> dict:
    """:func:`step_memory` of ``batch`` sequences on one device, lever after lever: float32
    with eager attention; fused attention; 16-bit activations and logits with mixed-precision
    Adam (2 + 2 + 12 bytes a parameter; every activation counted at 2 bytes, the LayerNorm
    statistics too); every block recomputed and the cross-entropy in ``chunks`` pieces."""
    bf16 = {"attention": "fused", "itemsize": 2, "precision": MIXED_ADAM}
    return {"float32, eager attention": step_memory(cfg, batch),
            "float32, fused attention": step_memory(cfg, batch, attention="fused"),
            "+ bfloat16 activations and logits": step_memory(cfg, batch, **bf16),
            f"+ recomputed blocks, loss in {chunks} pieces": step_memory(
                cfg, batch, recompute=True, chunks=chunks, **bf16)}


def step_memory_table(rows: dict) -> str:
    """Markdown: ``{label: step_memory(...)}`` in GiB, one row each."""
    return _md(["GiB on one device", "training state", "activations", "logits and gradient",
                "total"],
               [[label] + [f"{r[p] / GIB:.2f}" for p in ("state", "activations", "logits", "total")]
                for label, r in rows.items()])


def plot_step_memory(rows: dict, ax=None, capacity: float | None = None,
                     capacity_label: str = "the device's memory"):
    """``{label: step_memory(...)}`` as horizontal stacked bars in GiB (state, activations,
    logits), with a device's memory as a dotted line when ``capacity`` (bytes) is given.
    Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 0.55 * len(rows) + 1.4))
    labels = list(rows)
    left = [0.0] * len(labels)
    for part, name in (("state", "training state"), ("activations", "activations"),
                       ("logits", "logits and their gradient")):
        width = [rows[lab][part] / GIB for lab in labels]
        ax.barh(labels, width, left=left, label=name)
        left = [a + b for a, b in zip(left, width)]
    if capacity:
        ax.axvline(capacity / GIB, color="k", ls=":", lw=1, label=capacity_label)
    ax.invert_yaxis()
    ax.set(xlabel="GiB on one device")
    ax.legend(fontsize=8, loc="lower right")
    return ax


def logits_table(cfg: GPTConfig, batch: int, chunk_counts=(8, 64)) -> str:
    """Markdown: the bytes of one step's logits (``batch`` sequences) in float32, with their
    gradient, in bfloat16, and with the cross-entropy in pieces (:func:`logits_bytes`)."""
    rows = [("float32 logits", {"with_grad": False}), ("float32 logits and gradient", {}),
            ("bfloat16 logits and gradient", {"itemsize": 2})]
    rows += [(f"float32, cross-entropy in {c} pieces", {"chunks": c}) for c in chunk_counts]
    out = []
    for label, kw in rows:
        b = logits_bytes(cfg, batch, **kw)
        out.append([label, f"{b:,}", f"{b / GIB:.3f}"])
    return _md([f"{batch} x {cfg.context:,} positions, vocabulary {cfg.vocab:,}", "bytes", "GiB"],
               out)


def _network_link():
    from ..commcost import Link
    return Link("100 Gb/s network", 100e9 / 8,
                "a 100 Gb/s port (InfiniBand EDR, 100 Gigabit Ethernet): 12.5 GB/s each way",
                "NET", None, "Intel CPU")


def comm_links() -> list:
    """The two links the page compares: NVLink 4 between the GPUs of one H100 server
    (:data:`d2lmini.commcost.LINKS`) and a 100 Gb/s network port per GPU (a NET link of
    12.5 GB/s, priced by the same model of NCCL)."""
    from ..commcost import LINKS
    return [LINKS["NVLink 4 (H100 SXM)"], _network_link()]


def comm_rows(cfg: GPTConfig, batch: int, counts, links, peak_flops: float, utilisation: float,
              itemsize: int = 4) -> list[dict]:
    """One row per (link, k): the gradient all-reduce's payload (:func:`grad_bytes`), its time
    by NCCL's model (:func:`d2lmini.commcost.collective_time`), a step's compute on ``batch``
    sequences per device at ``utilisation`` of ``peak_flops``
    (``tokens * flops_per_token / (peak * utilisation)``) and their ratio."""
    from ..commcost import collective_time
    n = grad_bytes(cfg, itemsize)
    compute = batch * cfg.context * flops_per_token(cfg) / (peak_flops * utilisation)
    rows = []
    for link in links:
        for k in counts:
            t = collective_time("all-reduce", n, k, link)
            rows.append({"link": link.name, "k": k, "bytes": n, "allreduce_s": t,
                         "compute_s": compute, "ratio": t / compute})
    return rows


def comm_table(rows: list[dict]) -> str:
    """Markdown: :func:`comm_rows` in milliseconds."""
    return _md(["link", "devices", "all-reduce (ms)", "compute (ms)", "all-reduce / compute"],
               [[r["link"], r["k"], f"{1e3 * r['allreduce_s']:.2f}", f"{1e3 * r['compute_s']:.1f}",
                 f"{r['ratio']:.2f}"] for r in rows])


def plot_comm(rows: list[dict], ax=None):
    """The all-reduce's time against k for each link of :func:`comm_rows`, and a step's
    compute (dashed).  Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.4))
    for link in dict.fromkeys(r["link"] for r in rows):
        rs = [r for r in rows if r["link"] == link]
        ax.plot([r["k"] for r in rs], [1e3 * r["allreduce_s"] for r in rs], "o-", ms=3,
                label=f"gradient all-reduce, {link}")
    ax.axhline(1e3 * rows[0]["compute_s"], color="k", ls="--", lw=1, label="compute of one step")
    top = max(max(r["allreduce_s"], r["compute_s"]) for r in rows)
    ax.set(xlabel="devices k", ylabel="ms per step", ylim=(0, 1.5e3 * top))
    ax.set_xticks(sorted({r["k"] for r in rows}))
    ax.legend(fontsize=8, loc="upper left")
    return ax


#: published throughputs of GPT-2 small's training, with their sources
REFERENCE_POINTS = [
    {"what": "llm.c (C/CUDA), GPT-2 124M, one H100", "tokens_per_s": 471e3, "reported_mfu": 0.38,
     "card": "H100 SXM",
     "source": "llm.c (Karpathy): about 471 k tokens/s per H100 at about 38 % MFU"},
]


def mfu_table(cfg: GPTConfig, points=None) -> str:
    """Markdown: each published point's tokens/s, the MFU it reports and the MFU by this
    page's convention (:func:`mfu` against the card's dense bfloat16 peak,
    :data:`d2lmini.commcost.CARDS`); then this book's own GPU row, none measured yet."""
    from ..commcost import card
    rows = []
    for p in REFERENCE_POINTS if points is None else points:
        peak = card(p["card"]).gpu.peak("bf16")
        rows.append([p["what"], f"{p['tokens_per_s']:,.0f}", f"{p['reported_mfu']:.0%}",
                     f"{mfu(p['tokens_per_s'], cfg, peak):.1%} of {peak / 1e12:,.1f} TFLOP/s"])
    rows.append(["this book, GPT-2 small, one H200", "unconfirmed on GPU", "--", "--"])
    return _md(["training", "tokens/s", "MFU reported", "MFU, 6N + 12LTh"], rows)


def plot_mfu(cfg: GPTConfig, cards=("H100 SXM", "A100 SXM"), points=None, ax=None):
    """Tokens/s per GPU against MFU for each card's dense bfloat16 peak (the lines
    ``tokens/s = MFU x peak / flops_per_token``), with the published points.  Returns the
    axes."""
    import matplotlib.pyplot as plt
    from ..commcost import card
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.4))
    u = [i / 100 for i in range(0, 71, 5)]
    per_token = flops_per_token(cfg)
    for key in cards:
        peak = card(key).gpu.peak("bf16")
        ax.plot([100 * x for x in u], [x * peak / per_token / 1e3 for x in u], "-",
                label=f"{key}, {peak / 1e12:,.0f} TFLOP/s bf16")
    for p in REFERENCE_POINTS if points is None else points:
        m = mfu(p["tokens_per_s"], cfg, card(p["card"]).gpu.peak("bf16"))
        ax.plot([100 * m], [p["tokens_per_s"] / 1e3], "k*", ms=9)
        ax.annotate(p["what"].split(",")[0], (100 * m, p["tokens_per_s"] / 1e3),
                    textcoords="offset points", xytext=(6, -10), fontsize=8)
    ax.set(xlabel="MFU (%)", ylabel="thousand tokens/s per GPU", xlim=(0, 70), ylim=(0, None))
    ax.legend(fontsize=8, loc="upper left")
    return ax


def loss_floor_table(rows: list[dict], vocab: int) -> str:
    """Markdown: :func:`d2lmini.gpt.entropy_table`'s rows (nats per character), after the
    uniform guess ``ln(vocab)``."""
    out = [["uniform guess", f"{math.log(vocab):.3f}", f"{math.log(vocab):.3f}"]]
    out += [[f"{r['n']}-gram" + (" (characters alone)" if r["n"] == 1 else ""),
             f"{r['val_entropy']:.3f}", f"{r['heldout_cross_entropy']:.3f}"] for r in rows]
    return _md(["model of the next character", "entropy of the held-out novel",
                "cross-entropy, counted on the other five"], out)


def plot_loss_floor(rows: list[dict], vocab: int, ax=None):
    """The held-out cross-entropy of each n-gram model and the uniform guess (bars, nats per
    character).  Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.0))
    labels = ["uniform"] + [f"{r['n']}-gram" for r in rows]
    values = [math.log(vocab)] + [r["heldout_cross_entropy"] for r in rows]
    ax.bar(labels, values, color=["gray"] + [f"C{i}" for i in range(len(rows))])
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="nats per character, held-out novel", ylim=(0, 1.15 * max(values)))
    return ax
