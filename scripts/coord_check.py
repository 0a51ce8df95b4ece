"""The coordinate check (Yang et al. 2021, Tensor Programs V, Fig. 5): how large each layer's
activations are after a few Adam steps, across widths, under each parametrisation.

    python scripts/coord_check.py --out experiments/results/mup \
        [--families decoder,vit] [--widths 64,128,256,512,1024] [--steps 4] [--seeds 3]

For every family, parametrisation (sp, mup with base width the smallest width) and width, a model
of `--depth` blocks (4 heads whose width grows with d_model, d_ff 4 d_model) is initialised and
trained for `--steps` Adam steps at rate `--lr` (constant, no decay, no clipping) on one fixed
batch (for the decoder 8 rows of 32 bytes of this docstring's text, whose tokens' gradients
agree as real text's do; for the ViT 8 x 8 random RGB images and 10 random classes).
Before the first step and after each one, the size of every layer's output on that batch is
read: the mean absolute coordinate, mean |x| (the paper's l1 size), averaged over seeds. Layers:
`embed` (the embedder's output), per block `layer_i/self_attn` and `layer_i/ffn` (the
sublayers' outputs) and `layer_i` (the residual stream leaving the block), and `logits`.

Under μP the sizes stay the same as the width grows (flat lines); under the standard
parametrisation they grow with width after the first steps (the logits and the attention
output fastest), which is why its best learning rate moves. Writes

  coord_check.json              per family and parametrisation: widths, steps, each layer's size
                                per step and width, and `spread` (max / min over widths after
                                the last step) per layer, `flat` (every spread <= 2)
  coord_check_{family}.png      one row per parametrisation, one panel per step: each layer's
                                size against width (log-log)
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags
from flax import linen as nn

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.models import ModelConfig, build_model, initializer
from transformers_jax.scripting import output_paths
from transformers_jax.train import optim
from transformers_jax.train_config import experiment_config

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string("out", None, "Output folder.", flag_values=FLAGS)
flags.DEFINE_list("families", ["decoder", "vit"], "decoder and/or vit.", flag_values=FLAGS)
flags.DEFINE_list(
    "widths", ["64", "128", "256", "512", "1024"], "d_model values.", flag_values=FLAGS
)
flags.DEFINE_integer("depth", 2, "Blocks.", flag_values=FLAGS)
flags.DEFINE_integer("steps", 4, "Adam steps.", flag_values=FLAGS)
flags.DEFINE_integer("seeds", 3, "Seeds 0..N-1 (initialisation and batch).", flag_values=FLAGS)
flags.DEFINE_float("lr", 1e-2, "Adam's rate (at the base width under μP).", flag_values=FLAGS)

PARAMETRIZATIONS = ("sp", "mup")
FLAT = 2.0  # the largest max / min size over widths that counts as flat
CAPTURED = ("Embedder", "Attention", "FeedForward", "MoE", "Block")
BATCH, LENGTH, IMAGE, CLASSES = 8, 32, 8, 10
TEXT = " ".join(__doc__.split()).encode()  # the decoder's batch: byte rows of this docstring


def model_config(family: str, parametrization: str, width: int, base: int, depth: int):
  fields = dict(
      family=family,
      d_model=width,
      num_heads=4,
      d_ff=4 * width,
      num_layers=depth,
      vocab_size=256,
      max_len=LENGTH,
      parametrization=parametrization,
      mup_base_width=0 if parametrization == "sp" else base,
  )
  if family == "vit":
    fields.update(image_size=IMAGE, patch_size=4, num_classes=CLASSES, num_channels=3)
  return ModelConfig(**fields)


def batch_of(family: str, seed: int):
  rng = np.random.default_rng(1000 + seed)
  if family == "vit":
    images = rng.standard_normal((BATCH, IMAGE, IMAGE, 3), np.float32)
    return jnp.asarray(images), jnp.asarray(rng.integers(0, CLASSES, BATCH), jnp.int32)
  text = np.frombuffer(TEXT, np.uint8)  # rows of real text: gradients that agree across tokens
  starts = rng.integers(0, len(text) - LENGTH, BATCH)
  tokens = jnp.asarray(np.stack([text[s : s + LENGTH] for s in starts]), jnp.int32)
  return tokens, tokens[:, 1:]


def layer_name(path: tuple[str, ...]) -> str:
  """('decoder', 'layer_0', 'self_attn') -> 'layer_0/self_attn'; the embedder -> 'embed'."""
  inner = [p for p in path if p not in ("decoder", "encoder", "__call__")]
  return "/".join(inner) if inner != ["embed"] else "embed"


def sizes(model, params, inputs) -> dict[str, float]:
  """{layer: mean |x| of its output} on `inputs`, and the logits'."""
  captured = lambda module, method: (  # noqa: E731
      method == "__call__" and type(module).__name__ in CAPTURED
  )
  out, state = model.apply(
      {"params": params}, inputs, capture_intermediates=captured, mutable=["intermediates"]
  )
  found = {"logits": jnp.mean(jnp.abs(out["logits"]))}
  flat = jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]
  for path, value in flat:
    keys = tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path)
    if "__call__" not in keys or "residual_rms" in keys:
      continue
    name = layer_name(tuple(k for k in keys if isinstance(k, str)))
    found[name] = jnp.mean(jnp.abs(value.astype(jnp.float32)))
  return found


