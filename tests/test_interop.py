"""Hugging Face interop: golden fixtures (scripts/make_hf_fixtures.py), round trips, clear errors.

Needs neither torch nor transformers: that Hugging Face's library loads our exports is checked
by scripts/make_hf_fixtures.py, the one place that imports them.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from transformers_jax.models import counting
from transformers_jax.config import ModelConfig
from transformers_jax import interop
from transformers_jax.interop import load_hf, save_hf
from transformers_jax.models import build_model, param_shapes
from transformers_jax.models.vit import patchify
from transformers_jax.modules.block import loop_to_scan

from conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "hf"
NAMES = [
    "gpt2",
    "bert",
    "bert_mlm",
    "vit",
    "vit_classifier",
    "llama",
    "mistral",
    "qwen2",
    "mixtral",
    "gemma",
    "gemma2",
    "t5",
    "t5_tied",
    "marian",
    "bart",
    "qwen3",
    "smollm3",
    "gemma3",
    "olmo2",
    "olmo3",
    "phi3",
    "llama_bias",
    "marian_shapes",
    "gpt_oss",
    "qwen3_moe",
    "deepseek_v3",
    "llama4_text",
]
HEADS = {
    "deepseek_v3": "lm",
    "llama4_text": "lm",
    "t5": "lm",
    "t5_tied": "lm",
    "marian": "lm",
    "bart": "lm",
    "gemma": "lm",
    "gemma2": "lm",
    "mixtral": "lm",
    "gpt_oss": "lm",
    "qwen3_moe": "lm",
    "gpt2": "lm",
    "llama": "lm",
    "mistral": "lm",
    "qwen2": "lm",
    "bert": "pooler",
    "bert_mlm": "mlm",
    "vit": "pooler",
    "vit_classifier": "classifier",
    **dict.fromkeys(["qwen3", "smollm3", "gemma3", "olmo2", "olmo3", "phi3"], "lm"),
    **dict.fromkeys(["llama_bias", "marian_shapes"], "lm"),
}
TOL = 1e-4
EXPORTED_AS = {"phi3": "Phi3ForCausalLM"}  # what the default architecture cannot tell


def reference(name):
  with np.load(FIXTURES / name / "reference.npz", allow_pickle=False) as f:
    return dict(f)


_LOADED = {}


def loaded(name):
  """load_hf of a fixture, read once for the module's tests of it (containers copied: a test
  may not change another's)."""
  if name not in _LOADED:
    _LOADED[name] = load_hf(FIXTURES / name)
  fields, params = _LOADED[name]
  return dict(fields), jax.tree_util.tree_map(lambda x: x, params)


_APPLIES = {}  # one jitted apply per model config: tests that apply equal configs share it


def forward(fields, params, ref):
  key = repr(ModelConfig.from_dict(dict(fields)))  # the config, every default filled in
  if key not in _APPLIES:  # one program, not a compilation per operation
    _APPLIES[key] = jax.jit(build_model(fields).apply)
  apply = _APPLIES[key]
  if "images" in ref:
    return apply({"params": params}, ref["images"])
  if "src" in ref:  # encoder-decoder: source, teacher-forced target, source padding
    return apply({"params": params}, ref["src"], ref["tgt"], ref["src_mask"])
  if "token_types" in ref:
    return apply({"params": params}, ref["tokens"], ref["attention_mask"], ref["token_types"])
  return apply({"params": params}, ref["tokens"])


