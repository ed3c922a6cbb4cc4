"""The stages in time: the collectives one step of each scheme issues, and their predicted
seconds on k GPUs with NCCL's cost model (:mod:`d2lmini.commcost`)."""
from __future__ import annotations

from ..commcost.alphabeta import collective_coefficients
from ..commcost.formatting import fmt_seconds
from ..commcost.nccl import collective_time
from .peak import SCHEMES
from .state import STAGE_NAMES


def step_collectives(sizes, stage_or_scheme, itemsize: int = 4) -> list[tuple[str, int]]:
    """The collectives one training step issues, ``[(op, bytes of the whole buffer), ...]``,
    for a model whose sharding units (layers) have ``sizes`` parameters: replicated, one
    all-reduce of the gradient; ZeRO-1 and -2, a reduce-scatter of the gradient and an
    all-gather of the updated parameters; ZeRO-3 by whole model (gathered once per step), an
    all-gather and a reduce-scatter; ZeRO-2 by layer, a reduce-scatter per layer (its bucket,
    during the backward pass) and an all-gather per layer after the update; ZeRO-3 by layer,
    per layer two all-gathers (forward and backward) and one reduce-scatter.  By whole model,
    one collective per buffer."""
    scheme = STAGE_NAMES.get(stage_or_scheme, stage_or_scheme)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {stage_or_scheme!r}")
    n = sum(sizes) * itemsize
    if scheme == "replicated":
        return [("all-reduce", n)]
    if scheme in ("ZeRO-1", "ZeRO-2"):
        return [("reduce-scatter", n), ("all-gather", n)]
    if scheme == "ZeRO-3":
        return [("all-gather", n), ("reduce-scatter", n)]
    if scheme == "ZeRO-2 by layer":
        return ([("reduce-scatter", s * itemsize) for s in reversed(sizes)]
                + [("all-gather", s * itemsize) for s in sizes])
    return [(op, s * itemsize) for s in sizes
            for op in ("all-gather", "all-gather", "reduce-scatter")]


def step_comm_time(sizes, k: int, scheme, link, itemsize: int = 4) -> float:
    """Predicted seconds of the collectives of one step (:func:`step_collectives`) on k GPUs
    over ``link``, each with NCCL's latency and bandwidth model
    (:func:`d2lmini.commcost.collective_time`), run one after another (no overlap)."""
    return float(sum(collective_time(op, b, k, link) for op, b in
                     step_collectives(sizes, scheme, itemsize)))


def stage_time_rows(models: dict, k: int, links, itemsize: int = 4) -> list[dict]:
    """One row per (model, link, scheme): the bytes each device sends in a step (ring) and
    the predicted collective time, and both relative to replicated.  ``models``:
    ``{name: layer sizes}`` (each of ``itemsize`` bytes) or ``{name: (layer sizes, itemsize)}``;
    ``links``: :class:`d2lmini.commcost.Link` objects."""
    out = []
    for name, model in models.items():
        sizes, size = (model if isinstance(model, tuple) and len(model) == 2
                       and isinstance(model[0], (list, tuple)) else (model, itemsize))
        for link in links:
            base = step_comm_time(sizes, k, "replicated", link, size)
            for scheme in SCHEMES:
                t = step_comm_time(sizes, k, scheme, link, size)
                sent = sum(collective_coefficients(op, k)[1] * b     # bytes per device, ring
                           for op, b in step_collectives(sizes, scheme, size))
                out.append({"model": name, "parameters": sum(sizes), "layers": len(sizes),
                            "link": link.name, "scheme": scheme, "sent": sent, "seconds": t,
                            "vs_replicated": t / base if base else float("nan")})
    return out


def stage_time_table(rows: list[dict]) -> str:
    """The rows of :func:`stage_time_rows` as a Markdown table: one row per model and link,
    one column per scheme, the predicted time and its ratio to replicated."""
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    lines = ["| model | link | " + " | ".join(schemes) + " |",
             "|---|---|" + "---:|" * len(schemes)]
    for key in dict.fromkeys((r["model"], r["link"]) for r in rows):
        cells = {r["scheme"]: r for r in rows if (r["model"], r["link"]) == key}
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(
            f"{fmt_seconds(cells[s]['seconds'])} ({cells[s]['vs_replicated']:.2f}x)" for s in schemes) + " |")
    return "\n".join(lines)
