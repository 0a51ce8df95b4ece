"""Parameter counts: published figures, the analytic formula, the CLI."""

import json
import random

import pytest

from transformers_jax import models
from transformers_jax.models import counting, flops
from transformers_jax.config import ModelConfig, load_config_module
from transformers_jax.models import as_model_config

from conftest import ROOT, run_python

_SHAPES = {}


def param_shapes(cfg):
  """models.param_shapes, traced once per model config in this module: the published-count,
  formula and breakdown tests all ask for the same presets (up to 96 blocks each)."""
  c = as_model_config(cfg)
  if c not in _SHAPES:
    _SHAPES[c] = models.param_shapes(c)
  return _SHAPES[c]


@pytest.fixture(autouse=True)
def shared_shapes(monkeypatch):
  """counting.count and flops.summary read the shared shapes too."""
  monkeypatch.setattr(counting, "param_shapes", param_shapes)
  monkeypatch.setattr(flops, "param_shapes", param_shapes)


EXACT = {
    ("gpt2", "small"): 124_439_808,
    ("gpt2", "medium"): 354_823_168,
    ("gpt2", "large"): 774_030_080,
    ("gpt2", "xl"): 1_557_611_200,
    # Hugging Face BertModel (with pooler), bert-base/large-uncased
    ("bert", "base"): 109_482_240,
    ("bert", "large"): 335_141_888,
    # timm vit_*_224 / HF ViTForImageClassification, 1,000 classes
    ("vit", "b16"): 86_567_656,
    ("vit", "l16"): 304_326_632,
    ("vit", "h14"): 632_045_800,
}
NOMINAL = {  # (file, preset): (nominal size, tolerance)
    **{
        ("gpt3", p): (n, 0.02)
        for p, n in [
            ("small", 125e6),
            ("medium", 350e6),
            ("large", 760e6),
            ("xl", 1.3e9),
            ("2.7b", 2.7e9),
            ("6.7b", 6.7e9),
            ("13b", 13e9),
            ("175b", 175e9),
        ]
    },
    ("transformer", "base"): (65e6, 0.03),
    ("transformer", "big"): (213e6, 0.03),
    ("vit", "22b"): (21_743e6, 0.001),  # the paper's figure counts the weight matrices only
}


def lesson_gpt2_parameters(n_layers, d, vocab=50257, context=1024):
  """The lesson's formula, verbatim in meaning."""
  embeddings = vocab * d + context * d
  attention = 4 * d * d + 4 * d
  feed_forward = 8 * d * d + 5 * d
  norms = 4 * d
  return embeddings + n_layers * (attention + feed_forward + norms) + 2 * d


@pytest.mark.parametrize("file,preset", sorted(EXACT))
def test_exact_published_counts(experiment, file, preset):
  assert counting.count(experiment(file, preset).model) == EXACT[(file, preset)]


@pytest.mark.parametrize(
    "preset,layers,d",
    [("small", 12, 768), ("medium", 24, 1024), ("large", 36, 1280), ("xl", 48, 1600)],
)
def test_gpt2_equals_lesson_formula(experiment, preset, layers, d):
  assert counting.count(experiment("gpt2", preset).model) == lesson_gpt2_parameters(layers, d)


@pytest.mark.parametrize("file,preset", sorted(NOMINAL))
def test_nominal_sizes(experiment, file, preset):
  nominal, tol = NOMINAL[(file, preset)]
  n = counting.count(experiment(file, preset).model)
  assert abs(n - nominal) / nominal <= tol, (n, nominal)


def all_presets():
  for file in ("gpt2", "gpt3", "bert", "transformer", "vit"):
    module = load_config_module(str(ROOT / "experiments" / f"{file}.py"))
    for preset in module.PRESETS:
      yield file, preset


@pytest.mark.parametrize("file,preset", list(all_presets()))
def test_every_preset_analytic_equals_eval_shape(experiment, file, preset):
  c = ModelConfig.from_dict(experiment(file, preset).model)
  assert counting.tree_breakdown(param_shapes(c), c) == counting.analytic_breakdown(c)


