"""Norm-placement ablation: what do pre-, post- and sandwich norm do as a decoder gets deeper?

Superseded by experiments/lr_sensitivity.py (several seeds, a learning-rate grid, qk_norm):
one seed at one learning rate cannot tell the placements apart. Kept for its recorded results
(experiments/results/norm_ablation/, written one run per model by scripts/ablate.py, which
retired in favour of scripts/lr_sensitivity.py); it reruns through that successor:

    python scripts/lr_sensitivity.py --sweep experiments/norm_ablation.py \
        --out runs/norm_ablation [--scale]

Grid: placement {pre, post, sandwich} x norm {layernorm, rmsnorm} x depth x warmup, plus pre-norm
with the residual connections removed (`model.residual=False`, the lesson's exercise "remove the
add(X, ...) calls and stack 12 blocks") at depth 12 (and 24 with --scale). Every model is the
same byte-level decoder (gpt2.py:tiny widened to the sweep's size) on the bundled corpus, same
seed, same batches, same peak learning rate; only the named fields change. Each (placement,
norm, depth) is one population whose members are the warmups (a member trains as its solo run
would), so the 37 models of the default sweep are 19 populations.

The default (CPU) sweep is 3 x 2 x 3 x 2 + 1 = 37 models of 200 steps at d_model 64. `--scale` is
a wider, longer sweep meant for an accelerator (d_model 256, 2,000 steps, depths up to 24).

A sweep file gives BASE (`<config file>:<preset>`, relative to this folder or experiments/) and
`populations(scale) -> [{"name", "overrides"}]`, overrides being dotted config fields
(population lists included).
"""

BASE = "gpt2.py:tiny"

COMMON = {
    "batch_size": 16,
    "seq_len": 64,
    "learning_rate": 3e-3,
    "lr_schedule": "cosine",
    "log_every": 5,
    "eval_every": 100,
    "eval_batches": 8,
    "checkpoint_every": 100,
    "sample.max_new_tokens": 0,
    "model.d_model": 64,
    "model.num_heads": 4,
    "model.max_len": 128,
    "model.scan_layers": True,
}
STEPS = 200
DEPTHS = (2, 6, 12)
WARMUPS = (0, 40)

SCALE = dict(
    COMMON,
    **{  # the same sweep, 4x wider, longer and bigger-batched
        "batch_size": 64,
        "seq_len": 256,
        "learning_rate": 1e-3,
        "log_every": 25,
        "eval_every": 500,
        "eval_batches": 16,
        "checkpoint_every": 500,
        "model.d_model": 256,
        "model.num_heads": 8,
        "model.max_len": 256,
    },
)
SCALE_STEPS = 2000
SCALE_DEPTHS = (2, 6, 12, 24)
SCALE_WARMUPS = (0, 200)
SCALE_NO_RESIDUAL_DEPTHS = (12, 24)

PLACEMENTS = ("pre", "post", "sandwich")
NORMS = ("layernorm", "rmsnorm")


def population(placement, norm, depth, warmups, common, steps, residual=True) -> dict:
  """One (placement, norm, depth) at every warmup of `warmups`: one seed, one learning rate."""
  name = f"{placement}-{norm}-L{depth}" + ("" if residual else "-noresidual")
  overrides = {
      **common,
      "steps": steps,
      "model.norm_placement": placement,
      "model.norm": norm,
      "model.num_layers": depth,
      "model.residual": residual,
      "population.seeds": 1,
      "population.learning_rates": repr((common["learning_rate"],)),
      "population.warmup_steps": repr(tuple(warmups)),
  }
  return {"name": name, "overrides": overrides}


def populations(scale: bool = False) -> list[dict]:
  common, steps = (SCALE, SCALE_STEPS) if scale else (COMMON, STEPS)
  depths = SCALE_DEPTHS if scale else DEPTHS
  warmups = SCALE_WARMUPS if scale else WARMUPS
  out = [
      population(p, n, d, warmups, common, steps) for d in depths for p in PLACEMENTS for n in NORMS
  ]
  for d in (SCALE_NO_RESIDUAL_DEPTHS if scale else (12,)):
    out.append(population("pre", "layernorm", d, warmups[-1:], common, steps, residual=False))
  return out
