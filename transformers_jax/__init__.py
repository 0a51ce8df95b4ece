"""transformers_jax: four transformer families from one shared block."""
