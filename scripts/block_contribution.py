"""What each block of a trained decoder contributes: the loss when it is skipped, and how far it
turns the residual stream.

    python scripts/block_contribution.py --runs RUN[,RUN...] --out FOLDER

Mix-LN (Li et al. 2024) and LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth") both say
that in a pre-LN model the deep blocks contribute little: the residual stream's variance grows
with depth, each deeper block's update is small against it, and removing a deep block barely
changes the loss. Their placements (post-LN for the first blocks, then pre-LN; or each block's
norm output scaled by 1/sqrt(layer)) are meant to make the deep blocks count again. For every
member of every run given (a population's members, or a solo run) this script measures on the
run's held-out batches, per block l:

  skip_loss_increase   held-out loss with block l's residual branches switched off (its
                       attention and feed-forward output projections zeroed, so that a
                       pre-LN-style block passes its input through unchanged), minus the loss
                       of the whole model (nats per token)
  angular_distance     arccos(cos(h_{l-1}, h_l)) / pi, the angle between the residual stream
                       entering and leaving the block, per token, averaged (the curse-of-depth
                       paper's measure; 0 = the block changes nothing)

It writes contribution.jsonl (one line per run and member) and table.md: per run, the seed
mean of both measures for the first, middle and last third of the blocks. Blocks run unrolled
(a scanned checkpoint is relaid), so capture_intermediates sees each block's output.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_list("runs", [], "Run folders (solo runs or populations).", flag_values=FLAGS)
flags.DEFINE_string("out", None, "Output folder.", flag_values=FLAGS)
flags.DEFINE_bool("report_only", False, "Rewrite table.md from the jsonl.", flag_values=FLAGS)

# the output projections of a block's residual branches: zeroed, the branch adds nothing
BRANCH_OUTPUTS = (("self_attn", "out"), ("ffn", "wo"))


def held_out_batches(workdir: pathlib.Path):
  """The run's own held-out LM batches ([B, T + 1] token rows), as its training evaluated."""
  from transformers_jax.run_folder import runs
  from transformers_jax.train.setup import Setup

  config = runs.Run(workdir).config()
  with tempfile.TemporaryDirectory() as tmp:
    config.data.cache_dir = tmp
    return [b["tokens"] for b in Setup(config).data(pathlib.Path(tmp)).eval_batches]


def member_probe(model_cfg):
  """The jitted (params, tokens) -> (loss, skip-loss increase [L], angular distance [L]) of a
  decoder config, blocks unrolled: one compilation for every member of a run. The skipped
  block is a traced index (lax.map over the blocks), so the program holds two forward passes
  whatever the depth."""
  import jax
  import jax.numpy as jnp
  import optax

  from transformers_jax import models

  cfg = model_cfg.replace(scan_layers=False, dropout=0.0)
  model = models.build_model(cfg)
  layers = [f"layer_{i}" for i in range(cfg.num_layers)]

  def loss_and_stream(p, tokens):
    """Mean next-token loss, and the residual stream entering block 0 and leaving each block."""
    out, state = model.apply(
        {"params": p},
        tokens[:, :-1],
        capture_intermediates=lambda module, _: type(module).__name__ in ("Block", "Embedder"),
    )
    nll = optax.softmax_cross_entropy_with_integer_labels(out["logits"], tokens[:, 1:])
    found = state["intermediates"]
    stream = [found["embed"]["__call__"][0]]
    stream += [found["decoder"][k]["__call__"][0] for k in layers]
    return jnp.mean(nll), stream

  def skipped(p, index):
    """`p` with block `index`'s branch output projections multiplied by 0 (the others by 1)."""
    decoder = dict(p["decoder"])
    for i, name in enumerate(layers):
      keep = (index != i).astype(jnp.float32)
      block = dict(decoder[name])
      for sub, proj in BRANCH_OUTPUTS:
        block[sub] = {
            **block[sub],
            proj: jax.tree_util.tree_map(lambda w, k=keep: w * k.astype(w.dtype), block[sub][proj]),
        }
      decoder[name] = block
    return {**p, "decoder": decoder}

  def skip_loss(p, tokens, index):
    out = model.apply({"params": skipped(p, index)}, tokens[:, :-1])
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out["logits"], tokens[:, 1:]))

  @jax.jit
  def probe(p, tokens):
    base, stream = loss_and_stream(p, tokens)
    angles = []
    for h0, h1 in zip(stream[:-1], stream[1:]):
      cos = jnp.sum(h0 * h1, -1) / (jnp.linalg.norm(h0, axis=-1) * jnp.linalg.norm(h1, axis=-1))
      angles.append(jnp.mean(jnp.arccos(jnp.clip(cos, -1.0, 1.0))) / jnp.pi)
    increases = jax.lax.map(lambda i: skip_loss(p, tokens, i), jnp.arange(len(layers))) - base
    return base, increases, jnp.stack(angles)

  return probe


