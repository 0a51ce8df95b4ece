"""Today's open models as presets (experiments/llama.py, mistral.py, qwen2.py, t5.py, mixtral.py,
qwen3.py, gemma3.py, olmo.py, phi3.py, smollm3.py):
every released checkpoint's exact parameter count, and the pieces that made them expressible
or that their functions need: q/k/v-only biases, unscaled attention scores, the scaled tied
unembedding, the tanh-GeGLU and plain SiLU feed-forwards, and Llama 3.1's RoPE scaling."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, counting
from transformers_jax.modules.positions import rope_frequencies

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEY = jax.random.PRNGKey(0)

# The released checkpoints' counts (sum of the tensors' sizes, a tied table once).
PUBLISHED = {
    ("llama", "2-7b"): 6_738_415_616,
    ("llama", "2-13b"): 13_015_864_320,
    ("llama", "2-70b"): 68_976_648_192,
    ("llama", "3-8b"): 8_030_261_248,
    ("llama", "3-70b"): 70_553_706_496,
    ("llama", "3.1-8b"): 8_030_261_248,
    ("llama", "3.1-70b"): 70_553_706_496,
    ("llama", "3.1-405b"): 405_853_388_800,
    ("llama", "3.2-1b"): 1_235_814_400,
    ("llama", "3.2-3b"): 3_212_749_824,
    ("mistral", "7b"): 7_241_732_096,
    ("mistral", "7b-v0.1"): 7_241_732_096,
    ("mistral", "7b-v0.3"): 7_248_023_552,
    ("mixtral", "8x7b"): 46_702_792_704,
    ("mixtral", "8x22b"): 140_620_634_112,
    ("gpt_oss", "20b"): 20_914_757_184,
    ("gpt_oss", "120b"): 116_829_156_672,
    ("qwen3_moe", "30b-a3b"): 30_532_122_624,
    ("qwen3_moe", "235b-a22b"): 235_093_634_560,
    # transformers' Llama4ForCausalLM (the text model) from the released text configs
    ("llama4", "scout"): 107_769_861_120,
    ("llama4", "maverick"): 400_711_848_960,
    ("gemma", "2b"): 2_506_172_416,
    ("gemma", "7b"): 8_537_680_896,
    ("gemma", "2-2b"): 2_614_341_888,
    ("gemma", "2-9b"): 9_241_705_984,
    ("gemma", "2-27b"): 27_227_128_320,
    ("qwen2", "0.5b"): 494_032_768,
    ("qwen2", "1.5b"): 1_543_714_304,
    ("qwen2", "7b"): 7_615_616_512,
    ("qwen2", "72b"): 72_706_203_648,
    ("qwen2", "2.5-3b"): 3_085_938_688,
    ("qwen2", "2.5-14b"): 14_770_033_664,
    ("qwen2", "2.5-32b"): 32_763_876_352,
    ("t5", "small"): 60_506_624,
    ("t5", "base"): 222_903_552,
    ("t5", "large"): 737_668_096,
    ("t5", "3b"): 2_851_598_336,
    ("t5", "11b"): 11_307_321_344,
    ("t5", "v1_1-small"): 76_961_152,
    ("t5", "v1_1-base"): 247_577_856,
    ("t5", "v1_1-large"): 783_150_080,
    ("t5", "v1_1-xl"): 2_849_757_184,
    ("t5", "v1_1-xxl"): 11_135_332_352,
    ("bert", "roberta-base"): 124_645_632,
    ("bert", "roberta-large"): 355_359_744,
    ("bart", "base"): 139_420_416,
    ("bart", "large"): 406_291_456,
    ("marian", "en-de"): 73_886_208,
    # transformers' own model classes built from the released configs on the meta device
    ("qwen3", "0.6b"): 596_049_920,
    ("qwen3", "1.7b"): 1_720_574_976,
    ("qwen3", "4b"): 4_022_468_096,
    ("qwen3", "8b"): 8_190_735_360,
    ("qwen3", "14b"): 14_768_307_200,
    ("qwen3", "32b"): 32_762_123_264,
    ("gemma3", "1b"): 999_885_952,
    ("gemma3", "4b"): 3_880_263_168,  # the text model alone (so 12b and 27b)
    ("gemma3", "12b"): 11_766_034_176,
    ("gemma3", "27b"): 27_009_346_304,
    ("olmo", "2-7b"): 7_298_617_344,
    ("olmo", "2-13b"): 13_716_198_400,
    ("olmo", "2-32b"): 32_234_279_936,
    ("phi3", "3-mini"): 3_821_079_552,
    ("phi3", "3-medium"): 13_960_238_080,
    ("phi3", "4"): 14_659_507_200,
    ("smollm3", "3b"): 3_075_098_624,
    # transformers' DeepseekV3ForCausalLM on the meta device (its parameters; the routers' 14,848
    # bias values are buffers, state): 671B without the multi-token prediction module, and with
    # it sharing the model's embedding and head (the hub's file holds its own copies of both:
    # 684,489,830,400)
    ("deepseek", "v3"): 671_026_404_352,
    ("deepseek", "v3-mtp"): 682_636_472_320,
}


@pytest.mark.parametrize("file", sorted({file for file, _ in PUBLISHED}))
def test_every_open_model_preset_has_its_published_count(experiment, file):
  """eval_shape's count (nothing allocated) and the analytic formula, for each preset of the
  file that has a published figure; the file's own figure agrees."""
  presets = sorted(p for f, p in PUBLISHED if f == file)
  for preset in presets:
    config = experiment(file, preset)
    want = PUBLISHED[(file, preset)]
    assert config.published.params == want, preset
    assert counting.count(config.model) == want, preset
    assert counting.analytic_count(config.model) == want, preset


