"""Nodes of GPUs: NCCL's model of a collective over several nodes (``cluster_time``) and the
price of a sharded step three ways -- flat DDP, flat FSDP, and HSDP (hybrid sharding: FSDP
inside each node, replicas across nodes) -- over a ``Cluster`` of such nodes.

A node holds ``gpus_per_node`` GPUs on one fast link (NVLink) and ``nics_per_node`` network
cards (one per GPU on an H100 server).  A *flat* collective runs one ring over every GPU of
every node.  Each ring enters and leaves a node once, so NCCL spreads its rings (channels)
over the node's NICs: a GPU's share of the ring runs at ``min(intra bandwidth, nics x NIC
bandwidth)`` -- nearly NVLink's on such a server -- but the ring has ``N - 1`` steps for
``N`` GPUs, of which ``nodes - 1`` cross the network (tuning.cc: ``nInterSteps``, each at the
network's latency; the rest at NVLink's, at least the network's post overhead).  HSDP keeps
the gathers and the reduce-scatter inside the node (``gpus_per_node - 1`` steps over NVLink)
and sends across nodes only the all-reduce of each GPU's shard, ``1/gpus_per_node`` of the
gradient: GPU ``i`` of every node joins one communicator of ``nodes`` GPUs, one per node, on
its own NIC, and the ``gpus_per_node`` such all-reduces run at once.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .alphabeta import collective_coefficients
from .cards import card
from .nccl import (NCCL_BASE_LATENCY_US, NCCL_HW_LATENCY_US, NCCL_LL_MAX_BW,
                   NCCL_RING_EFFICIENCY, NCCL_RING_PLATEAU, NCCL_TREE_EFFICIENCY,
                   NCCL_TREE_LL_FACTOR, NCCL_TREE_LL128_FACTOR, NODE_GPUS, PROTOCOLS, Link,
                   _tree_correction, collective_time)
from .predict import DDP_BUCKET_BYTES, bucket_sizes


@dataclass(frozen=True)
class Cluster:
    """Nodes of ``gpus_per_node`` GPUs on ``intra`` (NVLink), joined by ``nics_per_node``
    network cards of ``inter`` (a ``NET`` link: its bandwidth is one card's).
    ``net_overhead_us``: NCCL's network post overhead per ring step (tuning.cc
    ``getNetOverhead``: 1 us on Intel x86, 2 on AMD; three times that for Simple)."""
    name: str
    intra: Link
    inter: Link
    gpus_per_node: int = NODE_GPUS
    nics_per_node: int = NODE_GPUS
    net_overhead_us: float = 1.0

    def __post_init__(self):
        if self.inter.hw != "NET" or self.intra.hw == "NET":
            raise ValueError("a cluster needs a link inside nodes and a NET link between them")
        if self.gpus_per_node < 1 or self.nics_per_node < 1:
            raise ValueError("a node needs at least one GPU and one network card")

    def flat_bandwidth(self) -> float:
        """Bytes/s of a GPU's share of a flat ring across nodes: every ring crosses each
        node's boundary once, on one card, so the rings together get the node's cards."""
        return min(self.intra.bandwidth, self.nics_per_node * self.inter.bandwidth)

    def across(self) -> Link:
        """The link of HSDP's all-reduces across nodes (one GPU per node each): a card's
        bandwidth, shared when a node has fewer cards than GPUs."""
        share = min(1.0, self.nics_per_node / self.gpus_per_node)
        return dataclasses.replace(self.inter, bandwidth=self.inter.bandwidth * share)


@dataclass(frozen=True)
class AcrossNodes:
    """A flat ring over ``nodes`` nodes of ``cluster`` (every GPU of every node), as the
    roofline sees it: its GPUs, and the bandwidth of a GPU's share of the ring
    (:meth:`Cluster.flat_bandwidth`: on an H100 server the node's 8 cards, 400 GB/s, not one
    card's 50 GB/s)."""
    cluster: Cluster
    nodes: int = 2

    def __post_init__(self):
        if self.nodes < 2:
            raise ValueError(f"across nodes means 2 or more nodes, not {self.nodes}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.cluster.gpus_per_node

    @property
    def bandwidth(self) -> float:
        return self.cluster.flat_bandwidth()

    @property
    def name(self) -> str:
        c = self.cluster
        return (f"{self.nodes} nodes of {c.gpus_per_node} GPUs, {c.nics_per_node} "
                f"{c.inter.name} cards a node")


def cluster_of(key: str, **kw):
    """Servers of the card's ``node_gpus`` GPUs on its link, one network card per GPU
    (a :class:`.Cluster`; ``kw`` overrides its fields, e.g. ``nics_per_node=1``)."""
    c = card(key)
    if c.nic is None:
        raise ValueError(f"the {key} record has no network card: no cluster of it")
    fields = dict(gpus_per_node=c.node_gpus, nics_per_node=c.node_gpus, **kw)
    n, nics = fields["gpus_per_node"], fields["nics_per_node"]
    name = (f"{key} servers: {n} GPUs on {c.link.name}, "
            + (f"one {c.nic.name} card per GPU" if nics == n else f"{nics} {c.nic.name} cards a server"))
    return Cluster(name, c.link, c.nic, **fields)


H100_CLUSTER = cluster_of("H100 SXM")      # the card catalogue's (d2lmini.commcost.cards)


def _us(table: dict, algorithm: str, protocol: str) -> float:
    return table[algorithm][PROTOCOLS.index(protocol)] * 1e-6


def cluster_latency(op: str, nodes: int, cluster: Cluster, protocol: str,
                    algorithm: str = "ring") -> float:
    """NCCL's latency of a flat ``op`` over ``nodes`` nodes of the cluster (tuning.cc, more
    than one GPU per node): the ring's base latency, ``nsteps - nInterSteps`` steps at the
    node link's latency (at least the network's post overhead) and ``nInterSteps`` (2(nodes-1)
    for all-reduce, nodes-1 otherwise) at the network's; the tree's base latency plus
    ``2 ((gpus_per_node - 1) intra + log2(nodes) inter)``."""
    g = cluster.gpus_per_node
    if nodes == 1:
        from .nccl import nccl_latency
        return nccl_latency(op, g, cluster.intra, protocol, algorithm)
    hw_intra = "PCI" if cluster.intra.hw == "PCI" else "NVLINK"
    if algorithm == "tree":
        if op != "all-reduce":
            raise ValueError(f"NCCL's tree runs all-reduce only; got {op!r}")
        inter = _us(NCCL_HW_LATENCY_US["NET"], "tree", protocol)
        return (_us(NCCL_BASE_LATENCY_US, "tree", protocol)
                + 2 * ((g - 1) * _us(NCCL_HW_LATENCY_US[hw_intra], "tree", protocol)
                       + int(math.log2(nodes)) * inter))
    nsteps, _ = collective_coefficients(op, nodes * g)
    inter_steps = 2 * (nodes - 1) if op == "all-reduce" else nodes - 1
    # ppn = 1: NCCL takes the network's Tree column ("latencies are fully exposed")
    inter = _us(NCCL_HW_LATENCY_US["NET"], "tree" if g == 1 else "ring", protocol)
    overhead = cluster.net_overhead_us * 1e-6 * (3 if protocol == "Simple" else 1)
    intra = max(_us(NCCL_HW_LATENCY_US[hw_intra], "ring", protocol), overhead)
    return (_us(NCCL_BASE_LATENCY_US, "ring", protocol) + (nsteps - inter_steps) * intra
            + inter_steps * inter)


def _cluster_times(op: str, n_bytes, nodes: int, cluster: Cluster) -> dict:
    """``{(algorithm, protocol): seconds}`` of a flat ``op`` over ``nodes`` > 1 nodes."""
    k = nodes * cluster.gpus_per_node
    _, b = collective_coefficients(op, k)
    n = np.asarray(n_bytes, dtype=float)
    bus = cluster.flat_bandwidth()
    ll_cap = (NCCL_LL_MAX_BW[cluster.inter.ll_max_bw][min(nodes - 1, 2)] * 1e9
              if cluster.inter.ll_max_bw else math.inf)
    out = {}
    for p in cluster.intra.protocols:
        ring_bw = bus * NCCL_RING_EFFICIENCY[p]
        if p == "LL":
            ring_bw = min(ring_bw, ll_cap)
        lat = np.full(n.shape, cluster_latency(op, nodes, cluster, p))
        if op == "all-reduce" and p == "Simple":
            lat = np.where(n / k >= 64, lat * NCCL_RING_PLATEAU, lat)      # one channel assumed
        out["ring", p] = lat + b * n / ring_bw
        if op == "all-reduce":
            tree_bus = bus * NCCL_TREE_EFFICIENCY
            if p == "LL":
                tree_bus = min(tree_bus * NCCL_TREE_LL_FACTOR, ll_cap)
            elif p == "LL128":
                tree_bus *= NCCL_TREE_LL128_FACTOR["nodes"]
            out["tree", p] = (cluster_latency(op, nodes, cluster, p, "tree")
                              + n / (0.5 * tree_bus * _tree_correction(p, n)))
    return out


def cluster_time(op: str, n_bytes, nodes: int, cluster: Cluster = H100_CLUSTER,
                 protocol: str | None = None, algorithm: str | None = None):
    """Predicted seconds of NCCL's flat ``op`` of ``n_bytes`` (the whole buffer) over every GPU
    of ``nodes`` nodes: on one node, :func:`.collective_time` over the node's link; across
    nodes, the ring or tree (all-reduce) and protocol of :func:`cluster_latency` plus the bytes
    at :meth:`Cluster.flat_bandwidth` and the protocol's efficiency, the fastest unless
    ``protocol``/``algorithm`` are given.  Left out, as in :func:`.collective_time`: NVLS,
    CollNet (SHARP) and PAT, and NCCL's per-channel caps."""
    if nodes < 1:
        raise ValueError(f"need at least one node, got {nodes}")
    if nodes == 1:
        return collective_time(op, n_bytes, cluster.gpus_per_node, cluster.intra, protocol,
                               algorithm)
    times = {key: t for key, t in _cluster_times(op, n_bytes, nodes, cluster).items()
             if (protocol is None or key[1] == protocol)
             and (algorithm is None or key[0] == algorithm)}
    if not times:
        raise ValueError(f"NCCL's model has no {algorithm} {op} with {protocol}")
    out = np.min(np.stack(list(times.values())), axis=0)
    return out if np.ndim(out) else float(out)


def cluster_choice(op: str, n_bytes: float, nodes: int, cluster: Cluster = H100_CLUSTER):
    """The (algorithm, protocol) of :func:`.cluster_time` (NCCL's model's fastest)."""
    if nodes == 1:
        from .nccl import nccl_choice
        return nccl_choice(op, n_bytes, cluster.gpus_per_node, cluster.intra)
    times = _cluster_times(op, float(n_bytes), nodes, cluster)
    return min(times, key=lambda key: float(times[key]))


HIERARCHY_SCHEMES = ("DDP", "FSDP", "HSDP")


def hierarchy_collectives(unit_bytes, scheme: str, nodes: int, cluster: Cluster = H100_CLUSTER,
                          regather: bool = True) -> list[tuple[str, str, float]]:
    """The collectives of one step, ``[(where, op, bytes of the whole buffer)]``, ``where`` one
    of "flat" (every GPU of every node), "node" (the GPUs of one node), "across" (one GPU per
    node, the node's GPUs side by side).  ``unit_bytes``: the model's units (layers, forward
    order).  DDP all-reduces the gradient in its 25 MiB buckets (:func:`.bucket_sizes`), flat;
    per unit, FSDP all-gathers before forward and
    (``regather``, FSDP's ``reshard_after_forward``) before backward and reduce-scatters, flat;
    HSDP does the same three inside the node, then all-reduces across nodes the node's shard,
    1/gpus_per_node of the unit."""
    if scheme not in HIERARCHY_SCHEMES:
        raise ValueError(f"scheme must be one of {HIERARCHY_SCHEMES}, got {scheme!r}")
    if scheme == "DDP":
        return [("flat", "all-reduce", b)
                for b in bucket_sizes(float(sum(unit_bytes)), DDP_BUCKET_BYTES)]
    gathers = 2 if regather else 1
    out = []
    for u in unit_bytes:
        where = "flat" if scheme == "FSDP" else "node"
        out += [(where, "all-gather", u)] * gathers + [(where, "reduce-scatter", u)]
        if scheme == "HSDP":
            out.append(("across", "all-reduce", u / cluster.gpus_per_node))
    return out


def hierarchy_step(unit_bytes, scheme: str, nodes: int, cluster: Cluster = H100_CLUSTER,
                   regather: bool = True) -> dict:
    """One step's collectives (:func:`hierarchy_collectives`) priced with NCCL's model, one
    after another (no overlap): ``{"seconds", "flat_s", "node_s", "across_s", "bandwidth_s",
    "latency_s", "nic_bytes"}``.  ``bandwidth_s``: the bytes alone, each collective's ``b``
    times its bytes over its link's bandwidth (a flat ring across nodes: the node's cards,
    :meth:`Cluster.flat_bandwidth`); ``latency_s``: the rest of NCCL's model, its latencies
    (per ring step: a flat ring over 16 nodes has 127) and protocols' efficiencies.  ``nic_bytes``: what each network card sends in the step, the ring's
    ``b`` times the bytes -- over all a node's cards for a flat ring (each ring crosses the
    node's boundary once), one card for its GPU's all-reduce across nodes."""
    g = cluster.gpus_per_node
    parts = {"flat": 0.0, "node": 0.0, "across": 0.0}
    nic = bandwidth = 0.0
    link_bw = {"flat": cluster.flat_bandwidth() if nodes > 1 else cluster.intra.bandwidth,
               "node": cluster.intra.bandwidth, "across": cluster.across().bandwidth}
    gpus = {"flat": nodes * g, "node": g, "across": nodes}
    for where, op, n in hierarchy_collectives(unit_bytes, scheme, nodes, cluster, regather):
        bandwidth += collective_coefficients(op, gpus[where])[1] * n / link_bw[where]
        if where == "flat":
            parts[where] += cluster_time(op, n, nodes, cluster)
            if nodes > 1:
                nic += collective_coefficients(op, nodes * g)[1] * n / cluster.nics_per_node
        elif where == "node":
            parts[where] += collective_time(op, n, g, cluster.intra)
        else:
            parts[where] += collective_time(op, n, nodes, cluster.across())
            if nodes > 1:
                nic += (collective_coefficients(op, nodes)[1] * n
                        * max(1.0, g / cluster.nics_per_node))
    return {"seconds": sum(parts.values()), "flat_s": parts["flat"], "node_s": parts["node"],
            "across_s": parts["across"], "bandwidth_s": bandwidth,
            "latency_s": sum(parts.values()) - bandwidth, "nic_bytes": nic}


def hierarchy_rows(unit_bytes, nodes_list, cluster: Cluster = H100_CLUSTER,
                   regather: bool = True) -> list[dict]:
    """:func:`hierarchy_step` of every scheme for every node count: ``{"nodes", "gpus",
    "scheme", ..., "vs_ddp"}``."""
    out = []
    for nodes in nodes_list:
        steps = {s: hierarchy_step(unit_bytes, s, nodes, cluster, regather)
                 for s in HIERARCHY_SCHEMES}
        for s, r in steps.items():
            out.append({"nodes": nodes, "gpus": nodes * cluster.gpus_per_node, "scheme": s, **r,
                        "vs_ddp": r["seconds"] / steps["DDP"]["seconds"]})
    return out


def hierarchy_table(rows: list[dict]) -> str:
    """A Markdown table of :func:`hierarchy_rows`: one row per node count, per scheme the
    step's collectives' time (and its ratio to DDP's), the same with the bandwidth terms only
    (no latency), and the bytes each card sends."""
    from .formatting import fmt_bytes, fmt_seconds
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    lines = ["| nodes (GPUs) | " + " | ".join(schemes) + " | bandwidth only: "
             + ", ".join(schemes) + " | bytes per card: " + ", ".join(schemes) + " |",
             "|---|" + "---:|" * (len(schemes) + 2)]
    for nodes in dict.fromkeys(r["nodes"] for r in rows):
        cells = {r["scheme"]: r for r in rows if r["nodes"] == nodes}
        gpus = cells[schemes[0]]["gpus"]
        lines.append(f"| {nodes} ({gpus}) | " + " | ".join(
            f"{fmt_seconds(cells[s]['seconds'])} ({cells[s]['vs_ddp']:.2f}x)" for s in schemes)
            + " | " + ", ".join(fmt_seconds(cells[s]["bandwidth_s"]) for s in schemes)
            + " | " + ", ".join(fmt_bytes(cells[s]["nic_bytes"]) for s in schemes) + " |")
    return "\n".join(lines)


def plot_hierarchy(unit_bytes, nodes_list, cluster: Cluster = H100_CLUSTER, title: str = ""):
    """Left: the step's collectives' time against the number of nodes for DDP, FSDP and HSDP
    (HSDP's part across nodes dashed).  Right: the bytes each network card sends per step.
    Predictions of :func:`hierarchy_step`.  Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    rows = hierarchy_rows(unit_bytes, nodes_list, cluster)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9.5, 3.5))
    for j, s in enumerate(HIERARCHY_SCHEMES):
        rs = [r for r in rows if r["scheme"] == s]
        x = [r["nodes"] for r in rs]
        ax.plot(x, [r["seconds"] * 1e3 for r in rs], "o-", color=f"C{j}", ms=3, label=s)
        ax2.plot(x, [r["nic_bytes"] / 1e9 for r in rs], "o-", color=f"C{j}", ms=3, label=s)
        if s == "HSDP":
            ax.plot(x, [r["across_s"] * 1e3 for r in rs], "--", color=f"C{j}", lw=1,
                    label="HSDP, across nodes only")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a.set_xlabel(f"nodes ({cluster.gpus_per_node} GPUs each)")
        a.legend(fontsize=7)
    ax.set_ylabel("collectives per step (ms)")
    ax.set_ylim(0, None)
    ax2.set_ylabel("bytes each network card sends (GB)")
    ax2.set_ylim(0, None)
    ax.set_title("time, no overlap (prediction)", fontsize=9)
    ax2.set_title("network traffic per card", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