def leaves(tree):
  return {
      jax.tree_util.keystr(k): np.asarray(v)
      for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def copy_fixture(name, tmp_path):
  return shutil.copytree(FIXTURES / name, tmp_path / name)


# ------------------------------------------------------------------ golden outputs and counts
@pytest.mark.parametrize("name", NAMES)
def test_outputs_match_hugging_face(name):
  fields, params = loaded(name)
  assert fields["head"] == HEADS[name]
  ref = reference(name)
  out = forward(fields, params, ref)
  compared = [k for k in ("hidden", "pooled", "logits") if k in ref]
  assert compared
  for key in compared:  # BERT: padded rows included; they match too (padding masks keys only)
    np.testing.assert_allclose(np.asarray(out[key]), ref[key], atol=TOL, rtol=0, err_msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_equals_hugging_face(name):
  fields, params = loaded(name)
  hf_count = int(reference(name)["hf_param_count"])
  state = counting.state_count(fields)  # DeepSeek-V3's routers' bias: state, not parameters
  assert sum(a.size for a in jax.tree_util.tree_leaves(params)) == hf_count + state
  assert counting.count(fields) == hf_count
  assert counting.analytic_count(fields) == hf_count


def test_gpt2_greedy_continuation_matches_generate():
  """8 greedy tokens, each from a full causal forward over a fixed-length buffer (one compile)."""
  fields, params = load_hf(FIXTURES / "gpt2")
  ref = reference("gpt2")
  prompt, want = ref["prompt"], ref["greedy"]
  n = prompt.shape[1]
  model = build_model(fields)
  apply = jax.jit(lambda p, x: model.apply({"params": p}, x)["logits"])
  buffer = np.zeros((1, n + want.shape[1]), np.int32)
  buffer[:, :n] = prompt
  for t in range(n, buffer.shape[1]):
    buffer[:, t] = np.argmax(np.asarray(apply(params, jnp.asarray(buffer)))[:, t - 1], axis=-1)
  np.testing.assert_array_equal(buffer[:, n:], want)


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("name", NAMES)
def test_import_export_import_is_identity(name, tmp_path):
  fields, params = loaded(name)
  architecture = save_hf(tmp_path, fields, params)
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [architecture]
  fields2, params2 = load_hf(tmp_path)
  assert fields2 == fields
  a, b = leaves(params), leaves(params2)
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_export_reproduces_the_hugging_face_tensors(name, tmp_path):
  """save_hf writes the same tensor names, shapes and values as transformers' save_pretrained."""
  original = {}
  for path in sorted((FIXTURES / name).glob("*.safetensors")):
    original.update(load_file(path))
  fields, params = loaded(name)
  # the scanned layout exports the same; Phi-3's fused tensors hold Llama's blocks, so only a
  # run converted from Phi-3 (convert.export_hf) or the asker names the architecture
  save_hf(tmp_path, fields, loop_to_scan(params), EXPORTED_AS.get(name))
  written = load_file(tmp_path / "model.safetensors")
  assert written.keys() == original.keys()
  for key in original:
    assert written[key].dtype == original[key].dtype
    np.testing.assert_array_equal(written[key], original[key], err_msg=key)


def test_vit_patch_kernel_is_the_convolution():
  """Our patch_embed on patchified pixels equals HF's stride-P convolution, written out in numpy."""
  fields, params = load_hf(FIXTURES / "vit")
  conv = load_file(FIXTURES / "vit" / "model.safetensors")
  w = conv["embeddings.patch_embeddings.projection.weight"]  # [D, C, P, P]
  images = reference("vit")["images"]  # [B, H, W, C]
  P = fields["patch_size"]
  B, H, W, C = images.shape
  blocks = images.reshape(B, H // P, P, W // P, P, C)
  want = np.einsum("birjsc,dcrs->bijd", blocks, w).reshape(B, -1, w.shape[0])
  got = np.asarray(patchify(jnp.asarray(images), P)) @ params["patch_embed"]["kernel"]
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_vit_model_without_pooler_loads_with_head_none(tmp_path):
  d = copy_fixture("vit", tmp_path)
  tensors = load_file(d / "model.safetensors")
  save_file(
      {k: v for k, v in tensors.items() if not k.startswith("pooler.")},
      d / "model.safetensors",
      metadata={"format": "pt"},
  )
  fields, params = load_hf(d)
  assert fields["head"] == "none" and "pooler" not in params
  out = forward(fields, params, reference("vit"))
  np.testing.assert_allclose(np.asarray(out["hidden"]), reference("vit")["hidden"], atol=TOL)


def test_untied_gpt2_and_original_checkpoint_names(tmp_path):
  """tie_word_embeddings=false reads lm_head.weight; GPT2Model-style names (no `transformer.`),
  old causal-mask buffers and `gamma`/`beta` norms are accepted."""
  d = copy_fixture("gpt2", tmp_path)
  tensors = load_file(d / "model.safetensors")
  tensors = {k.removeprefix("transformer."): v for k, v in tensors.items()}
  head = np.random.default_rng(0).standard_normal(tensors["wte.weight"].shape).astype(np.float32)
  tensors["lm_head.weight"] = head
  tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
  save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
  config = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
  fields, params = load_hf(d)
  assert fields["tie_embeddings"] is False
  np.testing.assert_array_equal(params["lm_head"]["kernel"], head.T)
  out = forward(fields, params, reference("gpt2"))
  np.testing.assert_allclose(
      np.asarray(out["logits"]), np.asarray(out["hidden"]) @ head.T, atol=1e-4
  )


def test_old_bert_names_and_pretraining_extras(tmp_path):
  """LayerNorm gamma/beta, a position_ids buffer, the NSP head and a pooler beside the MLM head
  (a BertForPreTraining checkpoint read as BertForMaskedLM) are accepted and ignored."""
  d = copy_fixture("bert_mlm", tmp_path)
  tensors = {}
  for path in d.glob("model-*.safetensors"):
    tensors.update(load_file(path))
    path.unlink()
  (d / "model.safetensors.index.json").unlink()
  tensors = {
      k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
          "LayerNorm.bias", "LayerNorm.beta"
      ): v
      for k, v in tensors.items()
  }
  tensors["bert.embeddings.position_ids"] = np.arange(32, dtype=np.int64)[None]
  tensors["cls.seq_relationship.weight"] = np.zeros((2, 32), np.float32)
  tensors["bert.pooler.dense.weight"] = np.zeros((32, 32), np.float32)
  save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
  fields, params = load_hf(d)
  ref = reference("bert_mlm")
  np.testing.assert_allclose(
      np.asarray(forward(fields, params, ref)["logits"]), ref["logits"], atol=TOL
  )


def test_load_as_bfloat16():
  fields, params = load_hf(FIXTURES / "vit", dtype="bfloat16")
  assert fields["param_dtype"] == "bfloat16"
  assert {a.dtype for a in jax.tree_util.tree_leaves(params)} == {np.dtype(jnp.bfloat16)}


# ------------------------------------------------------------------ clear errors
def assert_one_line(error, *words):
  message = str(error.value)
  assert "\n" not in message, message
  for w in words:
    assert w in message, (w, message)


def test_error_unsupported_architecture(tmp_path):
  d = copy_fixture("gpt2", tmp_path)
  config = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(
      json.dumps({**config, "architectures": ["MambaForCausalLM"], "model_type": "mamba"})
  )
  with pytest.raises(interop.UnsupportedArchitecture) as e:
    load_hf(d)
  assert isinstance(e.value, ValueError)
  assert_one_line(e, "MambaForCausalLM", "GPT2LMHeadModel", "BertForMaskedLM", "ViTModel")
  assert "state-space" in str(e.value)  # what it would need, said


def test_error_unsupported_option(tmp_path):
  d = copy_fixture("bert", tmp_path)
  config = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**config, "hidden_act": "mish"}))
  with pytest.raises(interop.UnsupportedArchitecture) as e:
    load_hf(d)
  assert_one_line(e, "hidden_act", "mish")


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
def test_error_missing_file(tmp_path, missing):
  d = copy_fixture("vit", tmp_path)
  (d / missing).unlink()
  with pytest.raises(interop.MissingCheckpointFile) as e:
    load_hf(d)
  assert_one_line(e, missing)