def random_config(rng: random.Random) -> ModelConfig:
  family = rng.choice(["decoder", "encoder", "encoder_decoder", "vit"])
  heads = rng.choice([1, 2, 4])
  kv = rng.choice([h for h in (1, 2, 4) if heads % h == 0])
  head = ""
  if family == "encoder":
    head = rng.choice(["pooler", "mlm", "classifier"])
  if family == "vit":
    head = rng.choice(["classifier", "pooler", "none"])
  ff = rng.choice(["dense", "moe"])
  scan = rng.random() < 0.3
  return ModelConfig(
      family=family,
      num_layers=rng.randint(1, 3),
      num_encoder_layers=rng.choice([None, 1, 2]),
      num_decoder_layers=rng.choice([None, 1, 3]),
      d_model=8 * heads * rng.choice([1, 2]),
      num_heads=heads,
      num_kv_heads=kv,
      head_dim=rng.choice([None, 4, 6]),
      d_ff=rng.choice([None, 24]),
      vocab_size=rng.choice([50, 97]),
      max_len=rng.choice([16, 32]),
      type_vocab_size=rng.choice([0, 2]),
      positions=rng.choice(["sinusoidal", "learned", "none"]),
      norm_placement=rng.choice(["pre", "post", "sandwich", "none"]),
      norm=rng.choice(["layernorm", "rmsnorm"]),
      norm_scale=rng.random() < 0.8,
      norm_bias=rng.choice([None, True, False]),
      final_norm=rng.choice([None, True, False]),
      embed_norm=rng.random() < 0.3,
      activation=rng.choice(["relu", "gelu", "swiglu", "geglu"]),
      use_bias=rng.random() < 0.5,
      feed_forward=ff,
      num_experts=rng.choice([2, 4]),
      top_k=1 + int(rng.random() < 0.5),
      moe_every=1 if scan else rng.choice([1, 2]),
      tie_embeddings=rng.random() < 0.5,
      share_embeddings=rng.random() < 0.5,
      head=head,
      num_classes=rng.choice([3, 5]),
      image_size=8,
      patch_size=rng.choice([2, 4]),
      num_channels=rng.choice([1, 3]),
      pool=rng.choice(["cls", "mean"]),
      scan_layers=scan,
  )


@pytest.mark.parametrize("seed", range(40))
def test_random_configs_analytic_equals_eval_shape(seed):
  c = random_config(random.Random(seed))
  assert counting.tree_breakdown(param_shapes(c), c) == counting.analytic_breakdown(c), c


def test_gpt2_small_shares_match_the_lesson(experiment):
  s = flops.summary(experiment("gpt2", "small"))
  assert 0.64 < s["blocks_share"] < 0.70  # "about two thirds of the parameters are in the blocks"
  assert 0.64 < s["feed_forward_share_of_blocks"] < 0.69  # "two thirds of each block"


def test_vit_flops_count_its_patches_not_the_text_seq_len(experiment):
  """A ViT's sequence is its patches and class token (17 for vit.py:tiny, 197 for b16), not the
  config's text seq_len (128), as in training's MFU."""
  for preset, tokens in (("tiny", 17), ("b16", 197)):
    config = experiment("vit", preset)
    s = flops.summary(config)
    assert s["flops_seq_len"] == tokens != config.seq_len
    assert s["flops_per_token"] == flops.flops_per_token(
        counting.as_model_config(config.model), tokens
    )


def test_flops_per_token_name_their_length_and_the_models_context(experiment):
  """GPT-3's presets train 128-token sequences on a CPU; its context is 2,048: param_count says
  which length its FLOPs are for, and gives them at the model's context too."""
  config = experiment("gpt3", "small")
  s = flops.summary(config)
  c = counting.as_model_config(config.model)
  assert s["flops_seq_len"] == config.seq_len == 128 and s["context_len"] == c.max_len == 2048
  assert s["flops_per_token_at_context"] == flops.flops_per_token(c, 2048)
  assert s["flops_per_token_at_context"] > s["flops_per_token"]
  text = flops.flops_text(s)
  assert f"{s['flops_per_token']:.4g} at T = 128 (the config's seq_len)" in text
  assert f"{s['flops_per_token_at_context']:.4g} at the model's context T = 2,048" in text
  config.seq_len = 2048  # at the context: one figure, said to be the context's
  assert flops.flops_text(flops.summary(config)).endswith("T = 2,048, the model's context)")


