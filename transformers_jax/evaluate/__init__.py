"""Evaluation with EleutherAI's lm-evaluation-harness (the `eval` extra): `python -m
transformers_jax.evaluate` on a run (__main__.py), and during training (--config.eval_harness.*,
train/loop.py and train/population.py). scoring.py holds the batched log-likelihoods, adapter.py
lm-eval's model interface over them, harness.py the settings, runs and results files. Nothing
here imports lm-eval until it is used."""
