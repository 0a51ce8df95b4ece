"""LoRA (models/lora.py): adapters on an imported Hugging Face GPT-2, the base frozen, the
optimizer's state for the adapters only, counted exactly, exported merged or as a PEFT folder."""

import json
import math

import jax
import numpy as np
import pytest
from flax import linen as nn
from safetensors.numpy import load_file, save_file

from transformers_jax.config import ModelConfig
from transformers_jax.convert import export_hf, import_hf
from transformers_jax.errors import UserError
from transformers_jax.interop import load_hf, save_hf
from transformers_jax.models import build_model, counting, flops, initializer, lora, param_shapes
from transformers_jax.run_folder.runs import Run

RANK, ALPHA = 2, 4.0
TARGETS = "q,k,v,out,mlp_in,mlp_out"
BASE = ModelConfig(
    family="decoder",
    num_layers=2,
    d_model=32,
    num_heads=4,
    vocab_size=256,
    max_len=32,
    activation="gelu_tanh",
    head="lm",
)
TOKENS = np.random.default_rng(0).integers(0, 256, (2, 16))


def logits(model_cfg, params, tokens=TOKENS):
  """The model's logits, as one jitted program (op by op, each operation compiles alone)."""
  apply = jax.jit(lambda p, t: build_model(model_cfg).apply({"params": p}, t)["logits"])
  return np.asarray(apply(params, tokens))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
  """A GPT-2 written as a Hugging Face folder, imported (scanned layout), then LoRA-tuned from
  it for 3 steps with adapter dropout: (folder, base run, tuned run)."""
  from transformers_jax.train.entry import train

  root = tmp_path_factory.mktemp("lora")
  params = nn.unbox(jax.jit(initializer(BASE))(jax.random.PRNGKey(0)))  # one program
  save_hf(root / "hf", BASE, params)
  import_hf(root / "hf", root / "base", scan_layers=True)
  words = np.random.default_rng(1).choice(["alpha", "beta", "gamma", "delta"], 3000)
  (root / "corpus.txt").write_text(" ".join(words))
  config = Run(root / "base").config()
  config.update_from_flattened_dict(
      {
          "steps": 3,
          "batch_size": 4,
          "seq_len": 16,
          "log_every": 1,
          "eval_every": 0,
          "checkpoint_every": 3,
          "warmup_steps": 0,
          "learning_rate": 1e-2,
          "data.path": str(root / "corpus.txt"),
          "init_from": str(root / "base"),
          "model.lora_rank": RANK,
          "model.lora_alpha": ALPHA,
          "model.lora_dropout": 0.1,
          "model.lora_targets": TARGETS,
      }
  )
  train(config, str(root / "tuned"))
  return root, Run(root / "base"), Run(root / "tuned")


def test_trainable_parameters_are_rank_times_inputs_plus_outputs_per_matrix():
  cfg = BASE.replace(lora_rank=RANK, lora_targets=TARGETS)
  shapes = nn.unbox(param_shapes(BASE))
  # our kernels [*in, *out]: attention's out projection takes two input axes (heads, head_dim)
  expected = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    names = [str(getattr(k, "key", k)) for k in path]
    if names[-1] == "kernel" and names[-2] in ("query", "key", "value", "out", "wi", "wo"):
      n_in = 2 if names[-2] == "out" else 1
      expected += RANK * (math.prod(leaf.shape[:n_in]) + math.prod(leaf.shape[n_in:]))
  assert expected == RANK * 2 * (3 * (32 + 32) + (32 + 32) + 2 * (32 + 128))
  summary = flops.summary(
      __import__("ml_collections").ConfigDict({"model": cfg.to_dict(), "seq_len": 16})
  )
  assert summary["trainable"] == expected == summary["breakdown"]["lora"]
  assert summary["total"] == counting.count(BASE) + expected == counting.analytic_count(cfg)
  # gated FFNs (two input projections), GQA, cross-attention: the formula equals the tree
  for other in (
      cfg.replace(activation="swiglu", num_kv_heads=2),
      cfg.replace(family="encoder_decoder", lora_targets="q,v,mlp_in", positions="sinusoidal"),
  ):
    assert counting.analytic_breakdown(other)["lora"] == counting.tree_breakdown(
        param_shapes(other)
    ).get("lora")


def test_lora_trains_the_adapters_only(tuned):
  _, base_run, tuned_run = tuned
  base, _ = base_run.load_params()
  params, step = tuned_run.load_params()
  assert step == 3
  # every base parameter is exactly the imported one; the adapters have moved off their init
  np.testing.assert_equal(jax.device_get(lora.base(params)), jax.device_get(base))
  adapters = jax.tree_util.tree_leaves(lora.trainable(params, tuned_run.model_config()))
  assert len(adapters) == 2 * 6 and all(np.any(np.asarray(b) != 0) for b in adapters)
  # Adam's two moments for the adapters, nothing for the frozen weights
  state = tuned_run.checkpoints(async_save=False).restore(3, None)
  moments = sum(np.size(x) for x in jax.tree_util.tree_leaves(state["opt_state"]) if np.ndim(x) > 0)
  assert moments == 2 * sum(np.size(a) for a in adapters)