# ------------------------------------------------------------------ the pieces
SMALL = dict(num_layers=1, d_model=32, num_heads=4, vocab_size=40, max_len=16)


def init(c, tokens):
  model = build_model(c)
  return model, nn.unbox(jax.jit(model.init)(KEY, tokens)["params"])


def test_qkv_bias_puts_biases_on_query_key_value_only():
  c = ModelConfig(family="decoder", use_bias=False, qkv_bias=True, num_kv_heads=2, **SMALL)
  _, params = init(c, jnp.zeros((1, 8), jnp.int32))
  attention = params["decoder"]["layer_0"]["self_attn"]
  assert {k for k, v in attention.items() if "bias" in v} == {"query", "key", "value"}
  assert "bias" not in params["decoder"]["layer_0"]["ffn"]["wo"]
  assert counting.count(c) == counting.analytic_count(c)
  assert counting.count(c) - counting.count(c.replace(qkv_bias=None)) == 32 + 2 * 2 * 8


def test_unscaled_scores_equal_scaled_ones_with_sqrt_k_in_the_query_weights():
  """T5 folds 1/sqrt(K) into its initialisation: scale_scores=False with W_q equals the default
  (which divides q.k by sqrt(K)) with W_q sqrt(K)."""
  c = ModelConfig(family="decoder", positions="t5", scale_scores=False, **SMALL)
  tokens = jax.random.randint(KEY, (2, 10), 0, 40)
  model, params = init(c, tokens)
  scaled = jax.tree_util.tree_map_with_path(
      lambda p, x: x * 8**0.5 if "query" in jax.tree_util.keystr(p) else x, params
  )
  got = model.apply({"params": params}, tokens)["logits"]
  want = build_model(c.replace(scale_scores=True)).apply({"params": scaled}, tokens)["logits"]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_a_scaled_unembedding_reads_the_hidden_state_over_sqrt_d(tied):
  c = ModelConfig(family="decoder", tie_embeddings=tied, **SMALL)
  tokens = jax.random.randint(KEY, (2, 10), 0, 40)
  model, params = init(c, tokens)
  plain = model.apply({"params": params}, tokens)
  scaled = build_model(c.replace(unembed_scale=True)).apply({"params": params}, tokens)
  np.testing.assert_allclose(scaled["logits"], plain["logits"] / 32**0.5, rtol=1e-5, atol=1e-6)
  # the chunked loss multiplies by the same matrix
  np.testing.assert_allclose(scaled["unembedding"], plain["unembedding"] / 32**0.5, rtol=1e-6)


