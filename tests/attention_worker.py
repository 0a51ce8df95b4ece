"""Run in a subprocess by tests/test_attention_impls.py, with 4 simulated CPU devices.

    python tests/attention_worker.py

Splash attention (interpret mode) on a data 2 x tensor 2 mesh, where shard_map splits the batch
and the heads, against the einsum reference on the same inputs: prints one JSON object with
the largest relative difference of the output and of each gradient, and whether the lowered
step holds a manual (shard_map) computation.
"""

import json
import os
import pathlib
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformers_jax.machine import parallel  # noqa: E402
from transformers_jax.modules.attention import attend  # noqa: E402
from transformers_jax.modules.masks import AttentionMask  # noqa: E402


def main():
  mesh = parallel.make_mesh({"data": 2, "tensor": 2})
  rules = parallel.rules()
  B, T, H, G, K = 4, 200, 4, 2, 16
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(keys[0], (B, T, H, K))
  k, v = (jax.random.normal(kk, (B, T, G, K)) for kk in keys[1:])
  segments = jnp.asarray(np.repeat([[1] * 90 + [2] * 80 + [0] * 30], B, axis=0))
  mask = AttentionMask(q_segments=segments)

  def grads(impl):
    def loss(q, k, v):
      with nn.logical_axis_rules(rules):
        q = nn.with_logical_constraint(q, ("act_batch", None, "act_heads", None))
        out = attend(q, k, v, mask, True, impl=impl, block_q=128, block_kv=128)
      return jnp.sum(out * out), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

  with jax.set_mesh(mesh):
    step = grads("splash")
    manual = "manual" in step.lower(q, k, v).as_text()
    (_, out), dqkv = step(q, k, v)
  (_, want), want_dqkv = grads("einsum")(q, k, v)
  errors = [
      float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
      for a, b in zip((out, *dqkv), (want, *want_dqkv))
  ]
  print(json.dumps({"manual": manual, "errors": errors}))


if __name__ == "__main__":
  main()
