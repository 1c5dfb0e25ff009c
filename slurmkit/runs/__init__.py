"""The client's runs: creating run folders (registry), finding them (lookup, folders), submit,
status, logs, cancel, result and resubmit (jobs), dependencies, polling Slurm, process liveness,
code snapshots."""