def measure_member(model_cfg, params, batches, probe=None) -> dict:
  """{loss, skip_loss_increase [L], angular_distance [L]}: means over the held-out batches."""
  import jax.numpy as jnp

  from transformers_jax.modules.block import in_layout

  probe = probe or member_probe(model_cfg)
  params = in_layout(params, False)
  results = [probe(params, jnp.asarray(t)) for t in batches]

  def mean(i):
    return jnp.mean(jnp.stack([jnp.asarray(r[i]) for r in results]), axis=0).tolist()

  return {"loss": mean(0), "skip_loss_increase": mean(1), "angular_distance": mean(2)}


def measure_run(workdir: pathlib.Path) -> list[dict]:
  """One record per member (one for a solo run)."""
  from transformers_jax.run_folder import runs
  from transformers_jax.train import members as members_lib

  config = runs.Run(workdir).config()
  table = members_lib.members(config) if members_lib.enabled(config) else [None]
  batches = held_out_batches(workdir)
  out = []
  probe = None
  for member in table:
    index = None if member is None else member["member"]
    model_cfg, params, _, step = runs.load_run(workdir, member=index)
    probe = probe or member_probe(model_cfg)  # one compilation for the run's members
    record = {"run": workdir.name, "step": step, **(member or {"seed": config.seed})}
    record.update(measure_member(model_cfg, params, batches, probe))
    out.append(record)
    print(f"{workdir.name} member {index}: held-out loss {record['loss']:.4f}", flush=True)
  return out


def thirds(values: list[float]) -> list[float]:
  """Means of the first, middle and last third of the blocks."""
  n = len(values)
  cuts = [0, n // 3, (2 * n) // 3, n]
  return [sum(values[a:b]) / max(b - a, 1) for a, b in zip(cuts, cuts[1:])]


def write_table(records: list[dict], out: pathlib.Path) -> None:
  lines = [
      "# What each block contributes: loss when skipped, angle it turns the residual stream",
      "",
      "| run | members | held-out loss | skip: loss increase, first / middle / last third "
      "| skip: last block | angular distance, first / middle / last third |",
      "|---|---|---|---|---|---|",
  ]
  for run in dict.fromkeys(r["run"] for r in records):
    rs = [r for r in records if r["run"] == run]
    n = len(rs)
    loss = sum(r["loss"] for r in rs) / n
    skip = [sum(x) / n for x in zip(*(thirds(r["skip_loss_increase"]) for r in rs))]
    last = sum(r["skip_loss_increase"][-1] for r in rs) / n
    angle = [sum(x) / n for x in zip(*(thirds(r["angular_distance"]) for r in rs))]
    lines.append(
        f"| {run} | {n} | {loss:.4f} | "
        + " / ".join(f"{x:.4f}" for x in skip)
        + f" | {last:.4f} | "
        + " / ".join(f"{x:.3f}" for x in angle)
        + " |"
    )
  lines += [
      "",
      "Means over the members (seeds) of each run, on the run's held-out batches. Skip: the "
      "block's attention and feed-forward output projections zeroed (for a pre-LN-style block, "
      "the block removed). Angular distance: arccos(cos(h_in, h_out)) / pi per token, averaged. "
      "Command: `python scripts/block_contribution.py` (see its docstring).",
  ]
  (out / "table.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.out or (not FLAGS.runs and not FLAGS.report_only):
    raise UserError("--runs and --out are required, e.g. --runs RUN_A,RUN_B --out FOLDER")
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  path = out / "contribution.jsonl"
  if not FLAGS.report_only:
    records = []
    for run in FLAGS.runs:
      records += measure_run(pathlib.Path(run))
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
  write_table([json.loads(line) for line in path.read_text().splitlines()], out)
  print(f"wrote {out}/contribution.jsonl, table.md", flush=True)
  return 0


if __name__ == "__main__":
  cli.run_script(main)
