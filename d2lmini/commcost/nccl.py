"""NCCL's own cost model of its collectives (src/graph/tuning.cc), and the links it prices them
on (``LINKS``, from their datasheets): ``collective_time`` and the algorithm and protocol
NCCL picks (``nccl_choice``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .alphabeta import collective_coefficients


# ------------------------------------------------------------------------------------------
# NCCL's own cost model (src/graph/tuning.cc), read in NCCL 2.28.9 -- the NCCL of the PyTorch
# 2.11 that measured the H100 step -- where the defaults are the struct
# ncclTunerConstantsDefaults, fields .baseLatencies[algorithm][protocol] and
# .hwLatencies[NVLINK|PCI|NET][algorithm][protocol], in microseconds (the ring's rows are the
# same in NCCL 2.21.5, where they are the arrays baseLat and hwLat, and in 2.30.7).  NCCL prices
# a collective as  latency + bytes / bandwidth,  with the latency of a ring on one node
#     baseLatencies[Ring][p] + nsteps * hwLatencies[NVLINK or PCI][Ring][p]
# (nsteps = 2(k-1) for all-reduce, k-1 for reduce-scatter and all-gather), and across nodes with
# one GPU each ("ppn == 1: latencies are fully exposed, use the Tree network latency")
#     baseLatencies[Ring][p] + nsteps * hwLatencies[NET][Tree][p]
# plus the network's own latency, which NCCL's InfiniBand transport reports as 0 ("Not set").
# The protocol's bandwidth: LL moves 4 bytes of data per 8 (busBw * .5, and at most
# .llMaxBws[row][N1 | N2 | N4], the row by GPU generation on one node, by CPU vendor across
# nodes), LL128 120 of 128 (busBw * 0.92), Simple all of it.  The tree (all-reduce only) is
# priced too, with baseLatencies[Tree], a chain of hwLatencies[..][Tree] hops inside a node and
# log2(nodes) levels across, half its bus bandwidth and treeCorrectionFactor; the faster of
# ring and tree is kept, as NCCL picks.  Left out: the per-channel caps (perChMax*Bws times
# the number of channels), NVLS and CollNet, and the measured bandwidth of each channel (we
# take the datasheet's link speed).
# ------------------------------------------------------------------------------------------
PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_VERSION_READ = "2.28.9"
NCCL_SOURCE = (f"NCCL {NCCL_VERSION_READ}, src/graph/tuning.cc: ncclTunerConstantsDefaults "
               ".baseLatencies and .hwLatencies (us)")
NCCL_BASE_LATENCY_US = {                     # .baseLatencies, per protocol LL, LL128, Simple
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
}
NCCL_HW_LATENCY_US = {                       # .hwLatencies, per protocol LL, LL128, Simple
    "NVLINK": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "PCI": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "NET": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
NCCL_RING_EFFICIENCY = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}   # tuning.cc, "model refinements"
# The tree's refinements for all-reduce (tuning.cc): 0.92 of the bus bandwidth, LL a further
# 1/3.8 (capped by llMaxBws), LL128 7/9 in one node and 120/128 across nodes; the algorithm
# bandwidth is half the bus bandwidth (every byte goes up the tree and down again).
NCCL_TREE_EFFICIENCY = 0.92
NCCL_TREE_LL_FACTOR = 1 / 3.8
NCCL_TREE_LL128_FACTOR = {"one node": 7 / 9, "nodes": 120 / 128}
# ncclTopoGetAlgoTime: the tree's bandwidth corrected per message size, 64 B << i for
# i = 0..22 (treeCorrectionFactor), and a multi-node Simple ring all-reduce's latency times 1.4
# on sm80 and later GPUs ("plateau effect of ring") once a rank's share of a channel is 64 B.
NCCL_TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}
NCCL_RING_PLATEAU = 1.4
ALGORITHMS = ("ring", "tree")
NCCL_LL_MAX_BW = {                           # .llMaxBws rows, GB/s, for N1, N2, N4 (nodes)
    "Ampere": (87.7, 22.5, 19.0), "Hopper": (141.0, 45.0, 35.0), "Intel CPU": (39.0, 39.0, 20.4),
}


@dataclass(frozen=True)
class Link:
    """A link between GPUs: its bandwidth per direction per GPU (bytes/s) from its source, and
    the row of NCCL's latency table it uses (``hw``: NVLINK, PCI, or NET for a ring with one GPU
    per node)."""
    name: str
    bandwidth: float
    source: str
    hw: str = "NVLINK"
    domain: int | None = None       # the most GPUs one such link joins (None: no such limit)
    ll_max_bw: str | None = None    # the row of NCCL_LL_MAX_BW that caps LL (None: no cap)

    def __post_init__(self):
        if self.hw not in NCCL_HW_LATENCY_US:
            raise ValueError(f"hw must be one of {tuple(NCCL_HW_LATENCY_US)}, got {self.hw!r}")
        if self.ll_max_bw is not None and self.ll_max_bw not in NCCL_LL_MAX_BW:
            raise ValueError(f"ll_max_bw must be one of {tuple(NCCL_LL_MAX_BW)} or None")

    @property
    def beta(self) -> float:
        return 1.0 / self.bandwidth

    def hop_latency(self, protocol: str) -> float:
        """Seconds NCCL adds per ring step on this link (its hwLatencies entry)."""
        column = "tree" if self.hw == "NET" else "ring"   # one GPU per node: the NET tree column
        return NCCL_HW_LATENCY_US[self.hw][column][PROTOCOLS.index(protocol)] * 1e-6

    @property
    def latency_source(self) -> str:
        column = "Tree (one GPU per node)" if self.hw == "NET" else "Ring"
        return (f"{NCCL_SOURCE}: baseLatencies[Ring] + steps x hwLatencies[{self.hw}]"
                f"[{column}]")

    @property
    def protocols(self) -> tuple[str, ...]:
        """The protocols NCCL enables on this link by default: LL128 only where the GPUs of a
        node talk over NVLink (tuning.cc: ``pEnable &= (graphs[a]->typeIntra <= PATH_NVB)``),
        so not between GPUs that share only PCIe."""
        return ("LL", "Simple") if self.hw == "PCI" else PROTOCOLS

    def protocol_bandwidth(self, protocol: str, k: int) -> float:
        """Bytes/s NCCL's model gives the ring with ``protocol`` over this link on k GPUs (one
        per node over the network): the link's bandwidth times the protocol's efficiency, LL
        capped by llMaxBws."""
        bw = self.bandwidth * NCCL_RING_EFFICIENCY[protocol]
        if protocol == "LL" and self.ll_max_bw is not None:
            nodes = k if self.hw == "NET" else 1
            bw = min(bw, NCCL_LL_MAX_BW[self.ll_max_bw][min(nodes - 1, 2)] * 1e9)
        return bw


def nodes_of(k: int, link: Link) -> int:
    """How many nodes k GPUs on ``link`` span: one GPU per node over the network (NET), one
    node over NVLink or PCIe."""
    return k if link.hw == "NET" else 1


def _log2i(n: int) -> int:
    return int(math.floor(math.log2(n))) if n >= 1 else -1


def nccl_latency(op: str, k: int, link: Link, protocol: str, algorithm: str = "ring") -> float:
    """NCCL's latency term of ``op`` on k GPUs over ``link`` with ``protocol`` (seconds); 0 for
    k = 1.  The ring: the base latency plus one hop latency per step.  The tree (all-reduce
    only): the base latency plus ``2 ((k/nodes - 1) intra + log2(nodes) inter)`` -- a chain
    inside a node, a binary tree across nodes (tuning.cc)."""
    if k == 1:
        return 0.0
    i = PROTOCOLS.index(protocol)
    if algorithm == "ring":
        a, _ = collective_coefficients(op, k)
        return NCCL_BASE_LATENCY_US["ring"][i] * 1e-6 + a * link.hop_latency(protocol)
    if algorithm != "tree" or op != "all-reduce":
        raise ValueError(f"NCCL's tree runs all-reduce only; got {algorithm!r} for {op!r}")
    nodes = nodes_of(k, link)
    intra = NCCL_HW_LATENCY_US["PCI" if link.hw == "PCI" else "NVLINK"]["tree"][i]
    inter = NCCL_HW_LATENCY_US["NET"]["tree"][i]                 # one GPU per node: the tree's
    return (NCCL_BASE_LATENCY_US["tree"][i]
            + 2 * ((k // nodes - 1) * intra + _log2i(nodes) * inter)) * 1e-6


def tree_bandwidth(link: Link, protocol: str, k: int) -> float:
    """Algorithm bytes/s of NCCL's tree all-reduce over ``link`` with ``protocol`` (before the
    per-size correction): the refinements of ``NCCL_TREE_EFFICIENCY`` and the factors
    below it, halved (every byte goes up and down the tree)."""
    bus = link.bandwidth * NCCL_TREE_EFFICIENCY
    nodes = nodes_of(k, link)
    if protocol == "LL":
        bus *= NCCL_TREE_LL_FACTOR
        if link.ll_max_bw is not None:
            bus = min(bus, NCCL_LL_MAX_BW[link.ll_max_bw][min(nodes - 1, 2)] * 1e9)
    elif protocol == "LL128":
        bus *= NCCL_TREE_LL128_FACTOR["one node" if nodes == 1 else "nodes"]
    return 0.5 * bus


def _tree_correction(protocol: str, n: np.ndarray) -> np.ndarray:
    out = np.ones(n.shape)
    for j, size in np.ndenumerate(n):
        log_size = _log2i(int(size) >> 6)
        if 0 <= log_size < len(NCCL_TREE_CORRECTION[protocol]):
            out[j] = NCCL_TREE_CORRECTION[protocol][log_size]
    return out


def _algo_times(op: str, n_bytes, k: int, link: Link) -> dict:
    """``{(algorithm, protocol): seconds}`` of NCCL's model for every algorithm and protocol
    the link enables (the tree for all-reduce only); ``n_bytes`` may be an array."""
    _, b = collective_coefficients(op, k)
    n = np.asarray(n_bytes, dtype=float)
    out = {}
    for p in link.protocols:
        lat = np.full(n.shape, nccl_latency(op, k, link, p))
        if op == "all-reduce" and p == "Simple" and nodes_of(k, link) > 1:
            lat = np.where(n / k >= 64, lat * NCCL_RING_PLATEAU, lat)      # one channel assumed
        out["ring", p] = lat + b * n / link.protocol_bandwidth(p, k)
        if op == "all-reduce":
            out["tree", p] = (nccl_latency(op, k, link, p, "tree")
                              + n / (tree_bandwidth(link, p, k) * _tree_correction(p, n)))
    return out


def collective_time(op: str, n_bytes, k: int, link: Link, protocol: str | None = None,
                    algorithm: str | None = None):
    """Predicted seconds of NCCL's ``op`` ("all-reduce", "reduce-scatter", "all-gather") of a
    buffer of ``n_bytes`` (the whole buffer) on k GPUs over ``link``, by NCCL's own model
    (tuning.cc): the ring -- :func:`nccl_latency` plus ``b(k) * n`` over the protocol's
    bandwidth (:meth:`Link.protocol_bandwidth`) -- and, for all-reduce, the tree
    (:func:`tree_bandwidth`, corrected per size).  ``protocol``/``algorithm`` None: the
    fastest the link enables, as NCCL picks by its predicted time.  0 on one GPU.
    ``n_bytes`` may be an array.  For this machine's fitted alpha and beta instead of NCCL's
    figures, see :func:`.collective_model_time`."""
    if k == 1:
        return 0.0 * np.asarray(n_bytes, dtype=float) if np.ndim(n_bytes) else 0.0
    if protocol is not None and protocol not in link.protocols:
        raise ValueError(f"NCCL does not enable {protocol} on {link.name} (it enables "
                         f"{', '.join(link.protocols)})")
    times = {key: t for key, t in _algo_times(op, n_bytes, k, link).items()
             if (protocol is None or key[1] == protocol)
             and (algorithm is None or key[0] == algorithm)}
    if not times:
        raise ValueError(f"NCCL's model has no {algorithm} {op}")
    out = np.min(np.stack(list(times.values())), axis=0)
    return out if np.ndim(out) else float(out)


def nccl_choice(op: str, n_bytes: float, k: int, link: Link) -> tuple[str, str]:
    """The (algorithm, protocol) NCCL's model finds fastest for this collective."""
    if k == 1:
        return "none", "none"
    times = _algo_times(op, float(n_bytes), k, link)
    return min(times, key=lambda key: float(times[key]))


