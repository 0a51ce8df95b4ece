"""A run folder and what it holds: the run (runs: config, tokenizer, run.json, run_history.jsonl,
and what a training start reads of them, at once: Run.found) and its orbax checkpoints
(checkpoints, disk_full). The JSON records' reading and writing is transformers_jax/records.py,
which every layer uses; the one-run-per-folder lock is train/entry.py's."""
