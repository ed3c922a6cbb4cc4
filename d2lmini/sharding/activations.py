"""Activations and recomputation (activation checkpointing): the activation bytes of one
device through a forward and backward pass of the peak section's MLP when only every s-th
layer's input is kept and the others are recomputed, and the forward FLOPs that adds."""
from __future__ import annotations

import math

from .peak import MLP_WIDTHS, _Timeline

#: the segment lengths the notebooks measure: 0 keeps every layer's input (no recomputation);
#: s >= 1 keeps the input of every s-th layer (0, s, 2s, ...) and recomputes the others
RECOMPUTE_SEGMENTS = (0, 1, 2, 3, 4, 8)
#: examples per device in the recomputation section: enough that activations outweigh one layer
RECOMPUTE_ROWS = 256


def _kept(l: int, segment: int) -> bool:
    return segment == 0 or l % segment == 0


def activation_timeline(rows: int, segment: int = 0, widths=MLP_WIDTHS,
                        itemsize: int = 4) -> list[tuple[str, dict[str, int]]]:
    """The activation bytes one device holds at every moment of one forward and backward pass
    of an MLP (``widths``; ReLU between layers) on ``rows`` examples, with recomputation
    (activation checkpointing) by segments of ``segment`` layers (0: none).

    - forward: the examples x_0, then each layer's output x_{l+1}; a layer's input x_l is
      freed once x_{l+1} exists unless it is a checkpoint (segment 0: every input is kept;
      else the inputs of layers 0, s, 2s, ...); the logits are replaced by the loss gradient dz;
    - backward, segment by segment from the last: the segment's inputs that were not kept
      are recomputed from its checkpoint, in order (one more forward of those layers); then,
      last layer first, dz is replaced by the gradient of the layer's input, and the input
      is freed.

    The same moments as :func:`.peak_timeline`'s replicated step (activations only); the
    parameter gradients go into the state's buffer and are not counted here."""
    L = len(widths) - 1
    if segment < 0 or rows < 1:
        raise ValueError(f"need segment >= 0 and rows >= 1, got {segment}, {rows}")
    s = segment or L
    t, act = _Timeline(), (lambda d: rows * d * itemsize)
    t.alloc("x0", "activations", act(widths[0]), "forward: the examples")
    for l in range(L):
        t.alloc(f"x{l + 1}", "activations", act(widths[l + 1]), f"forward: layer {l + 1}")
        if not _kept(l, segment):
            t.free(f"x{l}")
    t.free(f"x{L}")
    t.alloc("dz", "activations", act(widths[L]), "loss gradient")
    for a in reversed(range(0, L, s)):
        b = min(a + s, L)
        for l in range(a, b - 1):
            if not _kept(l + 1, segment):
                t.alloc(f"x{l + 1}", "activations", act(widths[l + 1]),
                        f"backward: recompute layer {l + 1}")
        for l in reversed(range(a, b)):
            t.free("dz")
            if l > 0:
                t.alloc("dz", "activations", act(widths[l]),
                        f"backward: layer {l + 1} input gradient")
            t.free(f"x{l}")
    return t.moments


def activation_peak(rows: int, segment: int = 0, widths=MLP_WIDTHS, itemsize: int = 4) -> int:
    """Peak activation bytes of :func:`activation_timeline`."""
    return max(sum(p.values()) for _, p in activation_timeline(rows, segment, widths, itemsize))


def recompute_flops(rows: int, segment: int = 0, widths=MLP_WIDTHS) -> dict:
    """Matrix-product FLOPs of one step of the MLP (forward, backward: weight gradients and,
    above the first layer, input gradients) and the extra forward FLOPs that recomputation by
    ``segment`` adds; biases, ReLU and softmax are left out."""
    L = len(widths) - 1
    mm = [2 * rows * a * b for a, b in zip(widths[:-1], widths[1:])]
    step = sum(mm) + sum(mm) + sum(mm[1:])
    extra = sum(mm[l] for l in range(L - 1) if not _kept(l + 1, segment))
    return {"step": step, "extra": extra, "extra_fraction": extra / step}


def activation_rows(measure, segments=RECOMPUTE_SEGMENTS, rows: int = RECOMPUTE_ROWS,
                    widths=MLP_WIDTHS) -> list[dict]:
    """Measure and compare: ``measure(segment)`` returns the peak activation bytes of one
    device.  One row per segment: measured, formula, the kept inputs, the extra compute."""
    L, out = len(widths) - 1, []
    for s in segments:
        flops = recompute_flops(rows, s, widths)
        out.append({"segment": s, "measured": int(measure(s)),
                    "formula": activation_peak(rows, s, widths),
                    "kept": sum(_kept(l, s) for l in range(L)),
                    "extra_fraction": flops["extra_fraction"]})
    return out


