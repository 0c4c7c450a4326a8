"""Hugging Face decoders trained through transformers' own modules: `stages` (a rank's
pipeline stages, the single-process reference), `layout` (the tensor-parallel layout
derived from a decoder layer), `tensor_parallel` (that layout applied to a stage, and
DeepSeek-V3's), `experts` (fused-expert MoE blocks under expert parallelism, forced
routing). `runtime.model_parts.HFParts` is what the trainer calls; importing this
package imports transformers (seconds)."""
