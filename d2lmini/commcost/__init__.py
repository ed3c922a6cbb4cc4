"""What communication costs: all-reduce timed, and the alpha-beta model fitted to the times.

Framework-neutral half of the communication chapter (the frameworks only supply the
collective to time), one module per job; every name is also here, ``commcost.<name>``:

- ``alphabeta``: the model ``t(n, k) = a(k) alpha + b(k) n beta`` of each all-reduce scheme
  (and of the ring's reduce-scatter and all-gather), its least-squares ``fit``, crossovers,
  nccl-tests' bandwidths, the regime size n_1/2;
- ``timing``: timing a call (repeated, interleaved, with page faults) and the ``sweep`` over
  message sizes and device counts;
- ``nccl``: NCCL's own cost model (src/graph/tuning.cc) over published ``LINKS``:
  ``collective_time`` and the algorithm and protocol NCCL picks;
- ``cards``: the GPU cards, one record each (``CARDS``, ``card``): peaks, link, server size,
  network card, memory, the folder of their measured runs;
- ``workload``: the book's models' FLOPs and gradient bytes (ResNet-18's and GPT-2's layer by
  layer; ``gpt2_units``, GPT-2's FSDP units), GPUs' peak rates (FP32, TF32, bfloat16);
- ``measured``: one GPU's step read from the benchmark records (``load_step``,
  ``load_step_shape``: ``T(B) = T0 + B t``; ``StepTime``, ``resnet18_step_times``);
- ``predict``: ``predict_step`` on k GPUs, after backward or overlapped in DDP's buckets
  (``bucket_timeline``), ``critical_batch``, ``device_limit``, the speed-up tables;
- ``roofline``: the per-GPU batch above which a step is compute-bound at a card's peak
  (``roofline_batch``: FLOPs per byte sent against the card's FLOP/s per link byte/s), and
  FSDP's per layer (``layer_batches``);
- ``hierarchy``: nodes of GPUs (``Cluster``; ``cluster_of``: a card's servers): NCCL's model
  of a flat collective across nodes
  (``cluster_time``), and a step's collectives under flat DDP, flat FSDP and HSDP
  (``hierarchy_step``, ``hierarchy_rows``);
- ``overlap``: whether measured step times show hidden communication (``overlap_verdict``);
- ``records``: the results file and the printed fits and tables;
- ``lab``: what each framework's lab does with its measurements (``fit_lab``: the fits, their
  report, figure, check and regimes; ``scratch_costs``; the record);
- ``plots``: every figure (``plot_*``);
- ``worker``: what a launched rank of the chapter's worker scripts does;
- ``formatting``: significant figures, bytes and seconds as the book prints them.
"""
from __future__ import annotations

from .formatting import sig, fmt_bytes, fmt_seconds
from .alphabeta import (SCHEMES, coefficients, model_time, Fit, fit, crossover,
                        algorithm_bandwidth, bus_bandwidth, BANDWIDTH_OPTIMAL, bandwidths,
                        moved_bytes, per_byte_moved, fit_rows, fit_per_k, regime_size,
                        COLLECTIVES, collective_coefficients, collective_model_time)
from .timing import (message_sizes, summarize, time_call, time_interleaved, page_faults,
                     time_and_faults, device_counts, sweep)
from .nccl import (PROTOCOLS, NCCL_VERSION_READ, NCCL_SOURCE, NCCL_BASE_LATENCY_US,
                   NCCL_HW_LATENCY_US, NCCL_RING_EFFICIENCY, NCCL_TREE_EFFICIENCY,
                   NCCL_TREE_LL_FACTOR, NCCL_TREE_LL128_FACTOR, NCCL_TREE_CORRECTION,
                   NCCL_RING_PLATEAU, ALGORITHMS, NCCL_LL_MAX_BW, Link, nodes_of, nccl_latency,
                   tree_bandwidth, collective_time, nccl_choice, nccl_protocol, NODE_GPUS,
                   LINKS)
from .cards import Card, CARDS, card, runs_of
from .workload import (LENET_SHAPES, Gpu, GPUS, gradient_bytes, lenet_flops, resnet18_flops,
                       resnet18_layer_costs, gpt2_units, gpt2_layer_costs, ASSUMED_UTILIZATION,
                       compute_time)
from .measured import (BENCHMARKS, H100_RUN, H100_RESNET18, H100_MODEL, BenchmarkRecordError,
                       MeasuredStep, load_step, H200_RUN, H200_SHAPES, H200_GPU_LINES, LINEAR_LABEL, StepTime,
                       load_step_shape, resnet18_step_times, step_table)