def test_a_unit_offset_norm_stores_w_and_applies_one_plus_w():
  from transformers_jax.modules.norms import Norm

  c = ModelConfig(norm="rmsnorm", norm_unit_offset=True, d_model=8)
  x = jax.random.normal(KEY, (3, 8))
  params = Norm(c).init(KEY, x)
  assert not np.any(nn.unbox(params)["params"]["scale"])  # w = 0: the identity scale
  w = jnp.linspace(-0.5, 0.5, 8)
  plain = ModelConfig(norm="rmsnorm", d_model=8)
  np.testing.assert_allclose(
      Norm(c).apply({"params": {"scale": w}}, x),
      Norm(plain).apply({"params": {"scale": 1 + w}}, x),
      rtol=1e-6,
  )


@pytest.mark.parametrize("activation,gated", [("geglu_tanh", True), ("silu", False)])
def test_the_new_feed_forwards(activation, gated):
  c = ModelConfig(family="decoder", activation=activation, **SMALL)
  assert c.gated == gated
  assert counting.count(c) == counting.analytic_count(c)
  from transformers_jax.modules.common import activation as act

  x = jnp.linspace(-3, 3, 7)
  want = jax.nn.gelu(x, approximate=True) if gated else jax.nn.silu(x)
  np.testing.assert_allclose(act(activation)(x), want, rtol=1e-6)


def test_llama3_rope_scaling_equals_transformers_frequencies():
  """transformers' own llama3 frequencies (scripts/make_hf_fixtures.py wrote them): the short
  wavelengths kept, the long ones divided by 8, a blend between."""
  want = np.load(ROOT / "tests" / "fixtures" / "hf" / "rope_llama3.npz")["inv_freq"]
  got = rope_frequencies(128, 500000.0, "llama3:8,1,4,8192")
  np.testing.assert_allclose(got, want, rtol=1e-6)
  plain = rope_frequencies(128, 500000.0)
  assert got[0] == plain[0] and np.isclose(got[-1], plain[-1] / 8)
  with pytest.raises(ValueError, match=r"model.rope_scaling='yarn:2'.*llama3:8,1,4,8192"):
    ModelConfig(positions="rope", rope_scaling="yarn:2")


# ------------------------------------------------------------------ Hugging Face decoders
FIXTURES = ROOT / "tests" / "fixtures" / "hf"


DECODERS = ["llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2"]
DECODERS += ["qwen3", "smollm3", "gemma3", "olmo2", "olmo3", "phi3", "llama_bias"]
DECODERS += ["gpt_oss", "qwen3_moe", "deepseek_v3", "llama4_text"]


@pytest.mark.parametrize("name", DECODERS)
def test_imported_decoders_continue_greedily_as_transformers_generate(name):
  """decode.generate (the KV cache) from the imported weights gives transformers' 8 greedy
  tokens; the Llama fixture's "llama3" RoPE scaling has an original context of 8 positions,
  which the 13 positions pass."""
  from transformers_jax import decode
  from transformers_jax.interop import load_hf

  fields, params = load_hf(FIXTURES / name)
  with np.load(FIXTURES / name / "reference.npz") as ref:
    prompt, want = ref["prompt"], ref["greedy"]
  out = decode.generate(ModelConfig(**fields), params, [list(prompt[0])], want.shape[1])
  np.testing.assert_array_equal(np.asarray(out.tokens)[:, : want.shape[1]], want)


