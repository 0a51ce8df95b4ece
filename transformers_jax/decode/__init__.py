"""Decoding with the KV cache: the prompt in one pass, then one token per step inside one jit."""

from transformers_jax.decode.sampling import generate, translate

__all__ = ["generate", "translate"]
