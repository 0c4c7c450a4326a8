"""A TorchTitan 0.2 job config, read as TorchTitan reads it, in Tessel's vocabulary.

`plan predict --torchtitan JOB.toml` takes the TOML file TorchTitan's trainer reads
(`--job.config_file`, the one `plan --emit torchtitan` writes) and predicts exactly that
run. Three steps, one module each:

- `keys`: every key of TorchTitan 0.2's `JobConfig` with its default, and what Tessel does
  with it: read, ignored (it changes neither time nor memory) or refused (it does, in a
  way Tessel cannot price, at a value other than one that changes nothing); a key or table
  TorchTitan does not have is refused by name (`flatten`);
- `parallel_config`: the degrees, batches, pipeline split, checkpointing, precision,
  compile and FSDP2 policy TorchTitan runs, with its defaults and rules, as a
  `ParallelConfig` with engine "torchtitan";
- `job`: the file read (`load_job_config`), the model (the Llama 3 preset of its flavor at
  its sequence length) and both together (`torchtitan_job`).

`rules` holds what TorchTitan decides for a layout (FSDP2 or DDP), which the search and
the exporter follow too, so that a plan's exported file predicts as the plan did.

TorchTitan 0.3's form (a `Trainer.Config` from a config function, pytorch/torchtitan#2386)
is read through the same reader (`next_job.load_job` takes `--torchtitan` in every form):

- `next_keys`: 0.3's fields, as 0.2's keys with the renames, drops and additions written
  out;
- `registry`: the registry config functions Tessel knows by name (values copied from
  torchtitan 0.3.0) and the models they build;
- `config_module`: a config module of one's own, its literals read with `ast`, never run;
- `overrides`: TorchTitan's command-line overrides, for both releases;
- `next_job`: a 0.3 config's run, through `parallel_config`.

Every mistake is one `JobConfigError` (`errors`) naming the file and the key. Modules
import one way: `next_job` -> `config_module` -> `registry` -> `next_keys` -> `keys`;
`next_job` -> `job` -> `parallel_config` -> `keys` -> `errors`; `rules` imports nothing.
"""

from planner.torchtitan.errors import JobConfigError
from planner.torchtitan.job import TorchTitanJob, load_job_config, torchtitan_job

__all__ = ["JobConfigError", "TorchTitanJob", "load_job_config", "torchtitan_job"]