def test_merged_export_computes_what_the_adapted_model_does(tuned):
  root, _, tuned_run = tuned
  params, _ = tuned_run.load_params()
  adapted = logits(tuned_run.model_config(), params)
  export_hf(tuned_run.path, root / "merged")
  fields, merged = load_hf(root / "merged")
  assert "lora_a" not in json.dumps(jax.tree_util.tree_map(np.shape, merged))
  np.testing.assert_allclose(logits(ModelConfig(**fields), merged), adapted, rtol=1e-5, atol=1e-5)
  frozen = logits(tuned_run.model_config().replace(lora_rank=0), lora.base(params))
  assert np.max(np.abs(frozen - adapted)) > 1e-3  # the adapters changed what it computes


def test_peft_folder_holds_the_adapters_as_peft_applies_them(tuned):
  """The PEFT folder, applied as PEFT's LoRA layer does (W + alpha/r * (B A)^T for GPT-2's
  Conv1D, per module's own rank and alpha), gives the adapted model's logits; peft itself
  loading it is checked by scripts/check_peft_export.py (the `hf` extra)."""
  root, _, tuned_run = tuned
  params, _ = tuned_run.load_params()
  adapted = logits(tuned_run.model_config(), params)
  export_hf(tuned_run.path, root / "peft", lora_as="peft")
  config = json.loads((root / "peft" / "adapter_config.json").read_text())
  assert config["peft_type"] == "LORA" and config["fan_in_fan_out"] is True
  assert config["task_type"] == "CAUSAL_LM" and config["r"] == RANK
  assert len(config["target_modules"]) == 4 * BASE.num_layers  # c_attn, c_proj, c_fc, mlp c_proj
  adapters = load_file(root / "peft" / "adapter_model.safetensors")
  base_folder = root / "peft" / "base_model"
  weights = load_file(base_folder / "model.safetensors")
  for module in config["target_modules"]:
    a = adapters[f"base_model.model.{module}.lora_A.weight"]  # [r, in]
    b = adapters[f"base_model.model.{module}.lora_B.weight"]  # [out, r]
    r = config["rank_pattern"].get(module, config["r"])
    alpha = config["alpha_pattern"].get(module, config["lora_alpha"])
    assert a.shape[0] == b.shape[1] == r
    weights[f"{module}.weight"] = weights[f"{module}.weight"] + alpha / r * (b @ a).T
  save_file(weights, str(base_folder / "model.safetensors"), metadata={"format": "pt"})
  fields, applied = load_hf(base_folder)
  np.testing.assert_allclose(logits(ModelConfig(**fields), applied), adapted, rtol=1e-5, atol=1e-5)
  with pytest.raises(UserError, match="no LoRA adapters"):
    export_hf(root / "base", root / "peft_of_base", lora_as="peft")


def test_lora_refusals_name_the_field():
  for fields, said in (
      (dict(lora_rank=-1), "lora_rank"),
      (dict(lora_rank=2, lora_targets="q,attn"), "lora_targets"),
      (dict(lora_rank=2, lora_alpha=0.0), "lora_alpha"),
      (dict(lora_rank=2, lora_dropout=1.0), "lora_dropout"),
      (dict(lora_rank=2, lora_targets="mlp_in", feed_forward="moe"), "MoE"),
  ):
    with pytest.raises(ValueError, match=said):
      BASE.replace(**fields)


def test_adapters_and_their_optimizer_state_shard_like_their_kernels():
  """On a 2 x 2 mesh (a TPU topology's devices: nothing runs), A splits its input axis over
  fsdp and B its heads over tensor, as the kernel does; Adam's moments follow them."""
  import ml_collections
  from jax.sharding import PartitionSpec as P

  from transformers_jax.machine import hardware, parallel
  from transformers_jax.train import optim
  from transformers_jax.train.state import state_shardings
  from transformers_jax.train_config import training_fields

  cfg = BASE.replace(lora_rank=RANK, lora_targets=TARGETS)
  config = training_fields()
  config.model = ml_collections.ConfigDict(cfg.to_dict())
  mesh = parallel.make_mesh({"fsdp": 2, "tensor": 2}, hardware.topology_devices("v5e:2x2"))
  abstract, shardings = state_shardings(cfg, optim.make_optimizer(config), mesh, parallel.rules())
  query = shardings.params["decoder"]["layer_0"]["self_attn"]["query"]
  assert query["kernel"].spec == P("fsdp", "tensor", None)  # [embed, heads, head_dim]
  assert query["lora_a"].spec == P("fsdp", None)  # [embed, rank]
  assert query["lora_b"].spec == P(None, "tensor", None)  # [rank, heads, head_dim]
  # the optimizer's arrays are Adam's two moments of each adapter, sharded as it is
  adapters = sorted(
      str(s.spec) for s in jax.tree_util.tree_leaves(lora.trainable(shardings.params, cfg))
  )
  state = [
      str(s.spec)
      for s, a in zip(
          jax.tree_util.tree_leaves(shardings.opt_state),
          jax.tree_util.tree_leaves(abstract.opt_state),
      )
      if a.ndim
  ]
  assert len(adapters) == 2 * 6 * BASE.num_layers
  assert sorted(state) == sorted(adapters * 2)


