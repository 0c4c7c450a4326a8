"""A Megatron-LM launch line, read as Megatron-LM reads it, in Tessel's vocabulary.

`plan predict` takes the flags of a `pretrain_gpt.py` command line (pasted after `--`, or
a launch script) and predicts exactly that run. Three steps, one module each:

- `launch_text`: the script's flags out of a launch line or script (`launch_words`,
  `split_launcher`: continuations joined, comments, environment assignments and shell
  variables resolved, the torchrun prefix set aside; its --nnodes x --nproc-per-node is
  the world size);
- `arguments`: those flags through an argparse parser built from Megatron-LM's own option
  list (`../shared/reference/megatron_lm_arguments.json`, located by
  `TESSEL_MEGATRON_ARGUMENTS`), so every flag Megatron-LM accepts is accepted, with its
  type, choices and default (`parse_megatron_flags`);
- `run`: the model shape (`model_shape`) and parallel configuration (`parallel_config`)
  Megatron-LM would run, with its defaults for everything absent and the rules of its
  `validate_args` (`megatron_run`).

Flags that change neither time nor memory (data, logging, checkpoints, the learning-rate
schedule, ...) are accepted and ignored; flags that do but that Tessel cannot price yet
(`unpriced.UNPRICED`) are refused. Every mistake is one `LaunchLineError` (`errors`)
naming the flag as typed. Modules import one way: `run` -> `unpriced` / `model_shape` /
`parallel_config` -> `arguments` -> `errors`; `launch_text` -> `errors`.
"""

from planner.megatron.arguments import MegatronArgs, parse_megatron_flags
from planner.megatron.errors import LaunchLineError
from planner.megatron.launch_text import LaunchLine, launch_words, split_launcher
from planner.megatron.run import MegatronRun, megatron_run

__all__ = [
    "LaunchLine", "LaunchLineError", "MegatronArgs", "MegatronRun", "launch_words",
    "megatron_run", "parse_megatron_flags", "split_launcher",
]