def nccl_protocol(op: str, n_bytes: float, k: int, link: Link) -> str:
    """The protocol of :func:`nccl_choice` ("none" for k = 1)."""
    return nccl_choice(op, n_bytes, k, link)[1]


def _pcie_x16(gigatransfers: float) -> float:
    """Bytes/s per direction of a PCIe x16 link with 128b/130b encoding (PCIe 3.0 and later)."""
    return gigatransfers * 1e9 * 16 * 128 / 130 / 8


# NVLink joins the GPUs of one server (an HGX board: 8 SXM GPUs on NVSwitch), and so does
# PCIe; beyond 8 GPUs the ring crosses the network.
NODE_GPUS = 8

LINKS: dict[str, Link] = {
    "NVLink 4 (H100 SXM)": Link(
        "NVLink 4 (H100 SXM)", 900e9 / 2,
        "NVIDIA H100 Tensor Core GPU datasheet: NVLink 900 GB/s per GPU (both directions)",
        "NVLINK", NODE_GPUS, "Hopper"),
    "NVLink 3 (A100 SXM)": Link(
        "NVLink 3 (A100 SXM)", 600e9 / 2,
        "NVIDIA A100 Tensor Core GPU datasheet: NVLink 600 GB/s per GPU (both directions)",
        "NVLINK", NODE_GPUS, "Ampere"),
    "PCIe 5.0 x16": Link(
        "PCIe 5.0 x16", _pcie_x16(32),
        "PCI-SIG, PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b encoding",
        "PCI", NODE_GPUS),
    "PCIe 4.0 x16": Link(
        "PCIe 4.0 x16", _pcie_x16(16),
        "PCI-SIG, PCI Express Base Specification 4.0: 16 GT/s per lane, 128b/130b encoding",
        "PCI", NODE_GPUS),
    "InfiniBand NDR": Link(
        "InfiniBand NDR", 400e9 / 8,
        "NVIDIA ConnectX-7 product brief: 400 Gb/s NDR InfiniBand per port",
        "NET", None, "Intel CPU"),
    "InfiniBand HDR": Link(
        "InfiniBand HDR", 200e9 / 8,
        "NVIDIA ConnectX-6 product brief: 200 Gb/s HDR InfiniBand per port",
        "NET", None, "Intel CPU"),
}
