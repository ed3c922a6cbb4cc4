"""What the GPT costs, in closed form (NumPy only): where its parameters are, the bytes one
block keeps for its backward pass, the logits' bytes, the training state per device at each
ZeRO stage, what a gradient all-reduce sends, and the model FLOPs utilisation (MFU).

The chapter's neutral page (``chapters/gpt/model.ipynb``) shows these formulas (its tables and
figures: ``d2lmini.gpt.figures``); the four labs
measure the same quantities in their framework and compare.  Everything that is not specific
to the GPT is reused: the training state per ZeRO stage is ``d2lmini.sharding.state_bytes``,
Korthikanti et al.'s activation formula ``d2lmini.sharding.transformer_activation_bytes``,
the FLOPs per token ``d2lmini.gpt.spec.flops_per_token``.

Notation of the docstrings (Korthikanti et al.'s): s the sequence length (``cfg.context``),
b the sequences of a batch, h the width, a the attention heads, L the layers, V the vocabulary.
"""
from __future__ import annotations


from ..sharding import FP32_ADAM, Precision, zero_stage
from ..sharding import state_bytes as _state_bytes
from ..sharding import transformer_activation_bytes
from .spec import GPTConfig, flops_per_token, param_count

__all__ = ["param_breakdown", "block_activation_elements", "korthikanti_bytes", "logits_bytes",
           "state_bytes", "grad_bytes", "mfu", "ATTENTION_KINDS"]

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
    ``d2lmini.gpt.param_count`` with the position embedding.  GPT-2 small with nanoGPT's
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
    ``d2lmini.sharding.transformer_activation_bytes`` with ``layers=1``) on ``batch``
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
    between steps at ZeRO ``stage`` (0-3 or a name, ``d2lmini.sharding.zero_stage``):
    ``d2lmini.sharding.state_bytes`` of ``d2lmini.gpt.param_count`` (position
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
    ``d2lmini.commcost.collective_time``).

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
    FLOP/s.  ``d2lmini.gpt.flops_per_token``'s convention is PaLM's ``6 N + 12 L H Q T``
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