def activation_table(rows: list[dict], unit: int = 1 << 20) -> str:
    """The rows of :func:`activation_rows` as a text table (MiB by default)."""
    head = (f"{'segment':>7}  {'inputs kept':>11}  {'measured':>8}  {'formula':>8}  "
            f"{'vs none':>7}  {'extra compute':>13}")
    none = next((r["measured"] for r in rows if r["segment"] == 0), None)
    lines = [head, "-" * len(head)]
    for r in rows:
        rel = f"{r['measured'] / none:7.2f}" if none else f"{'':>7}"
        lines.append(f"{r['segment'] or 'none':>7}  {r['kept']:>11}  {r['measured'] / unit:>8.2f}  "
                     f"{r['formula'] / unit:>8.2f}  {rel}  {100 * r['extra_fraction']:>12.0f}%")
    return "\n".join(lines)


def plot_activations(rows: list[dict], depths=(8, 32, 128), width: int = 256,
                     batch: int = RECOMPUTE_ROWS, ax=None):
    """Peak activation memory against extra compute, one point per segment length: the
    measured rows (markers) and the formula for deeper MLPs of the same width (lines), each
    relative to keeping every input.  Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.5))
    none = next(r["measured"] for r in rows if r["segment"] == 0)
    for depth in depths:
        widths = (MLP_WIDTHS[0],) + (width,) * (depth - 1) + (MLP_WIDTHS[-1],)
        segs = sorted({s for s in range(1, depth + 1) if depth % s == 0 or s == round(math.sqrt(depth))})
        base = activation_peak(batch, 0, widths)
        pts = [(100 * recompute_flops(batch, s, widths)["extra_fraction"],
                activation_peak(batch, s, widths) / base) for s in [0] + segs]
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, ys, "-", alpha=0.6, label=f"formula, {depth} layers")
    xs = [100 * r["extra_fraction"] for r in rows]
    ys = [r["measured"] / none for r in rows]
    ax.plot(xs, ys, "ko", label="measured, this notebook's MLP")
    for r, x, y in zip(rows, xs, ys):
        ax.annotate(f"s={r['segment']}" if r["segment"] else "none", (x, y),
                    textcoords="offset points", fontsize=8,
                    xytext=(4, -11) if r["segment"] == 1 else (4, 4))
    ax.set_xlabel("extra compute: recomputed forward, % of the step's FLOPs")
    ax.set_ylabel("peak activations / without recomputation")
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=8)
    return ax




#: What a transformer layer keeps for its backward pass (Korthikanti et al. 2022, *Reducing
#: Activation Recomputation in Large Transformer Models*, section 4.1), in bytes with 16-bit
#: activations: ``none`` stores everything, ``s b h (34 + 5 a s / h)`` -- the 5 a s / h part is
#: attention's a score matrices of s x s per sample (softmax input and output, dropout mask);
#: ``selective`` (or a fused attention kernel such as FlashAttention, which never stores the
#: scores) keeps ``34 s b h``; ``full`` recomputation keeps only the layer's input, ``2 s b h``.
TRANSFORMER_RECOMPUTE = ("none", "selective", "full")


def transformer_activation_bytes(seq: int, batch: int, width: int, heads: int, *,
                                 layers: int = 1, recompute: str = "none") -> float:
    """Activation bytes of ``layers`` transformer layers for one step (sequence ``seq``, batch
    ``batch``, hidden size ``width``, ``heads`` attention heads; 16-bit activations, no tensor
    or sequence parallelism; Korthikanti et al. 2022, equation 1 and section 4).  For GPT-3
    (s = 2048, h = 12288, a = 96) the attention term 5 a s / h is 80, more than the rest's 34:

    >>> from d2lmini.sharding import transformer_activation_bytes as act
    >>> s, h, a = 2048, 12288, 96
    >>> act(s, 1, h, a) / (s * h), act(s, 1, h, a, recompute="selective") / (s * h)
    (114.0, 34.0)
    >>> act(s, 1, h, a, recompute="full") / (s * h)
    2.0
    """
    if recompute not in TRANSFORMER_RECOMPUTE:
        raise ValueError(f"recompute must be one of {TRANSFORMER_RECOMPUTE}, got {recompute!r}")
    for name, v in (("seq", seq), ("batch", batch), ("width", width), ("heads", heads),
                    ("layers", layers)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if width % heads:
        raise ValueError(f"width {width} is not divisible by {heads} heads")
    sbh = seq * batch * width
    per_layer = {"none": sbh * (34 + 5 * heads * seq / width), "selective": 34 * sbh,
                 "full": 2 * sbh}[recompute]
    return layers * per_layer