def test_error_missing_shard(tmp_path):
  d = copy_fixture("bert_mlm", tmp_path)
  (d / "model-00003-of-00005.safetensors").unlink()
  with pytest.raises(interop.MissingCheckpointFile) as e:
    load_hf(d)
  assert_one_line(e, "model-00003-of-00005.safetensors")


def test_error_not_a_directory(tmp_path):
  with pytest.raises(interop.MissingCheckpointFile) as e:
    load_hf(tmp_path / "nowhere")
  assert_one_line(e, "nowhere", "config.json")


def test_error_pickle_checkpoint_is_named_and_not_read(tmp_path):
  d = copy_fixture("vit", tmp_path)
  (d / "model.safetensors").rename(d / "pytorch_model.bin")
  with pytest.raises(interop.MissingCheckpointFile) as e:
    load_hf(d)
  assert_one_line(e, "pytorch_model.bin", "safe_serialization=True")


@pytest.mark.parametrize("keep", [0.5, 0.001])
def test_error_truncated_file(tmp_path, keep):
  d = copy_fixture("gpt2", tmp_path)
  data = (d / "model.safetensors").read_bytes()
  (d / "model.safetensors").write_bytes(data[: int(len(data) * keep)])
  with pytest.raises(interop.CorruptCheckpoint) as e:
    load_hf(d)
  assert_one_line(e, "model.safetensors", "truncated or corrupt")


