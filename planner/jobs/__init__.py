"""What each rank of an emitted job runs: `graph_job` is the entry point of the
`train_graph.py` that `plan MODEL --gpus N --emit pytorch DIR` writes. A job reads its
plan, builds the model, re-plans where it must (planning is above the runtime, so the job
that joins the two lives here, beside the command line, not in `runtime/`) and trains on
Tessel's runtime."""
