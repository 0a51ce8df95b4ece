"""A run folder and what it holds: the run (runs: config, tokenizer, run.json, run_history.jsonl),
its orbax checkpoints (checkpoints, disk_full) and the one-run-per-folder lock (workdir_lock).
The JSON records' reading and writing is transformers_jax/records.py, which every layer uses."""