def test_error_corrupt_config(tmp_path):
  d = copy_fixture("gpt2", tmp_path)
  (d / "config.json").write_text('{"model_type": "gpt2",')
  with pytest.raises(interop.CorruptCheckpoint) as e:
    load_hf(d)
  assert_one_line(e, "config.json", "not valid JSON")


def test_error_missing_tensor(tmp_path):
  d = copy_fixture("vit_classifier", tmp_path)
  tensors = load_file(d / "model.safetensors")
  del tensors["vit.encoder.layer.1.output.dense.weight"]
  save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(interop.MissingTensor) as e:
    load_hf(d)
  assert_one_line(e, "vit.encoder.layer.1.output.dense.weight", "missing")


def test_error_shape_mismatch(tmp_path):
  d = copy_fixture("gpt2", tmp_path)
  config = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**config, "n_inner": 64}))
  with pytest.raises(interop.TensorShapeMismatch) as e:
    load_hf(d)
  assert_one_line(e, "h.0.mlp.c_fc.weight", "(32, 128)", "(32, 64)", "n_inner=64")


def test_error_unexpected_tensors(tmp_path):
  """A config.json with fewer layers than the weights leaves tensors over: refused, not dropped."""
  d = copy_fixture("bert", tmp_path)
  config = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
  with pytest.raises(interop.UnexpectedTensor) as e:
    load_hf(d)
  assert_one_line(e, "encoder.layer.1.", "num_hidden_layers=1")


def test_error_export_unsupported_config(tmp_path):
  c = ModelConfig(family="decoder", num_layers=1, d_model=16, num_heads=2, vocab_size=20, max_len=8)
  params = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), param_shapes(c))
  with pytest.raises(interop.UnsupportedConfig) as e:
    save_hf(tmp_path, c.replace(norm="rmsnorm"), params)
  assert_one_line(e, "model.norm='rmsnorm'", "GPT2LMHeadModel")
  with pytest.raises(interop.UnsupportedConfig) as e:
    save_hf(tmp_path, c.replace(family="encoder_decoder"), params)
  assert_one_line(e, "encoder_decoder")
  with pytest.raises(interop.TensorShapeMismatch) as e:
    save_hf(tmp_path, c.replace(vocab_size=21), params)
  assert_one_line(e, "token_embed", "(20, 16)", "(21, 16)")
  with pytest.raises(interop.UnsupportedConfig) as e:
    save_hf(tmp_path, c.replace(num_layers=2), params)
  assert_one_line(e, "layer_1")
  assert not (tmp_path / "model.safetensors").exists()


def test_missing_config_keys_take_the_reference_librarys_defaults(tmp_path):
  # GPT2Config: activation_function defaults to gelu_new (tanh GELU), n_positions to 1024
  c = ModelConfig(
      vocab_size=64, d_model=32, num_heads=2, num_layers=1, max_len=1024, activation="gelu_tanh"
  )
  init = jax.jit(build_model(c).init)  # one program, not a compilation per operation
  params = init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
  save_hf(tmp_path, c, params)
  config = json.loads((tmp_path / "config.json").read_text())
  for key in ("activation_function", "n_positions", "resid_pdrop"):
    del config[key]
  (tmp_path / "config.json").write_text(json.dumps(config))
  fields, _ = load_hf(tmp_path)
  assert (fields["activation"], fields["max_len"], fields["dropout"]) == ("gelu_tanh", 1024, 0.1)