def test_llama_config_reads_the_hubs_rope_keys_as_transformers_5_writes_them(tmp_path):
  """The hub's files say rope_theta + rope_scaling {"rope_type": "llama3", ...}; transformers 5
  writes rope_parameters. Both give the same model."""
  import json
  import shutil

  from transformers_jax.interop import load_hf

  d = shutil.copytree(FIXTURES / "llama", tmp_path / "llama")
  config = json.loads((d / "config.json").read_text())
  rope = config.pop("rope_parameters")
  config["rope_theta"] = rope.pop("rope_theta")
  config["rope_scaling"] = dict(rope, type=rope.pop("rope_type"))  # older files say "type"
  (d / "config.json").write_text(json.dumps(config))
  fields, _ = load_hf(d)
  assert fields == load_hf(FIXTURES / "llama")[0]
  assert fields["rope_scaling"] == "llama3:4,1,2,8" and fields["rope_theta"] == 5000.0
  config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
  (d / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="RoPE scaling 'yarn' is not supported"):
    load_hf(d)


def test_a_rope_decoder_exports_as_llama_or_the_class_asked_for(tmp_path):
  from transformers_jax.interop import UnsupportedConfig, load_hf, save_hf

  fields, params = load_hf(FIXTURES / "llama")
  assert save_hf(tmp_path / "a", fields, params) == "LlamaForCausalLM"
  assert save_hf(tmp_path / "b", fields, params, "MistralForCausalLM") == "MistralForCausalLM"
  assert load_hf(tmp_path / "b")[0] == fields
  with pytest.raises(UnsupportedConfig, match="model.positions='rope' as GPT2LMHeadModel"):
    save_hf(tmp_path / "c", fields, params, "GPT2LMHeadModel")
  fields, params = load_hf(FIXTURES / "mistral")  # a sliding window: Mistral's
  assert fields["sliding_window"] == 4
  assert save_hf(tmp_path / "d", fields, params) == "MistralForCausalLM"
  with pytest.raises(UnsupportedConfig, match="model.sliding_window=4 as LlamaForCausalLM"):
    save_hf(tmp_path / "e", fields, params, "LlamaForCausalLM")


@pytest.mark.parametrize(
    "name,start,end",
    [("t5", 0, 1), ("t5_tied", 0, 1), ("marian", 63, 0), ("bart", 2, 2)],
)
def test_imported_encoder_decoders_translate_greedily_as_transformers_generate(name, start, end):
  """decode.translate from config.json's decoder start and end ids: transformers' greedy tokens
  (it was kept from ending before 8; ours may end earlier, at the same place)."""
  from transformers_jax import decode
  from transformers_jax.interop import load_hf

  fields, params = load_hf(FIXTURES / name)
  with np.load(FIXTURES / name / "reference.npz") as ref:
    source, want = ref["source"], ref["greedy"][0]
  out = decode.translate(
      ModelConfig(**fields), params, [list(source[0])], start, end, 8, beam_size=0
  )
  got = np.asarray(out.tokens)[0, : out.lengths[0]]
  assert len(got) >= 4
  np.testing.assert_array_equal(got, want[: len(got)])


def test_marian_ends_a_full_row_with_its_forced_eos_as_transformers_generate(tmp_path):
  """transformers' generate ends a row that reaches max_new_tokens with config.json's
  forced_eos_token_id (MarianConfig's default: 0, its end id): translate's forced_eos_id does
  the same, and a converted run (generate --source_ids) reads it from config.json. The fixture's
  stacks differ (4 encoder heads, 2 in the decoder; feed-forward 48 and 40 wide)."""
  import json
  import shutil

  from transformers_jax import decode
  from transformers_jax.interop import load_hf
  from transformers_jax.run_folder.runs import Run

  fields, params = load_hf(FIXTURES / "marian_shapes")
  assert (fields["decoder_num_heads"], fields["decoder_d_ff"]) == (2, 40)
  config = json.loads((FIXTURES / "marian_shapes" / "config.json").read_text())
  with np.load(FIXTURES / "marian_shapes" / "reference.npz") as ref:
    source, want = ref["source"], ref["greedy"][0]
  assert len(want) == 8 and want[-1] == config["forced_eos_token_id"] == 0
  start, end = config["decoder_start_token_id"], config["eos_token_id"]
  out = decode.translate(
      ModelConfig(**fields), params, [list(source[0])], start, end, 8, beam_size=0, forced_eos_id=0
  )
  np.testing.assert_array_equal(out.tokens[0], want)
  assert out.lengths[0] == 7 and out.stopped[0]
  (tmp_path / "run").mkdir()
  shutil.copy(FIXTURES / "marian_shapes" / "config.json", tmp_path / "run" / "hf_config.json")
  assert Run(tmp_path / "run").hf_forced_eos_id() == 0