def test_moe_active_count_below_total():
  c = ModelConfig(feed_forward="moe", num_experts=8, top_k=2)
  total, active = counting.analytic_count(c), counting.analytic_count(c, active=True)
  dense_ffn = counting.analytic_breakdown(c.replace(feed_forward="dense"))["feed_forward"]
  assert active < total
  # active = total - (E - k) experts' FFNs
  assert total - active == (8 - 2) * dense_ffn // c.num_layers * c.num_layers


def test_flops_per_token_convention(experiment):
  c = ModelConfig.from_dict(experiment("gpt2", "small").model)
  n = flops.matmul_params_per_token(c)
  # attention and feed-forward weights plus the tied unembedding; no lookups, no norms
  assert n == 28_348_416 + 56_669_184 + 50257 * 768
  assert flops.flops_per_token(c, 1024) == 6 * n + 12 * 12 * 768 * 1024


def test_params_cli_json():
  out = run_python(
      ["-m", "transformers_jax.param_count"]
      + ["--config", str(ROOT / "experiments/gpt2.py") + ":small", "--json"]
  )
  assert out.returncode == 0, out.stderr[-2000:]
  s = json.loads(out.stdout)
  assert s["total"] == s["analytic"] == s["published"] == 124_439_808
  assert s["active_per_token"] == s["total"]
  assert set(s["breakdown"]) == {
      "token_embedding",
      "position_embedding",
      "attention",
      "feed_forward",
      "norms",
  }
  assert sum(s["breakdown"].values()) == s["total"]
  assert s["flops_per_token"] > 6 * s["total"] * 0.5


def test_params_cli_bad_config_is_one_line():
  out = run_python(
      ["-m", "transformers_jax.param_count"]
      + ["--config", str(ROOT / "experiments/gpt2.py") + ":tiny", "--config.model.num_heads=5"]
  )
  assert out.returncode == 2
  assert out.stderr.strip().count("\n") == 0 and "model.num_heads" in out.stderr
  assert "Traceback" not in out.stderr


def test_param_count_breakdown_sums_to_the_total_for_every_experiment_file(experiment):
  """param_count's breakdown takes every component the parameters fall into, so it sums to
  the total (it left out T5's relative-bias tables: 181,248 of t5.py:tiny's 181,504). One
  preset per file here (the first; the analytic test above covers every preset of five files),
  plus t5.py:tiny's figures."""
  for file in sorted(p.stem for p in (ROOT / "experiments").glob("*.py")):
    module = load_config_module(str(ROOT / "experiments" / f"{file}.py"))
    if not hasattr(module, "PRESETS"):
      continue
    summary = flops.summary(experiment(file, next(iter(module.PRESETS))))
    assert sum(summary["breakdown"].values()) == summary["total"], file
  t5 = flops.summary(experiment("t5", "tiny"))
  assert t5["total"] == 181_504 and t5["breakdown"]["position_bias"] == 256


def test_flops_count_the_keys_a_window_or_chunk_attends(experiment):
  """Mistral 7B v0.1 slides a 4,096-key window on every layer: at its 32,768-token context the
  attention term is 12 H K L 4,096, and the whole step about half of what full layers cost. A
  layer pattern counts each layer's own span (Gemma 3: 5 sliding to 1 full; chunked layers)."""
  c = ModelConfig.from_dict(experiment("mistral", "7b-v0.1").model)
  T, HK = 32_768, c.num_heads * c.head_width
  windowed = flops.flops_per_token(c, T)
  assert windowed == 6 * flops.matmul_params_per_token(c) + 12 * HK * c.num_layers * 4096
  full = flops.flops_per_token(c.replace(sliding_window=0), T)
  assert 0.45 < windowed / full < 0.55
  config = experiment("mistral", "7b-v0.1")
  config.seq_len = T
  s = flops.summary(config)
  assert s["flops_per_token_full_attention"] == full and s["flops_per_token"] == windowed
  assert "were every layer full" in flops.flops_text(s)
  assert flops.attended_keys(c, 32, 1000) == 32 * 1000  # a window longer than the sequence
  layers = c.replace(layer_types="sliding,sliding,full,chunked", attention_chunk=512)
  assert flops.attended_keys(layers, 8, T) == 4 * 4096 + 2 * T + 2 * 512
