"""A run folder and what it holds: the run (runs: config, tokenizer, run.json), its orbax
checkpoints (checkpoints, disk_full), the one-run-per-folder lock (workdir_lock) and its
records (records: run_history.jsonl, config.json)."""
