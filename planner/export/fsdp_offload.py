"""FSDP2's CPU offload as the torch-native exports run it: TorchTitan's
`training.enable_cpu_offload` and the PyTorch script's `fully_shard(...,
offload_policy=CPUOffloadPolicy())` put the sharded parameters, their gradients and the whole
optimizer step on the host together (torch/distributed/fsdp/_fully_shard/_fsdp_api.py); they
offload nothing to NVMe, no fraction of the optimizer, and no activations. One rule for both
exporters, which add their own (adapters) after it."""

from __future__ import annotations

from planner.vocabulary.plan import RunSettings


def fsdp2_offload_refusal(run: RunSettings | None) -> str | None:
    """Why FSDP2's CPUOffloadPolicy cannot run `run`'s offload (one line naming the export
    that can), or None."""
    if run is None:
        return None
    if run.offload_activation_layers:
        return ("activation offload is Megatron-LM's (--cpu-offloading-num-layers, fewer "
                "layers than the model's: --emit megatron) and torchtune's "
                "(enable_activation_offloading), not FSDP2's")
    if "nvme" in (run.offload_optimizer, run.offload_params):
        return "NVMe offload is ZeRO-Infinity's: use --emit deepspeed"
    if run.offload_optimizer != run.offload_params:
        return ("FSDP2's CPUOffloadPolicy puts parameters, gradients and the optimizer step "
                "on the host together: plan with both --offload-optimizer cpu and "
                "--offload-params cpu, or neither (--emit deepspeed offloads one alone)")
    if run.offload_optimizer == "cpu" and run.optimizer_offload_fraction < 1:
        return ("FSDP2's CPUOffloadPolicy moves all of the optimizer's state to the host, not "
                "a fraction (--optimizer-offload-fraction is Megatron-LM's: --emit megatron)")
    return None