def test_untied_bert_mlm_uses_the_decoders_own_bias(tmp_path):
  fields, params = load_hf(FIXTURES / "bert_mlm")
  fields = {**fields, "tie_embeddings": False}
  c = ModelConfig(**fields)
  shapes = param_shapes(c)
  rng = np.random.default_rng(0)
  params = {
      **params,
      "mlm_decoder": {
          "kernel": rng.normal(size=shapes["mlm_decoder"]["kernel"].shape).astype(np.float32)
      },
      "mlm_bias": rng.normal(size=shapes["mlm_bias"].shape).astype(np.float32),
  }
  save_hf(tmp_path, c, params)
  tensors = load_file(str(tmp_path / "model.safetensors"))
  np.testing.assert_array_equal(tensors["cls.predictions.decoder.bias"], params["mlm_bias"])
  # transformers 5 leaves cls.predictions.bias unused when the decoder is untied
  tensors["cls.predictions.bias"] = np.zeros_like(tensors["cls.predictions.bias"])
  save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  _, back = load_hf(tmp_path)
  np.testing.assert_array_equal(back["mlm_bias"], params["mlm_bias"])


def test_error_shard_outside_the_model_folder(tmp_path):
  model = tmp_path / "model"
  shutil.copytree(FIXTURES / "gpt2", model)
  (model / "model.safetensors").rename(tmp_path / "outside.safetensors")
  (model / "model.safetensors.index.json").write_text(
      json.dumps({"weight_map": {"wte.weight": "../outside.safetensors"}})
  )
  with pytest.raises(interop.CorruptCheckpoint, match="outside the model folder"):
    load_hf(model)


