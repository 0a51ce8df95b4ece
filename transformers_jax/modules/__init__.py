"""Building blocks: norms, positions, attention, feed-forward (dense and MoE), the shared Block."""
