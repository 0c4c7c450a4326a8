"""`plan check`: a plan trained on gloo ranks against one process. `operator` checks
operator-level (mesh) and graph plans, `training_check` a transformer's training plan, and
`check_report` writes any of them as one JSON layout."""