from .predict import (allreduce_table, DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, layer_buckets, bucket_sizes,
                      predict_step, bucket_timeline, MIN_PER_GPU_BATCH, device_limit,
                      best_speedup, critical_batch, speedup_rows, speedup_table)
from .roofline import (comm_seconds, roofline_batch, layer_batches, threshold_rows,
                       threshold_table, plot_compute_bound, gpus_of, link_label)
from .hierarchy import (Cluster, AcrossNodes, H100_CLUSTER, cluster_of, cluster_latency, cluster_time, cluster_choice,
                        HIERARCHY_SCHEMES, hierarchy_collectives, hierarchy_step, hierarchy_rows,
                        hierarchy_table, plot_hierarchy)
from .overlap import hidden_fraction, clearly_greater, overlap_verdict, overlap_report
from .records import record, report, table
from .lab import FIT_BOUND, FRAMEWORK_SCHEME, LabFits, fit_lab, check_regimes, scratch_costs
from .plots import (plot_overlap_timeline, plot_roofline, plot_speedups, plot_fits,
                    scaling_speedups, plot_scaling)
from .worker import add_worker_arguments, rank_sweep

__all__ = ["Card", "CARDS", "card", "cluster_of", "runs_of", "allreduce_table", "SCHEMES", "coefficients", "model_time", "Fit", "fit", "crossover",
           "algorithm_bandwidth", "bus_bandwidth", "bandwidths", "summarize", "time_call",
           "time_interleaved", "page_faults", "time_and_faults", "message_sizes", "device_counts", "sweep", "fit_rows",
           "fit_per_k", "regime_size", "moved_bytes", "per_byte_moved", "sig", "fmt_bytes",
           "fmt_seconds", "COLLECTIVES", "collective_coefficients", "collective_model_time",
           "PROTOCOLS", "NCCL_VERSION_READ", "NCCL_SOURCE", "NCCL_BASE_LATENCY_US",
           "NCCL_HW_LATENCY_US", "NCCL_RING_EFFICIENCY", "NCCL_LL_MAX_BW", "nccl_latency", "collective_time",
           "nccl_protocol", "nccl_choice", "tree_bandwidth", "nodes_of", "ALGORITHMS",
           "NCCL_TREE_CORRECTION", "NCCL_RING_PLATEAU", "Link", "LINKS", "Gpu", "GPUS",
           "LENET_SHAPES", "gradient_bytes", "lenet_flops", "resnet18_flops", "compute_time",
           "DDP_BUCKET_BYTES", "DDP_FIRST_BUCKET_BYTES", "layer_buckets", "resnet18_layer_costs",
           "bucket_sizes", "predict_step", "bucket_timeline", "plot_overlap_timeline", "best_speedup", "critical_batch",
           "plot_roofline", "hidden_fraction", "clearly_greater", "overlap_verdict",
           "overlap_report", "record", "report", "plot_fits",
           "ASSUMED_UTILIZATION", "table", "NODE_GPUS", "MIN_PER_GPU_BATCH", "device_limit",
           "BENCHMARKS", "H100_RUN", "H100_RESNET18", "H100_MODEL", "BenchmarkRecordError",
           "MeasuredStep", "load_step", "StepTime", "resnet18_step_times", "step_table",
           "H200_RUN", "H200_SHAPES", "H200_GPU_LINES", "LINEAR_LABEL", "load_step_shape",
           "speedup_rows", "speedup_table", "plot_speedups", "gpt2_units",
           "gpt2_layer_costs",
           "comm_seconds", "roofline_batch", "layer_batches", "threshold_rows", "threshold_table",
           "plot_compute_bound", "Cluster", "H100_CLUSTER", "cluster_latency", "cluster_time",
           "cluster_choice", "HIERARCHY_SCHEMES", "hierarchy_collectives", "hierarchy_step",
           "hierarchy_rows", "hierarchy_table", "plot_hierarchy", "FIT_BOUND", "FRAMEWORK_SCHEME", "LabFits",
           "fit_lab", "check_regimes", "scratch_costs", "AcrossNodes", "gpus_of",
           "link_label", "BANDWIDTH_OPTIMAL", "NCCL_TREE_EFFICIENCY", "NCCL_TREE_LL_FACTOR",
           "NCCL_TREE_LL128_FACTOR", "add_worker_arguments", "rank_sweep", "scaling_speedups",
           "plot_scaling"]