def test_error_non_finite_tensor(tmp_path):
  shutil.copytree(FIXTURES / "gpt2", tmp_path / "m")
  tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
  name = next(n for n in tensors if n.endswith("wte.weight"))
  tensors[name][3, 1] = np.nan
  save_file(tensors, str(tmp_path / "m" / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(interop.CorruptCheckpoint, match="NaN or infinite"):
    load_hf(tmp_path / "m")


# ------------------------------------------------------------------ placed onto a mesh on import
def test_load_hf_places_each_tensor_onto_the_mesh_as_training_shards_it():
  """With a mesh, every parameter comes back as a jax array with its training sharding (the
  logical-axis rules' PartitionSpec), holding the values the numpy import gives."""
  from transformers_jax.machine import parallel
  from transformers_jax.models import param_shardings

  mesh = parallel.make_mesh({"fsdp": 1, "tensor": 1}, jax.devices()[:1])
  fields, placed = load_hf(FIXTURES / "llama", mesh=mesh)
  _, plain = load_hf(FIXTURES / "llama")
  want = param_shardings(ModelConfig(**fields), mesh)
  got, ref, specs = leaves(placed), leaves(plain), jax.tree_util.tree_leaves(placed)
  assert all(isinstance(a, jax.Array) for a in specs)
  flat_want = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(want)[0]}
  for path, array in jax.tree_util.tree_flatten_with_path(placed)[0]:
    assert array.sharding.spec == flat_want[jax.tree_util.keystr(path)].spec, path
  assert any(any(a is not None for a in s.spec) for s in flat_want.values())  # some are split
  assert got.keys() == ref.keys()
  for k in ref:
    np.testing.assert_array_equal(got[k], ref[k], err_msg=k)


def test_convert_places_the_import_on_an_8_device_mesh_and_writes_the_same_parameters(tmp_path):
  """convert --from_hf --mesh=fsdp_tensor on 8 devices: the run's checkpoint holds exactly the
  parameters of a one-device import; a bad --mesh is one line."""
  from conftest import run_python, subprocess_env

  from transformers_jax.run_folder.runs import load_run

  command = ["-m", "transformers_jax.convert", f"--from_hf={FIXTURES / 'gpt2'}"]
  out = run_python(
      [*command, f"--workdir={tmp_path / 'run'}", "--mesh=fsdp_tensor"],
      env=subprocess_env(devices=8),
  )
  assert out.returncode == 0, out.stderr[-2000:]
  _, params, _, _ = load_run(tmp_path / "run")
  _, want = load_hf(FIXTURES / "gpt2")
  got, ref = leaves(params), leaves(want)
  assert got.keys() == ref.keys()
  for k in ref:
    np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
  bad = run_python(
      [*command, f"--workdir={tmp_path / 'bad'}", "--mesh=fsdp=3"], env=subprocess_env(8)
  )
  assert bad.returncode != 0 and "--mesh='fsdp=3'" in bad.stderr, bad.stderr[-2000:]
  assert len(bad.stderr.strip().splitlines()) == 1


def test_the_documented_python_path_applies_every_converted_architecture(tmp_path):
  """docs/interop.md's Python path (convert, load_run, build_model, apply) on one fixture of
  each architecture reproduces transformers' outputs."""
  from transformers_jax.convert import import_hf
  from transformers_jax.run_folder.runs import load_run

  names = ["gpt2", "bert", "vit_classifier", "llama", "mistral", "qwen2", "mixtral", "gemma"]
  names += ["gemma2", "t5", "marian", "bart", "gpt_oss", "qwen3_moe", "deepseek_v3", "llama4_text"]
  for name in names:
    import_hf(FIXTURES / name, tmp_path / name)
    cfg, params, _, step = load_run(tmp_path / name)
    assert step == 0
    ref = reference(name)
    out = forward(cfg.to_dict(), params, ref)
    key = "logits" if "logits" in ref else "hidden"
    np.testing.assert_allclose(np.asarray(out[key]), ref[key], atol=TOL, rtol=0, err_msg=name)


def test_tensors_are_written_one_at_a_time_and_read_back_by_safetensors(tmp_path):
  """write_shards makes each tensor only as it is written; safetensors reads the files (and the
  index of a sharded write) back exactly; a tensor that fails mid-file leaves no file."""
  import ml_dtypes

  from transformers_jax.interop.tensor_files import write_shards

  rng = np.random.default_rng(0)
  want = {
      "a.weight": rng.standard_normal((5, 3)).astype(ml_dtypes.bfloat16),
      "b.bias": rng.standard_normal(7).astype(np.float32),
      "c.weight": rng.standard_normal((2, 2, 3)).astype(np.float16),
  }
  made = []

  def tensor(name):
    made.append(name)
    return want[name]

  spec = lambda n: (want[n].shape, want[n].dtype)  # noqa: E731
  assert write_shards(tmp_path, list(want), spec, tensor, "model.safetensors") == [
      "model.safetensors"
  ]
  assert made == list(want)
  got = load_file(tmp_path / "model.safetensors")
  for k, v in want.items():
    assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
  (tmp_path / "s").mkdir()
  files = write_shards(tmp_path / "s", list(want), spec, tensor, "x", max_bytes=40)
  assert len(files) > 1
  index = json.loads((tmp_path / "s" / "model.safetensors.index.json").read_text())
  for k, v in want.items():
    assert np.array_equal(load_file(tmp_path / "s" / index["weight_map"][k])[k], v), k

  def failing(name):
    if name == "b.bias":
      raise RuntimeError("stopped")
    return want[name]

  (tmp_path / "f").mkdir()
  with pytest.raises(RuntimeError, match="stopped"):
    write_shards(tmp_path / "f", list(want), spec, failing, "model.safetensors")
  assert not any((tmp_path / "f").iterdir())
  wrong = lambda n: want[n].astype(np.float32)  # noqa: E731  (not what the header says)
  with pytest.raises(ValueError, match="a.weight: made"):
    write_shards(tmp_path / "f", list(want), spec, wrong, "model.safetensors")
  assert not any((tmp_path / "f").iterdir())
