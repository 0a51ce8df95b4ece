"""Quantized matmuls (model.quantization, modules/quantization.py): int8 and fp8 forward passes
close to float, gradients through every quantized kernel (straight-through), scanned = looped,
the quantized dots counted in a CPU compile, int8-weight and int8-KV-cache greedy decoding of a
float-trained model against float decoding, and bad input refused with one line."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from conftest import load_script, run_python
from transformers_jax import decode
from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, initializer
from transformers_jax.modules import quantization
from transformers_jax.modules.block import scan_to_loop
from transformers_jax.train.compile import dot_counts

TINY = ModelConfig(
    family="decoder",
    num_layers=2,
    d_model=32,
    num_heads=4,
    vocab_size=256,
    max_len=96,
    head="lm",
    scan_layers=True,
)
TOKENS = np.random.default_rng(0).integers(0, 256, (2, 16))


@pytest.fixture(scope="module")
def params():
  return nn.unbox(jax.jit(initializer(TINY))(jax.random.PRNGKey(0)))


def loss_fn(cfg):
  def loss(p, tokens):
    logits = build_model(cfg).apply({"params": p}, tokens[:, :-1])["logits"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  return loss


def test_int8_and_fp8_forward_passes_are_close_to_float(params):
  logits = {}
  for mode in ("", "int8", "fp8", "int8_weights"):
    cfg = dataclasses.replace(TINY, quantization=mode, quantization_head=bool(mode))
    apply = jax.jit(lambda p, cfg=cfg: build_model(cfg).apply({"params": p}, TOKENS)["logits"])
    logits[mode] = np.asarray(apply(params))
  scale = np.abs(logits[""]).max()
  errors = {m: np.abs(logits[m] - logits[""]).max() / scale for m in logits if m}
  # int8 per channel: ~1% of the logits' range; fp8 e4m3 (3 mantissa bits): a few %
  assert 0 < errors["int8"] < 0.03 and 0 < errors["int8_weights"] < 0.03, errors
  assert errors["int8"] < errors["fp8"] < 0.1, errors


def test_gradients_flow_through_every_quantized_kernel_and_track_float(params):
  tokens = jnp.asarray(TOKENS)
  grads = {
      mode: jax.jit(jax.grad(loss_fn(dataclasses.replace(TINY, quantization=mode))))(params, tokens)
      for mode in ("", "int8")
  }
  flat = jax.tree_util.tree_flatten_with_path(grads["int8"])[0]
  reference = dict(jax.tree_util.tree_flatten_with_path(grads[""])[0])
  kernels = [(path, g) for path, g in flat if "kernel" in jax.tree_util.keystr(path)]
  assert len(kernels) == 6  # query, key, value, out, wi, wo (scanned: one each)
  for path, g in flat:
    g, ref = np.asarray(g).ravel(), np.asarray(reference[path]).ravel()
    if np.linalg.norm(ref) < 1e-8:  # the keys' bias: softmax cancels it, its gradient is 0
      continue
    cosine = g @ ref / (np.linalg.norm(g) * np.linalg.norm(ref) + 1e-30)
    assert np.abs(g).max() > 0 and cosine > 0.98, (jax.tree_util.keystr(path), cosine)


tiny = load_script("norm_zoo_grid").tiny_config  # 2 blocks per stack, d_model 8
loss_of = load_script("norm_zoo_grid").loss_of


def every_family_config():
  """The other families (the encoder with LoRA adapters beside its quantized base) and
  DeepSeek's MoE experts (dense dispatch) beside latent attention (MLA), one block per stack
  (the scanned stack is the test below)."""
  from conftest import ROOT
  from transformers_jax.config import load_config_module
  from transformers_jax.models import as_model_config

  deepseek = load_config_module(str(ROOT / "experiments" / "deepseek.py")).get_config("tiny")
  mla_moe = dataclasses.replace(
      as_model_config(deepseek.model),
      moe_impl="dense",
      mtp_depth=0,
      num_layers=1,
      moe_first_dense=0,  # the one block an MoE one
  )
  one = dict(num_layers=1)  # one block per stack: what is quantized does not depend on depth
  return {
      "encoder_lora": tiny("encoder", "pre", lora_rank=2, lora_targets="q,v,out,mlp_in", **one),
      "encoder_decoder": tiny("encoder_decoder", "post", **one),
      "vit": tiny("vit", "pre", **one),
      "decoder_mla_moe": mla_moe,
  }


@pytest.mark.parametrize("name", ["encoder_lora", "encoder_decoder", "vit", "decoder_mla_moe"])
def test_every_family_trains_under_int8_close_to_float(name):
  """One program per model: the loss and gradients in float and under int8 (quantization_head
  too). The losses agree to 3%, every gradient points the float one's way, and under LoRA the
  adapters get gradients through the quantized base (the base frozen by the optimizer, not
  here)."""
  cfg = every_family_config()[name]
  params = nn.unbox(jax.jit(initializer(cfg))(jax.random.PRNGKey(1)))
  int8 = dataclasses.replace(cfg, quantization="int8", quantization_head=True)

  @jax.jit
  def both(p):
    return jax.value_and_grad(loss_of(cfg))(p), jax.value_and_grad(loss_of(int8))(p)

  (loss, grads), (q_loss, q_grads) = both(params)
  assert abs(float(q_loss) - float(loss)) < 0.03 * float(loss), (float(q_loss), float(loss))
  paths = jax.tree_util.tree_flatten_with_path(grads)[0]
  q_leaves = jax.tree_util.tree_leaves(q_grads)
  assert len(paths) == len(q_leaves)
  for (path, g), q in zip(paths, q_leaves):
    g, q = np.asarray(g, np.float64).ravel(), np.asarray(q, np.float64).ravel()
    if np.linalg.norm(g) < 1e-6 * max(1.0, np.sqrt(g.size)):  # (keys' biases: softmax cancels)
      continue
    cosine = g @ q / (np.linalg.norm(g) * np.linalg.norm(q) + 1e-30)
    assert cosine > 0.9, (jax.tree_util.keystr(path), cosine)
  if cfg.lora_rank:  # B starts at zero, so A's gradient does too; B's flows through the base
    adapters = [q for (p, _), q in zip(paths, q_leaves) if "lora_b" in jax.tree_util.keystr(p)]
    assert len(adapters) == 4 and all(np.abs(np.asarray(b)).max() > 0 for b in adapters)


def test_scanned_equals_looped_under_int8(params):
  looped_params = scan_to_loop(params)
  outs = []
  for scan, p in ((True, params), (False, looped_params)):
    cfg = dataclasses.replace(TINY, quantization="int8", scan_layers=scan)
    outs.append(np.asarray(jax.jit(build_model(cfg).apply)({"params": p}, TOKENS)["logits"]))
  np.testing.assert_allclose(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_quantized_dots_are_counted_in_a_cpu_compile(params):
  counts = {}
  for mode in ("", "int8", "fp8"):
    step = jax.jit(jax.grad(loss_fn(dataclasses.replace(TINY, quantization=mode))))
    counts[mode] = dot_counts(step.lower(params, jnp.asarray(TOKENS)).compile().as_text())
  assert counts[""]["dots"] == counts["int8"]["dots"] > 0 and counts[""]["quantized_dots"] == 0
  # the projections' forward and both backward products (attention's and the head's stay float)
  assert 0 < counts["int8"]["quantized_dots"] < counts["int8"]["dots"], counts
  # the CPU widens float8 operands to float32 before its dot: none run in 8 bits there
  assert counts["fp8"]["quantized_dots"] == 0, counts
  text = """
  %p.1 = s8[4,8]{1,0} parameter(0)
  %p.2 = s8[8,2]{1,0} parameter(1)
  %p.3 = bf16[8,2]{1,0} parameter(2)
  %dot.1 = s32[4,2]{1,0} dot(%p.1, %p.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %dot.2 = f32[4,2]{1,0} dot(%p.1, %p.3), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  """
  assert dot_counts(text) == {"dots": 2, "quantized_dots": 1}


def cycle_tokens(n=20_000, noise=0.2, seed=0):
  """A token stream that follows one random cycle through all 256 ids (each id's successor
  fixed), a `noise` fraction of the tokens drawn at random instead: a bigram table to learn."""
  rng = np.random.default_rng(seed)
  order = rng.permutation(256)
  successor = np.empty(256, np.int32)
  successor[order] = np.roll(order, -1)
  tokens = [int(order[0])]
  for draw in rng.random(n - 1) < noise:
    tokens.append(int(rng.integers(256)) if draw else int(successor[tokens[-1]]))
  return np.asarray(tokens, np.int32), successor


def test_int8_decoding_of_a_float_trained_model_agrees_with_float(params):
  """A float model trained 40 steps on `cycle_tokens`, then greedy 64 tokens: int8 weights
  (generate --quantization=int8) and an int8 KV cache each pick the float decoding's token at
  >= 90% of the positions."""
  cfg = dataclasses.replace(TINY, dropout=0.0)
  (data, successor), rng = cycle_tokens(), np.random.default_rng(1)
  opt = optax.adam(3e-3)
  loss = loss_fn(cfg)

  @jax.jit
  def step(p, state, batch):
    grads = jax.grad(loss)(p, batch)
    updates, state = opt.update(grads, state)
    return optax.apply_updates(p, updates), state

  p, state = params, opt.init(params)
  for _ in range(40):
    starts = rng.integers(0, len(data) - 33, 16)
    p, state = step(p, state, jnp.asarray(np.stack([data[s : s + 33] for s in starts])))
  prompts = [list(data[100:116]), list(data[2000:2016])]
  float_ids = np.asarray(decode.generate(cfg, p, prompts, 64).ids())
  agreement = {}
  for name, changes in (
      ("int8_weights", dict(quantization="int8_weights")),
      ("int8_kv_cache", dict(kv_cache_dtype="int8")),
  ):
    ids = np.asarray(decode.generate(dataclasses.replace(cfg, **changes), p, prompts, 64).ids())
    agreement[name] = float(np.mean(ids == float_ids))
  learned = float(np.mean(float_ids[:, 1:] == successor[float_ids[:, :-1]]))
  print(f"greedy agreement with float over 2 x 64 tokens: {agreement}; float follows the cycle "
        f"at {learned:.2f}")  # fmt: skip
  assert float_ids.shape == (2, 64) and len(set(float_ids.ravel())) > 32  # not a loop
  assert min(agreement.values()) >= 0.9, agreement


def test_bad_quantization_settings_are_refused_with_one_line():
  with pytest.raises(ValueError, match=r"model.quantization='int4': one of '', 'int8'"):
    dataclasses.replace(TINY, quantization="int4")
  with pytest.raises(ValueError, match="model.kv_cache_dtype='fp8': '' .* or int8"):
    dataclasses.replace(TINY, kv_cache_dtype="fp8")
  with pytest.raises(ValueError, match="model.quantization_head=True: .* set model.quantization"):
    dataclasses.replace(TINY, quantization_head=True)
  moe = dict(feed_forward="moe", num_experts=2, top_k=1, moe_impl="ragged")
  with pytest.raises(ValueError, match="use moe_impl=dense"):
    dataclasses.replace(TINY, quantization="int8", **moe)

  class Device:  # what the check reads of a jax device

    def __init__(self, platform, device_kind, compute_capability=None):
      self.platform, self.device_kind = platform, device_kind
      self.compute_capability = compute_capability

  fp8 = dataclasses.replace(TINY, quantization="fp8")
  assert quantization.platform_problem(fp8, [Device("cpu", "cpu")]) is None  # CPU runs it
  assert quantization.platform_problem(fp8, [Device("gpu", "NVIDIA H100", "9.0")]) is None
  assert "no float8" in quantization.platform_problem(fp8, [Device("gpu", "A100", "8.0")])
  with pytest.raises(ValueError, match="model.quantization='fp8': TPU v5 lite has no"):
    quantization.platform_check(fp8, [Device("tpu", "TPU v5 lite")])
  out = run_python(
      ["-m", "transformers_jax.train", "--config=experiments/gpt2.py:tiny", "--compile_only",
       "--config.model.quantization=int4"]
  )  # fmt: skip
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and lines[-1].startswith("error: model.quantization='int4'"), lines


def test_a_float_run_resumes_under_int8_and_generate_decodes_it_in_int8(
    experiment, tmp_path, capsys
):
  """Quantization is how a step computes, not which model: a float run resumes under int8 (the
  change recorded in the run's history, the checkpoint's tensors as they were), and
  `generate --quantization=int8 --kv_cache_dtype=int8` prints what the library's int8 decoding
  of the checkpoint gives."""
  from transformers_jax.run_folder.runs import Run, load_run
  from transformers_jax.train.entry import train

  config = experiment("gpt2", "tiny")
  config.update_from_flattened_dict(
      {"steps": 2, "batch_size": 2, "seq_len": 32, "log_every": 1, "eval_every": 100}
      | {"checkpoint_every": 1, "sample.max_new_tokens": 0, "eval_batches": 1}
      | {"device_peak_flops": 1e12, "model.num_layers": 1}
  )
  train(config, tmp_path)
  config.steps, config.model.quantization = 3, "int8"
  train(config, tmp_path)
  assert (
      "decoder model, parametrization sp, int8 matmuls (head in float), " in capsys.readouterr().out
  )
  (entry,) = Run(tmp_path).history()
  assert entry["changes"]["model.quantization"] == ["", "int8"]
  cfg, params, _, step = load_run(tmp_path)
  assert step == 3  # (cfg: config.json's, as the run was made: float matmuls)
  out = run_python(
      ["-m", "transformers_jax.generate", "--workdir", str(tmp_path), "--prompt_ids", "5,6,7",
       "--print_ids", "--temperature", "0", "--max_new_tokens", "12", "--quantization", "int8",
       "--kv_cache_dtype", "int8"]
  )  # fmt: skip
  assert out.returncode == 0, out.stderr[-2000:]
  want = decode.generate(
      quantization.decoding_config(cfg, "int8", "int8"), params, [[5, 6, 7]], 12
  ).ids()[0]
  assert out.stdout.strip() == ",".join(map(str, want))
