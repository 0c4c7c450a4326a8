"""Analytical compute cost: the roofline model.

An op takes as long as the slower of doing its arithmetic at peak FLOP/s and moving its
bytes at peak memory bandwidth (Williams, Waterman & Patterson, "Roofline: an insightful
visual performance model for multicore architectures", CACM 2009).
"""

from __future__ import annotations

import torch

from cost_models.power import clock_fraction
from planner.vocabulary.cluster import DeviceSpec

# torch dtype -> key of DeviceSpec.peak_tflops. Only dtypes datasheets quote a peak for.
_DTYPE_KEYS: dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8",
}


def dtype_key(dtype: torch.dtype) -> str:
    """The `DeviceSpec.peak_tflops` key for a torch dtype, e.g. torch.bfloat16 -> 'bf16'.

    Dtypes with no datasheet peak (int64, bool, float64, ...) map to their own name
    ('int64'), which `op_time` then treats like any unlisted key: at the fp32 peak.
    """
    return _DTYPE_KEYS.get(dtype, str(dtype).removeprefix("torch."))


def op_time(flops: float, bytes_moved: float, device: DeviceSpec, dtype: str) -> float:
    """Roofline time in seconds: max(flops / peak FLOP/s, bytes / memory bandwidth).

    `dtype` is a `dtype_key`; a key the device lists no peak for uses its fp32 peak. The
    peak is the one the device's power limit leaves (`cost_models.power`).
    """
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes_moved must be >= 0, got {flops} and {bytes_moved}")
    peaks = device.peak_tflops
    peak_flops = peaks.get(dtype, peaks["fp32"]) * 1e12 * clock_fraction(device)
    bandwidth = device.memory_bandwidth_gbs * 1e9
    return max(flops / peak_flops, bytes_moved / bandwidth)


def op_flops(op: object, args: tuple, kwargs: dict, out: object) -> float:
    """FLOPs of one aten op call, with tensors (real, fake or meta) as arguments.

    Matmuls, convolutions and attention use PyTorch's own formulas
    (`torch.utils.flop_counter`); every other op is charged one FLOP per output element,
    which only matters through the roofline's bandwidth side anyway.
    """
    from torch.utils.flop_counter import flop_registry

    packet = getattr(op, "overloadpacket", op)
    if packet in _CPU_FLASH_ATTENTION:
        return float(_CPU_FLASH_ATTENTION[packet](args))
    formula = flop_registry.get(packet)
    if formula is not None:
        return float(formula(*args, **kwargs, out_val=out))
    leaves = torch.utils._pytree.tree_leaves(out)
    return float(sum(t.numel() for t in leaves if isinstance(t, torch.Tensor)))


def _cpu_flash_attention() -> dict:
    """FLOP formulas of the CPU flash-attention kernels, which PyTorch's registry lacks:
    its own SDPA counts (full, unmasked attention matrix, as Megatron's MFU counts it)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention_for_cpu: lambda a: sdpa_flop_count(
            a[0].shape, a[1].shape, a[2].shape
        ),
        # (grad_out, query, key, value, out, logsumexp, ...)
        aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda a: (
            sdpa_backward_flop_count(a[0].shape, a[1].shape, a[2].shape, a[3].shape)
        ),
    }


_CPU_FLASH_ATTENTION = _cpu_flash_attention()


def tensor_bytes(values: object) -> int:
    """Bytes of every tensor in a (nested) value."""
    leaves = torch.utils._pytree.tree_leaves(values)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