def test_t5_reads_an_untied_head_from_the_tensors_and_the_start_ids_from_config(tmp_path):
  """The hub's T5 v1.1 files say tie_word_embeddings: false and hold lm_head.weight; transformers
  5 writes tie_word_embeddings: true with scale_decoder_outputs and no head. A converted run
  keeps config.json's decoder start and end ids, which generate --source_ids translates from."""
  import json
  import shutil

  from safetensors.numpy import load_file, save_file

  from transformers_jax.convert import import_hf
  from transformers_jax.interop import load_hf
  from transformers_jax.run_folder.runs import Run

  fields, _ = load_hf(FIXTURES / "t5")
  assert fields["tie_embeddings"] and not fields["unembed_scale"]
  d = shutil.copytree(FIXTURES / "t5", tmp_path / "hub")
  tensors = load_file(d / "model.safetensors")
  tensors["lm_head.weight"] = tensors["shared.weight"][:, ::-1].copy()
  save_file(tensors, str(d / "model.safetensors"))
  config = json.loads((d / "config.json").read_text())
  config.pop("scale_decoder_outputs")
  (d / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=False)))
  fields, params = load_hf(d)
  assert not fields["tie_embeddings"] and not fields["unembed_scale"]
  np.testing.assert_array_equal(params["lm_head"]["kernel"], tensors["lm_head.weight"].T)
  import_hf(FIXTURES / "t5", tmp_path / "run")
  assert Run(tmp_path / "run").hf_start_and_end_ids() == (0, 1)


def test_export_writes_shards_with_an_index_that_import_reads_back(tmp_path):
  """Tensors converted and written one shard at a time (at most shard_bytes each), with
  model.safetensors.index.json; reading them back (one tensor at a time) gives the same
  parameters, and the shards hold the original tensors bit for bit."""
  import json

  from safetensors.numpy import load_file

  from transformers_jax.interop import load_hf, save_hf

  fields, params = load_hf(FIXTURES / "qwen2")
  save_hf(tmp_path, fields, params, shard_bytes=40_000)
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  files = sorted(set(index["weight_map"].values()))
  assert len(files) >= 3 and not (tmp_path / "model.safetensors").exists()
  written = {}
  for file in files:
    shard = load_file(tmp_path / file)
    assert sum(a.nbytes for a in shard.values()) <= 40_000 or len(shard) == 1
    written.update(shard)
  original = load_file(FIXTURES / "qwen2" / "model.safetensors")
  assert written.keys() == original.keys() == index["weight_map"].keys()
  for name, array in original.items():
    np.testing.assert_array_equal(written[name], array, err_msg=name)
  again, params2 = load_hf(tmp_path)
  assert again == fields
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params2)):
    np.testing.assert_array_equal(a, b)
  save_hf(tmp_path, fields, params)  # one file again: the old shards and index are gone
  assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model.safetensors"]
  assert not (tmp_path / "model.safetensors.index.json").exists()


def test_a_converted_run_carries_the_tokenizer_settings_back_out(tmp_path):
  """The files beside the weights (tokenizer_config.json with its chat template, the
  generation defaults) ride along: kept by --from_hf, written back by --to_hf."""
  import json
  import shutil

  from transformers_jax.convert import export_hf, import_hf

  source = shutil.copytree(FIXTURES / "llama", tmp_path / "llama")
  settings = {"chat_template": "{{ messages }}", "model_max_length": 64}
  (source / "tokenizer_config.json").write_text(json.dumps(settings))
  import_hf(source, tmp_path / "run")
  export_hf(tmp_path / "run", tmp_path / "out")
  for name in ("tokenizer_config.json", "generation_config.json"):
    assert (tmp_path / "out" / name).read_bytes() == (source / name).read_bytes(), name


