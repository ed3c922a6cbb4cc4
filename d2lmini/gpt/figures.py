"""The GPT chapter's neutral page's tables and figures, drawn from :mod:`d2lmini.gpt.cost`'s
formulas (``chapters/gpt/model.ipynb`` shows one call each; ``tools/overview_figures.py`` draws
the overview's figure with :func:`plot_step_memory`)."""
from __future__ import annotations

import dataclasses
import math

from ..sharding import FP32_ADAM, MIXED_ADAM, Precision
from .cost import (_positive, block_activation_elements, grad_bytes, korthikanti_bytes,
                   logits_bytes, mfu, param_breakdown, state_bytes)
from .spec import GPTConfig, flops_per_token, param_count

__all__ = ["GIB", "MIB", "TERM_FORMULAS", "chapter_models", "param_table", "plot_param_breakdown", "attention_share", "flops_table", "plot_attention_share", "batch_table", "state_table", "plot_state", "head_activation_elements", "activation_table", "plot_block_activations", "step_memory", "memory_levers", "step_memory_table", "plot_step_memory", "logits_table", "comm_links", "comm_rows", "comm_table", "plot_comm", "REFERENCE_POINTS", "mfu_table", "plot_mfu", "loss_floor_table", "plot_loss_floor"]

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
