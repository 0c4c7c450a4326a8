"""bitsandbytes' 8-bit Adam (AdamW8bit, PagedAdamW8bit; Dettmers et al., "8-bit Optimizers
via Block-wise Quantization", ICLR 2022), priced by what it holds and what it moves.

- State (bitsandbytes/optim/optimizer.py, `Optimizer2State.init_state`): each moment is one
  uint8 per element with one fp32 absmax per block of `BLOCK` elements; there is no fp32
  master copy, the update kernel steps the 16-bit weights in place. (Tensors under 4,096
  elements, the norms' scales, keep 32-bit moments: a rounding error of the model.)
- Step (`optimizer_update_8bit_blockwise`): one kernel reads the 16-bit weight and
  gradient and both moments and writes the weight and the moments, `STEP_BYTES` a parameter.
- Paged (`is_paged`): the state buffers come from cudaMallocManaged (`F.get_paged`), so
  torch's caching allocator never counts them. They stay on the GPU while its memory
  lasts; once the allocator's pool fills it, the driver pages them out to the host, and
  each parameter's step brings its state back (`prefetch_state`, cudaMemPrefetchAsync on
  the compute stream) and synchronizes before the next (`torch.cuda.synchronize()` at the
  end of a paged `step`): what does not fit moves out and back every step, in line with
  the compute (`paged_bytes`, priced in `cost_models.offload`).
"""

from __future__ import annotations

from planner.vocabulary.parallel import ParallelConfig

BLOCK = 256
"""Elements per fp32 absmax of bitsandbytes' blockwise 8-bit optimizer state."""
STATE_BYTES = 2 * (1 + 4 / BLOCK)
"""Bytes of one parameter's two 8-bit moments and their share of the block scales."""
STEP_BYTES = 2 + 2 + STATE_BYTES + 2 + STATE_BYTES
"""Bytes one parameter's step reads (16-bit weight and gradient, the moments) and writes
(the weight, the moments)."""


def eight_bit(parallel: ParallelConfig) -> bool:
    """Whether `parallel` steps bitsandbytes' 8-bit Adam, paged or not."""
    return parallel.numerics.optimizer in ("adam8bit", "paged_adam8bit")


def paged(parallel: ParallelConfig) -> bool:
    """Whether its state is in CUDA unified memory (PagedAdamW8bit)."""
    return parallel.numerics.optimizer == "paged_adam8bit"


def paged_bytes(state_bytes: float, free_bytes: float) -> float:
    """Bytes of paged optimizer state that move out to the host and back each step: what
    does not fit in the `free_bytes` the GPU has beside torch's reserved pool."""
    return max(0.0, state_bytes - max(0.0, free_bytes))
