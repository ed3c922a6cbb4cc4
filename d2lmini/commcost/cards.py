"""The GPU cards the book predicts for, one record each: ``CARDS``.

A card's record holds what the cost model needs of it: its peak rates per numerics (a
:class:`.Gpu`), the link that joins the GPUs of one server and how many a server holds, its
network card (one per GPU on the servers the book models), its memory bandwidth, and the
folder of ``benchmarks/`` where its measured runs are (``None``: none yet).  Adding a card is
one entry; the chapters name a card by its key (``cc.card("H100 SXM")``) and take everything
else from the record (its servers: ``hierarchy.cluster_of``).  Sources are the vendors' datasheets, named in each field's object.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..locations import records
from .nccl import LINKS, NODE_GPUS, Link
from .workload import GPUS, Gpu

__all__ = ["Card", "CARDS", "card", "runs_of"]


@dataclass(frozen=True)
class Card:
    key: str
    gpu: Gpu                        # peak rates per numerics (Gpu.peak)
    link: Link                      # between the GPUs of one server
    nic: Link | None                # the network card of each GPU (a NET link), if any
    hbm_bytes_per_s: float          # memory bandwidth, datasheet
    memory_bytes: float             # memory per GPU, datasheet
    node_gpus: int = NODE_GPUS      # GPUs per server
    runs: str | None = None         # folder of benchmarks/ with this card's measured runs
    source: str = ""

    def __post_init__(self):
        if self.nic is not None and self.nic.hw != "NET":
            raise ValueError(f"{self.key}: the network card must be a NET link, "
                             f"not {self.nic.name} ({self.nic.hw})")
        if self.node_gpus < 1:
            raise ValueError(f"{self.key}: a server holds at least one GPU")


CARDS: dict[str, Card] = {c.key: c for c in (
    Card("H100 SXM", GPUS["H100 SXM"], LINKS["NVLink 4 (H100 SXM)"], LINKS["InfiniBand NDR"],
         3.35e12, 80e9, runs="h100-2026-11-25",
         source="NVIDIA H100 Tensor Core GPU datasheet (SXM): 80 GB HBM3, 3.35 TB/s"),
    # The H200 is the H100's compute chip with more and faster memory: the same peaks and
    # NVLink 4, 141 GB of HBM3e at 4.8 TB/s.
    Card("H200 SXM", Gpu("H200 SXM", GPUS["H100 SXM"].fp32_flops,
                         "NVIDIA H200 Tensor Core GPU datasheet: the H100's compute (FP32 67, "
                         "dense TF32 494.7, BF16 989.4 TFLOPS)",
                         GPUS["H100 SXM"].tf32_flops, GPUS["H100 SXM"].bf16_flops),
         LINKS["NVLink 4 (H100 SXM)"], LINKS["InfiniBand NDR"], 4.8e12, 141e9,
         runs="h200-2026-11-27",
         source="NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s"),
    Card("A100 SXM", GPUS["A100 SXM"], LINKS["NVLink 3 (A100 SXM)"], LINKS["InfiniBand HDR"],
         2.039e12, 80e9,
         source="NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM): 2,039 GB/s"),
)}


def card(key: str) -> Card:
    """The card called ``key``; a ``KeyError`` naming the catalogue's keys otherwise."""
    try:
        return CARDS[key]
    except KeyError:
        raise KeyError(f"no card {key!r} in d2lmini.commcost.CARDS: {', '.join(CARDS)} "
                       "(adding one is one Card entry in d2lmini/commcost/cards.py)") from None


def runs_of(key: str):
    """The folder of ``benchmarks/`` that holds the card's measured runs."""
    c = card(key)
    if c.runs is None:
        raise FileNotFoundError(f"no measured runs of the {key} are recorded yet "
                                "(a GPU run writes them: make gpu-bench)")
    return records(c.runs)
