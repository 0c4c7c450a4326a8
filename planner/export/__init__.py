"""What other systems read, written from a Plan: Megatron-LM flags and
launch scripts, TorchTitan and DeepSpeed configs, PyTorch scripts, torchrun, Slurm and Ray
launch lines, and the HTML report."""