def test_vit_22b_has_its_bias_pattern_and_one_norm_per_parallel_block(experiment):
  """The 22b preset's shapes at 2 blocks: no q/k/v biases, the MLP's and output's kept, a scale
  (no shift) in each norm, one input norm per block shared by attention and MLP, q/k norms."""
  from transformers_jax.models import param_shapes

  c = ModelConfig.from_dict(experiment("vit", "22b").model).replace(num_layers=2, scan_layers=False)
  block = param_shapes(c)["encoder"]["layer_0"]
  attention = block["self_attn"]
  assert [k for k in ("query", "key", "value", "out") if "bias" in attention[k]] == ["out"]
  assert set(attention["query_norm"]) == set(attention["key_norm"]) == {"scale"}
  assert {"bias"} <= set(block["ffn"]["wi"]) and {"bias"} <= set(block["ffn"]["wo"])
  assert [k for k in block if "norm" in k] == ["input_norm"]
  assert set(block["input_norm"]) == {"scale"}


@pytest.mark.parametrize(
    "name,changes,said",
    [
        ("phi3", {"rope_parameters.partial_rotary_factor": 0.75}, "partial_rotary_factor=0.75"),
        ("phi3", {"rope_parameters.rope_type": "longrope"}, "RoPE scaling 'longrope'"),
        ("olmo3", {"rope_parameters.full_attention.rope_type": "yarn"}, "RoPE scaling 'yarn'"),
        ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
        (
            "gemma3",
            {"rope_parameters.sliding_attention": dict(rope_type="linear", factor=2.0)},
            "the sliding layers' RoPE scaling 'linear'",
        ),
        ("qwen3", {"layer_types": ["full_attention"]}, "layer_types lists 1 layers"),
        ("smollm3", {"layer_types": ["chunked_attention"] * 4}, "without RoPE"),
        ("olmo3", {"layer_types": ["local_attention"] * 4}, "'local_attention'"),
    ],
)
def test_what_the_blocks_cannot_hold_is_one_line_naming_the_config_key(
    name, changes, said, tmp_path
):
  import json

  from transformers_jax.interop import UnsupportedArchitecture, load_hf

  config = json.loads((FIXTURES / name / "config.json").read_text())
  for dotted, value in changes.items():
    *path, key = dotted.split(".")
    node = config
    for part in path:
      node = node[part]
    node[key] = value
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(UnsupportedArchitecture, match=said) as refused:
    load_hf(tmp_path)
  assert "\n" not in str(refused.value)


def test_an_export_the_architecture_cannot_hold_is_refused_naming_the_field(tmp_path):
  """Gemma 3 in transformers has no attention soft-capping; Qwen3 has no NoPE layers; Phi-3 is
  written only when asked for (its tensors hold Llama's blocks)."""
  from transformers_jax.interop import UnsupportedConfig, load_hf, save_hf

  fields, params = load_hf(FIXTURES / "gemma3")
  with pytest.raises(UnsupportedConfig, match="model.attention_softcap=5.0 as Gemma3ForCausalLM"):
    save_hf(tmp_path / "a", dict(fields, attention_softcap=5.0), params)
  fields, params = load_hf(FIXTURES / "smollm3")
  with pytest.raises(UnsupportedConfig, match="layer_types='full,nope' as Qwen3ForCausalLM"):
    save_hf(tmp_path / "b", dict(fields, qk_norm=True, ffn_bias=False), params, "Qwen3ForCausalLM")
  fields, params = load_hf(FIXTURES / "phi3")
  assert save_hf(tmp_path / "c", fields, params) == "MistralForCausalLM"
  assert save_hf(tmp_path / "d", fields, params, "Phi3ForCausalLM") == "Phi3ForCausalLM"
