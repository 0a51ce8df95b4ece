"""Training: objectives per family, optimiser, the sharded jit step, checkpoints, the CLI."""
