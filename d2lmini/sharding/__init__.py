"""The framework-neutral half of sharded data parallelism (ZeRO stages 1-3, FSDP): which device
keeps which part of the training state, how many bytes that is, and what the collectives move.

One module per job; every name is also here, ``sharding.<name>``:

- ``state``: the state between steps at each ZeRO stage (``state_bytes``,
  ``bytes_per_parameter``), the ring's reduce-scatter and all-gather and the bytes a step sends
  (``step_traffic``), the measured-against-formula memory tables (``memory_rows``);
- ``peak``: the peak *during* a step, moment by moment, of the six ``SCHEMES`` on the
  section's MLP (``peak_timeline``, ``peak_bytes``, ``peak_rows``);
- ``activations``: activation memory with recomputation by segments (``activation_peak``,
  ``recompute_flops``, ``plot_activations``), and a transformer layer's (Korthikanti et al.:
  ``transformer_activation_bytes``);
- ``stagetime``: each scheme's collectives in a step and their predicted time
  (``step_collectives``, ``stage_time_rows``);
- ``knobs``: FSDP's knobs (``param_dtype``, prefetch, gradient sync, meta-device init) on
  row-sharded units (``fsdp_collective_bytes``, ``knob_formula_rows``, ``plot_layer_bytes``);
- ``formulas``: the formulas as the chapter's neutral page shows them (``per_parameter_table``,
  ``traffic_table``, ``peak_formula_table``, ``plot_peak_formula``, ``recompute_table``);
- ``lab``: what every framework's lab does with its measurements, one call each
  (``proof_report``, ``traffic_report``, ``show_memory``, ``show_peak``, ``peak_report``).

``gpt2_units`` (GPT-2's FSDP units) is the workload module's, :mod:`d2lmini.commcost.workload`.
"""
from __future__ import annotations

from ..commcost.workload import gpt2_units
from .state import (STAGES, STAGE_NAMES, PARTS, SHARDED_PARTS, ALLCLOSE_ATOL, Precision,
                    FP32_ADAM, MIXED_ADAM, reduce_scatter_schedule, all_gather_schedule,
                    shard_sizes, state_bytes, bytes_per_parameter, zero_stage, step_traffic, table_counts,
                    memory_rows, memory_ok, row_shard_elements, memory_table,
                    whole_tensor_shares)
from .peak import (SCHEMES, scheme_stage, MLP_WIDTHS, layer_sizes, mlp_init,
                   peak_timeline, peak_parts, peak_bytes, peak_rows, peak_table, peak_ok,
                   peak_rss_bytes, max_abs_diff)
from .activations import (RECOMPUTE_SEGMENTS, RECOMPUTE_ROWS, activation_timeline,
                          activation_peak, recompute_flops, activation_rows, activation_table,
                          plot_activations, TRANSFORMER_RECOMPUTE, transformer_activation_bytes)
from .stagetime import step_collectives, step_comm_time, stage_time_rows, stage_time_table
from .knobs import (BF16_GRAD_TOL, mlp_units, fsdp_collective_bytes, gathered_elements,
                    prefetch_bytes, kept_grad_bytes, init_peak_bytes, fsdp_init_peak_bytes,
                    layer_moments, knob_formula_rows, knob_table, plot_layer_bytes)
from .formulas import (per_parameter_table, traffic_table, peak_formula_table,
                       plot_peak_formula, recompute_table)
from .lab import (proof_report, traffic_report, show_memory, show_peak, plot_peaks, peak_report,
                  train_precisions, accuracies_ok)

__all__ = ["whole_tensor_shares", "STAGES", "STAGE_NAMES", "SHARDED_PARTS", "PARTS", "Precision", "FP32_ADAM",
           "MIXED_ADAM", "reduce_scatter_schedule", "all_gather_schedule", "shard_sizes",
           "state_bytes", "bytes_per_parameter", "zero_stage", "TRANSFORMER_RECOMPUTE",
           "transformer_activation_bytes", "step_traffic", "table_counts", "memory_rows",
           "memory_table", "memory_ok", "row_shard_elements", "peak_rss_bytes", "max_abs_diff",
           "ALLCLOSE_ATOL", "SCHEMES", "scheme_stage", "MLP_WIDTHS", "mlp_init", "layer_sizes",
           "peak_timeline", "peak_bytes", "peak_parts", "peak_rows", "peak_table", "peak_ok",
           "RECOMPUTE_SEGMENTS", "RECOMPUTE_ROWS", "activation_timeline", "activation_peak",
           "recompute_flops", "activation_rows", "activation_table", "plot_activations",
           "step_collectives", "step_comm_time", "stage_time_rows", "stage_time_table",
           "gpt2_units", "BF16_GRAD_TOL", "mlp_units", "fsdp_collective_bytes",
           "gathered_elements", "prefetch_bytes", "kept_grad_bytes", "init_peak_bytes",
           "fsdp_init_peak_bytes", "layer_moments", "knob_formula_rows", "knob_table",
           "plot_layer_bytes", "proof_report", "traffic_report", "show_memory", "show_peak",
           "plot_peaks", "peak_report", "train_precisions", "accuracies_ok",
           "per_parameter_table", "traffic_table", "peak_formula_table", "plot_peak_formula",
           "recompute_table"]