def test_init_from_a_lora_run_into_a_full_model_takes_the_merged_weights(tuned):
  """A full fine-tune started from a LoRA run begins where the adapted model is (the adapters
  folded into the kernels), not at the frozen base."""
  from transformers_jax.train.setup import Setup

  root, _, tuned_run = tuned
  params, _ = tuned_run.load_params()
  config = tuned_run.config()
  config.model.lora_rank = 0
  config.model.lora_targets = "q,v"  # the default: targets without a rank are refused
  config.init_from = str(tuned_run.path)
  setup = Setup(config)
  state, start, note = setup.start(Run(root / "full").checkpoints(async_save=False))
  assert start == 0 and "initialised" in note
  merged, _ = lora.merged(jax.device_get(params), tuned_run.model_config())
  np.testing.assert_allclose(
      logits(setup.model_cfg, state.params), logits(setup.model_cfg, merged), rtol=1e-5, atol=1e-6
  )


# ----------------------------------------------------------------------------- modules_to_save
def test_modules_to_save_are_trained_in_full_beside_the_adapters(tuned, tmp_path):
  """A widened vocabulary (256 -> 300 ids): LoRA alone would leave the new embedding random and
  frozen, so init_from refuses it naming the fix; with lora_modules_to_save=embed the embedding
  trains (and has Adam's moments) beside the adapters, the blocks stay the base model's, and the
  PEFT folder carries the embedding as PEFT's modules_to_save."""
  from transformers_jax.train.entry import train

  root, base_run, _ = tuned
  config = base_run.config()
  config.update_from_flattened_dict(
      {
          "steps": 2,
          "batch_size": 2,
          "seq_len": 16,
          "eval_every": 0,
          "warmup_steps": 0,
          "sample.max_new_tokens": 0,
          "data.path": str(root / "corpus.txt"),
          "init_from": str(root / "base"),
          "model.vocab_size": 300,
          "model.lora_rank": RANK,
          "model.lora_targets": "q,v",
      }
  )
  with pytest.raises(UserError, match=r"lora_modules_to_save=embed to train them in full"):
    train(config, str(tmp_path / "refused"))
  assert Run(tmp_path / "refused").latest_step() is None  # nothing was saved
  config.model.lora_modules_to_save = "embed"
  train(config, str(tmp_path / "saved"))
  run = Run(tmp_path / "saved")
  cfg, (params, _), (base, _) = run.model_config(), run.load_params(), base_run.load_params()
  trained = lora.trainable(params, cfg)
  assert set(trained) == {"decoder", "embed"} and "kernel" not in json.dumps(
      jax.tree_util.tree_map(np.shape, trained["decoder"])
  )
  assert counting.lora_count(cfg) == sum(np.size(x) for x in jax.tree_util.tree_leaves(trained))
  np.testing.assert_equal(  # the blocks are the base model's
      jax.device_get(lora.base(params)["decoder"]), jax.device_get(base["decoder"])
  )
  state = run.checkpoints(async_save=False).restore(2, None)
  moments = sum(np.size(x) for x in jax.tree_util.tree_leaves(state["opt_state"]) if np.ndim(x) > 0)
  assert moments == 2 * counting.lora_count(cfg)
  export_hf(run.path, tmp_path / "peft", lora_as="peft")
  adapter = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
  assert adapter["modules_to_save"] == ["lm_head", "transformer.wpe", "transformer.wte"]
  saved = load_file(tmp_path / "peft" / "adapter_model.safetensors")
  base_weights = load_file(tmp_path / "peft" / "base_model" / "model.safetensors")
  np.testing.assert_array_equal(
      saved["base_model.model.transformer.wte.weight"], base_weights["transformer.wte.weight"]
  )
  assert base_weights["transformer.wte.weight"].shape == (300, 32)
  np.testing.assert_array_equal(  # the tied head is saved too: PEFT's copy would not follow it
      saved["base_model.model.lm_head.weight"], base_weights["transformer.wte.weight"]
  )
  for fields, said in (
      (dict(lora_rank=2, lora_modules_to_save="embed,lm"), "lora_modules_to_save='embed,lm'"),
      (dict(lora_rank=2, lora_modules_to_save="head"), "tie_embeddings"),
  ):
    with pytest.raises(ValueError, match=said):
      BASE.replace(**fields)