def loss_fn(model, family: str):
  def loss(params, inputs, labels):
    logits = model.apply({"params": params}, inputs)["logits"]
    if family != "vit":
      logits = logits[:, :-1]
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  return loss


def train_config(model_cfg: ModelConfig, lr: float, steps: int):
  config = experiment_config()
  config.model.update(model_cfg.to_dict())
  config.update(
      dict(
          learning_rate=lr,
          warmup_steps=0,
          lr_schedule="constant",
          weight_decay=0.0,
          grad_clip=0.0,
          steps=steps,
      )
  )
  return config


def check_width(family, parametrization, width, base, depth, steps, seeds, lr):
  """[steps + 1] dicts {layer: size}, the seed mean, for one model."""
  model_cfg = model_config(family, parametrization, width, base, depth)
  model = build_model(model_cfg)
  tx = optim.make_optimizer(train_config(model_cfg, lr, steps))
  loss = loss_fn(model, family)

  @jax.jit
  def run(seed, inputs, labels):
    params = nn.unbox(initializer(model_cfg)(jax.random.PRNGKey(seed)))

    def step(carry, _):  # one Adam step, then the sizes (one compiled body for every step)
      params, state = carry
      updates, state = tx.update(jax.grad(loss)(params, inputs, labels), state, params)
      params = optax.apply_updates(params, updates)
      return (params, state), sizes(model, params, inputs)

    _, trained = jax.lax.scan(step, (params, tx.init(params)), None, length=steps)
    first = sizes(model, params, inputs)
    return {k: jnp.concatenate([first[k][None], trained[k]]) for k in first}

  per_seed = [jax.device_get(run(seed, *batch_of(family, seed))) for seed in range(seeds)]
  return [
      {k: float(np.mean([s[k][t] for s in per_seed])) for k in per_seed[0]}
      for t in range(steps + 1)
  ]


def coord_check(family, widths, depth=2, steps=4, seeds=3, lr=1e-2) -> dict:
  """{parametrization: {widths, steps, layers: {layer: [[size per width] per step]}, spread,
  flat}} for one family; μP's base width is the smallest width."""
  widths = sorted(widths)
  result = {}
  for p in PARAMETRIZATIONS:
    runs = [check_width(family, p, w, widths[0], depth, steps, seeds, lr) for w in widths]
    layers = {k: [[r[t][k] for r in runs] for t in range(steps + 1)] for k in runs[0][0]}
    spread = {k: max(v[-1]) / min(v[-1]) for k, v in layers.items()}
    result[p] = {
        "widths": widths,
        "steps": steps,
        "lr": lr,
        "seeds": seeds,
        "layers": layers,
        "spread": spread,
        "flat": all(s <= FLAT for s in spread.values()),
    }
  return result


def plot(family: str, result: dict, out: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  steps = result["sp"]["steps"]
  fig, axes = plt.subplots(
      len(PARAMETRIZATIONS), steps, figsize=(3.2 * steps, 3.0 * len(PARAMETRIZATIONS)), sharey=True
  )
  for row, p in enumerate(PARAMETRIZATIONS):
    r = result[p]
    for t in range(1, steps + 1):
      ax = axes[row][t - 1]
      for i, (layer, values) in enumerate(r["layers"].items()):
        ax.plot(r["widths"], values[t], marker="o", ms=3, color=f"C{i % 10}", label=layer)
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_title(f"{p}, after step {t}", fontsize=9)
      ax.set_xlabel("width (d_model)")
      if t == 1:
        ax.set_ylabel("mean |x|")
  axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
  fig.suptitle(f"coordinate check, {family}: flat under mup, growing under sp", fontsize=10)
  fig.tight_layout()
  fig.savefig(out / f"coord_check_{family}.png", dpi=100)
  plt.close(fig)


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.out:
    raise UserError("--out is required, e.g. --out experiments/results/mup")
  try:
    widths = [int(w) for w in FLAGS.widths]
  except ValueError:
    raise UserError(f"--widths={','.join(FLAGS.widths)}: integers, e.g. 64,128,256") from None
  if len(widths) < 2 or min(widths) < 8 or any(w % 4 for w in widths):
    raise UserError(f"--widths={FLAGS.widths}: two or more, each a multiple of 4 (the heads)")
  unknown = sorted(set(FLAGS.families) - {"decoder", "vit"})
  if unknown:
    raise UserError(f"--families: {unknown[0]!r} is not decoder or vit")
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  report = {}
  for family in FLAGS.families:
    result = coord_check(family, widths, FLAGS.depth, FLAGS.steps, FLAGS.seeds, FLAGS.lr)
    report[family] = result
    plot(family, result, out)
    for p, r in result.items():
      worst = max(r["spread"], key=r["spread"].get)
      print(
          f"{family} {p}: largest spread over widths {r['spread'][worst]:.2f} ({worst}); "
          f"{'flat' if r['flat'] else 'not flat'}"
      )
  (out / "coord_check.json").write_text(json.dumps(report, indent=1) + "\n")
  print(f"wrote {out}/coord_check.json and coord_check_{{{','.join(FLAGS.families)}}}.png")
  return 0


if __name__ == "__main__":
  cli.run_script(main)
