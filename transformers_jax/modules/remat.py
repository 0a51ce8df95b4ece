"""Rematerialisation by name: what a rematerialised block keeps for the backward pass.

Inside the block every projection's output carries a name (`jax.ad_checkpoint.checkpoint_name`):

| name | what |
|---|---|
| `query_proj`, `key_proj`, `value_proj` | the q, k, v projections ([B, T, heads, head_dim]) |
| `context` | attention's output before the out projection |
| `out_proj` | the out projection |
| `mlpwi` (`mlpwi_0`, `mlpwi_1` gated) | the feed-forward's input projections |
| `mlpwo` | the feed-forward's output projection |
| `moe_dispatch`, `moe_combine` | a mixture of experts' tokens sent to / gathered from the experts |
| `norm` | every norm's output |

`model.remat` picks a policy (MaxText's names where they exist): `none` (no remat), `full`
(keep nothing: recompute the whole block), `minimal` (keep every projection's output: q, k, v,
out and the MLP's), `save_dot_except_mlpwi` (all of those but the MLP's input projections, the
widest), `save_dot_except_mlp` (attention's only), `save_dot_with_context_except_mlp` (and the
attention context), `save_qkv_proj`, `save_out_proj`, JAX's `dots_saveable` and
`dots_with_no_batch_dims_saveable`, and `custom`: `model.remat_save` says for each name (or
group: `qkv_proj` is q, k and v; `mlpwi` all input projections) `device` (keep), `offload` (keep
in the host's pinned memory, where the backend has it; else kept on the device) or `remat`
(recompute, the default), e.g. `qkv_proj:offload,out_proj:device`.
"""

from __future__ import annotations

import jax

NAMES = (
    "query_proj",
    "key_proj",
    "value_proj",
    "context",
    "out_proj",
    "mlpwi",
    "mlpwi_0",
    "mlpwi_1",
    "mlpwo",
    "moe_dispatch",
    "moe_combine",
    "norm",
)
GROUPS = {
    "qkv_proj": ("query_proj", "key_proj", "value_proj"),
    "mlpwi": ("mlpwi", "mlpwi_0", "mlpwi_1"),
    **{name: (name,) for name in NAMES if name != "mlpwi"},
}
_QKV = GROUPS["qkv_proj"]
_MLPWI = GROUPS["mlpwi"]
# policy -> the names it keeps on the device (None: a JAX policy of that name, or no remat)
SAVED = {
    "minimal": (*_QKV, "out_proj", *_MLPWI, "mlpwo"),
    "save_dot_except_mlpwi": (*_QKV, "out_proj", "mlpwo"),
    "save_dot_except_mlp": (*_QKV, "out_proj"),
    "save_dot_with_context_except_mlp": (*_QKV, "context", "out_proj"),
    "save_qkv_proj": _QKV,
    "save_out_proj": ("out_proj",),
}
POLICIES = (
    "none",
    "full",
    *SAVED,
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "custom",
)
ACTIONS = ("device", "offload", "remat")


def parse_custom(text: str) -> dict[str, str]:
  """`remat_save`'s "name:action,..." as {name: action} over single names (groups expanded).
  Raises ValueError naming the first entry that does not parse."""
  out = {}
  for entry in (e.strip() for e in text.split(",") if e.strip()):
    name, _, action = entry.partition(":")
    if name.strip() not in GROUPS or action.strip() not in ACTIONS:
      raise ValueError(entry)
    for single in GROUPS[name.strip()]:
      out[single] = action.strip()
  return out


def config_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) of a remat setting that cannot work, or None."""
  if c.remat not in POLICIES:
    return "remat", repr(c.remat), f"choose one of {', '.join(POLICIES)}"
  if c.remat == "custom":
    try:
      if not parse_custom(c.remat_save):
        raise ValueError(c.remat_save)
    except ValueError as e:
      fix = (
          f"entry {str(e)!r}: write name:action pairs, e.g. qkv_proj:offload,out_proj:device; "
          f"names {', '.join(GROUPS)}; actions {', '.join(ACTIONS)}"
      )
      return "remat_save", repr(c.remat_save), fix
  elif c.remat_save:
    return "remat_save", repr(c.remat_save), "is read by model.remat=custom only: set that"
  return None


def host_offload_available() -> bool:
  """Whether the platform compiled for has pinned host memory to offload to: TPU and GPU (an
  ahead-of-time compile for a TPU topology counts as TPU), not the CPU."""
  from transformers_jax.modules.splash import target_platform

  return target_platform() in ("tpu", "gpu", "cuda")


def policy(c):
  """The jax.checkpoint policy of `model.remat` (None: keep nothing)."""
  name = c.remat
  if name == "full":
    return None
  if name in SAVED:
    return jax.checkpoint_policies.save_only_these_names(*SAVED[name])
  if name == "custom":
    actions = parse_custom(c.remat_save)
    keep = [n for n, a in actions.items() if a == "device"]
    offload = [n for n, a in actions.items() if a == "offload"]
    if offload and not host_offload_available():  # kept on the device instead
      keep, offload = keep + offload, []
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=keep,
        names_which_can_be_offloaded=offload,
        offload_src="device",
        offload_dst="pinned_host",
    )
  return getattr(jax.checkpoint_policies, name)
