"""Build the golden Hugging Face fixtures in tests/fixtures/hf/ (the only file importing torch).

Each fixture is a small randomly initialised `transformers` model saved with `save_pretrained`
(safetensors) plus `reference.npz`: fixed inputs, the model's outputs on them and its parameter
count. tests/test_interop.py loads the checkpoints with `transformers_jax.interop` (no torch) and
holds our outputs to these references.

    pip install torch==2.13.0 transformers
    python scripts/make_hf_fixtures.py            # writes the fixtures, then checks save_hf

Every parameter is perturbed after initialisation so biases and norm parameters are not the
zeros and ones HF initialises them to (a mapping that mixed them up would otherwise pass).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile

import numpy as np
from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

try:  # the `hf` extra; without it the script says so in one line
  import torch
  import transformers
except ImportError:
  torch = transformers = None

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "hf"
SEED = 0

GPT2 = dict(
    vocab_size=128,
    n_positions=32,
    n_embd=32,
    n_layer=2,
    n_head=4,
    bos_token_id=None,
    eos_token_id=None,
    initializer_range=0.1,
)
BERT = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
    type_vocab_size=2,
    initializer_range=0.1,
)
VIT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    image_size=12,
    patch_size=4,
    num_channels=3,
    initializer_range=0.1,
)
VIT_LABELS = 5
# Decoders of today's open models: grouped-query attention, and settings the presets never use
# (Llama: "llama3" RoPE scaling whose original context, 8, the fixture's positions pass; Qwen2:
# tied embeddings with q/k/v biases; Mistral: an explicit head width, and a sliding window of 4
# positions, shorter than the 5-token prompt and the 10-token input).
LLAMA = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=56,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    rope_parameters=dict(
        rope_type="llama3",
        rope_theta=5000.0,
        factor=4.0,
        low_freq_factor=1.0,
        high_freq_factor=2.0,
        original_max_position_embeddings=8,
    ),
    bos_token_id=None,
    eos_token_id=None,
)
MISTRAL = dict(
    vocab_size=80,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=64,
    sliding_window=4,
    initializer_range=0.1,
    rope_parameters=dict(rope_type="default", rope_theta=100000.0),
    bos_token_id=None,
    eos_token_id=None,
)
QWEN2 = dict(
    vocab_size=72,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=True,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
)
GEMMA = dict(  # multi-query attention with 16-wide heads (d_model 32 / 4 heads would be 8)
    vocab_size=88,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=64,
    hidden_activation="gelu_pytorch_tanh",
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
MIXTRAL = dict(  # 4 experts, 2 routed per token
    vocab_size=64,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=64,
    sliding_window=None,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
)
# Gemma 2: norms around each sublayer, soft-capping (attention 5, logits 20: tight enough to act
# on this model's scores) and a sliding window of 3 on layers 0 and 2 of 3, shorter than the
# prompt
GEMMA2 = dict(
    GEMMA,
    num_hidden_layers=3,
    num_key_value_heads=2,
    query_pre_attn_scalar=24,  # not head_dim (16): scores over sqrt(24), as 27B does
    sliding_window=3,
    attn_logit_softcapping=5.0,
    final_logit_softcapping=20.0,
)
# The dense open models of issue 45, with values their releases never use: odd vocabularies,
# other GQA ratios and RoPE bases, windows (3 and 4) shorter than the 10-token input and the
# 5 + 8 generated positions. Qwen3: q/k biases and norms, 12-wide heads, sliding layers from
# max_window_layers on; SmolLM3: NoPE on every second layer, MQA, biases on the MLP only;
# Gemma 3: sliding and full layers over a period of 3 (which 4 layers do not fill), RoPE bases
# 500 (sliding) and 50,000 with linear scaling (full); OLMo 2: reordered norms, q/k norms over
# the whole projection with GQA; OLMo 3: every fourth layer full, RoPE bases per layer type,
# attention biases; Phi-3: fused projections and a sliding window on every layer. Llama with
# attention and MLP biases, which transformers' LlamaConfig allows.
OPEN = dict(initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=None)
QWEN3 = dict(
    OPEN,
    vocab_size=101,
    hidden_size=48,
    intermediate_size=72,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=12,
    max_position_embeddings=64,
    rope_parameters=dict(rope_type="default", rope_theta=2000.0),
    use_sliding_window=True,
    sliding_window=3,
    max_window_layers=1,
    attention_bias=True,
)
SMOLLM3 = dict(
    OPEN,
    vocab_size=113,
    hidden_size=32,
    intermediate_size=56,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    max_position_embeddings=64,
    rope_parameters=dict(rope_type="default", rope_theta=30000.0),
    no_rope_layer_interval=2,
    mlp_bias=True,
)
GEMMA3 = dict(
    OPEN,
    vocab_size=131,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    query_pre_attn_scalar=20,
    sliding_window=3,
    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={
        "full_attention": dict(rope_type="linear", factor=4.0, rope_theta=50000.0),
        "sliding_attention": dict(rope_type="default", rope_theta=500.0),
    },
)
OLMO2 = dict(
    OPEN,
    vocab_size=97,
    hidden_size=32,
    intermediate_size=56,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    rope_parameters=dict(rope_type="default", rope_theta=7000.0),
)
OLMO3 = dict(
    OPEN,
    vocab_size=89,
    hidden_size=48,
    intermediate_size=40,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=3,
    max_position_embeddings=64,
    sliding_window=3,
    attention_bias=True,
    rope_parameters={
        "full_attention": dict(rope_type="default", rope_theta=40000.0),
        "sliding_attention": dict(rope_type="default", rope_theta=800.0),
    },
)
PHI3 = dict(
    OPEN,
    vocab_size=123,
    hidden_size=48,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=64,
    original_max_position_embeddings=64,
    sliding_window=4,
    rope_parameters=dict(rope_type="default", rope_theta=3000.0, partial_rotary_factor=1.0),
)
LLAMA_BIAS = dict(LLAMA, vocab_size=83, attention_bias=True, mlp_bias=True, rope_parameters=None)
OPEN_MODELS = {  # fixture: (config class, model class, config)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", QWEN3),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", SMOLLM3),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA3),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", OLMO2),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", OLMO3),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", PHI3),
    "llama_bias": ("LlamaConfig", "LlamaForCausalLM", LLAMA_BIAS),
}
# gpt-oss: 3 blocks, a window of 3 on blocks 0 and 2 (shorter than the prompt), 6 query heads of
# 12 over 2 key/value heads (heads x width != d_model), 5 experts of width 32, 3 routed, YaRN
# over an original context of 16 (the 13 positions decoded stay inside it; the logits' 10 too),
# a clamped SwiGLU whose alpha and limit (0.6: it clips these activations) are not the release's.
# Its expert matrices hold values MXFP4 stores exactly, so that gpt_oss_mxfp4 (the same tensors
# packed as the released files pack them) is the same model.
GPT_OSS = dict(
    vocab_size=83,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=12,
    num_local_experts=5,
    num_experts_per_tok=3,
    sliding_window=3,
    max_position_embeddings=64,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=5000.0,
        factor=4.0,
        beta_fast=8.0,
        beta_slow=2.0,
        truncate=False,
        original_max_position_embeddings=16,
    ),
    swiglu_alpha=1.5,
    swiglu_limit=0.6,
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# Qwen3-MoE: q/k norms over 16-wide heads (4 query heads, 1 key/value head over d_model 48), 6
# experts of width 28, 2 routed with the softmax's own weights (norm_topk_prob false, unlike the
# released models), an odd vocabulary and another RoPE base
QWEN3_MOE = dict(
    vocab_size=77,
    hidden_size=48,
    intermediate_size=40,
    moe_intermediate_size=28,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    num_experts=6,
    num_experts_per_tok=2,
    norm_topk_prob=False,
    max_position_embeddings=64,
    rope_parameters=dict(rope_type="default", rope_theta=20000.0),
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
)
# DeepSeek-V3: multi-head latent attention with a query latent, values narrower than the keys,
# YaRN (factor 4 over an original 16 positions, mscale 0.8 over mscale_all_dim 0.6: both
# corrections act), 8 routed experts in 4 groups of which 2 are chosen from, 3 per token, 2 shared
# experts, the first block dense, unnormalised weights times 1.7, and the routers' bias drawn
# (transformers initialises it to zeros, which would leave the bias unread)
DEEPSEEK_V3 = dict(
    vocab_size=80,
    hidden_size=32,
    intermediate_size=56,
    moe_intermediate_size=12,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=2,
    n_routed_experts=8,
    routed_scaling_factor=1.7,
    kv_lora_rank=16,
    q_lora_rank=20,
    qk_rope_head_dim=8,
    v_head_dim=10,
    qk_nope_head_dim=12,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=3,
    first_k_dense_replace=1,
    norm_topk_prob=False,
    rms_norm_eps=1e-5,
    max_position_embeddings=64,
    initializer_range=0.1,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=5000.0,
        factor=4.0,
        original_max_position_embeddings=16,
        beta_fast=16.0,
        beta_slow=2.0,
        mscale=0.8,
        mscale_all_dim=0.6,
    ),
    bos_token_id=None,
    eos_token_id=None,
)
# Llama 4 (text): 4 blocks, RoPE on blocks 0, 1 and 3 in chunks of 4 (shorter than the 10 test
# tokens and the 13 positions of greedy decoding), NoPE on block 2 (an interval of 3) with the
# temperature from a floor of 3 positions at strength 0.3, the L2 q/k norm on the RoPE blocks, 6
# query heads of 12 over 2 key/value heads (d_model 32), Llama 3.1's RoPE scaling over an
# original 8 positions at another base, experts in every second block (5, 2 chosen per token,
# width 24) beside a shared one, the dense blocks 40 wide, an odd vocabulary
LLAMA4 = dict(
    vocab_size=83,
    hidden_size=32,
    intermediate_size=24,
    intermediate_size_mlp=40,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=12,
    num_local_experts=5,
    num_experts_per_tok=2,
    interleave_moe_layer_step=2,
    no_rope_layer_interval=3,
    attention_chunk_size=4,
    use_qk_norm=True,
    attn_temperature_tuning=True,
    floor_scale=3,
    attn_scale=0.3,
    max_position_embeddings=64,
    rope_parameters=dict(
        rope_type="llama3",
        rope_theta=7000.0,
        factor=4.0,
        low_freq_factor=1.0,
        high_freq_factor=2.0,
        original_max_position_embeddings=8,
    ),
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
DECODERS = {
    **{name: config for name, (_, _, config) in OPEN_MODELS.items()},
    "llama4_text": LLAMA4,
    "deepseek_v3": DEEPSEEK_V3,
    "gpt2": GPT2,
    "gpt_oss": GPT_OSS,
    "qwen3_moe": QWEN3_MOE,
    "gemma2": GEMMA2,
    "llama": LLAMA,
    "mistral": MISTRAL,
    "mixtral": MIXTRAL,
    "qwen2": QWEN2,
    "gemma": GEMMA,
}
# T5 v1.1-style (gated-gelu, untied, heads x d_kv != d_model, fewer decoder layers, 8 buckets up
# to distance 12, so the 9-token source reaches the logarithmic buckets) and v1.0-style (ReLU,
# tied: the decoder output scaled by d_model^-1/2)
T5 = dict(
    vocab_size=64,
    d_model=32,
    d_kv=12,
    d_ff=40,
    num_layers=2,
    num_decoder_layers=1,
    num_heads=3,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=12,
    feed_forward_proj="gated-gelu",
    tie_word_embeddings=False,
    initializer_factor=1.0,
    decoder_start_token_id=0,
    pad_token_id=0,
    eos_token_id=1,
)
# Marian: swish feed-forward, embeddings scaled by sqrt(d_model), 2 encoder layers over 1 decoder
# layer
MARIAN = dict(
    vocab_size=64,
    d_model=32,
    encoder_layers=2,
    decoder_layers=1,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=48,
    decoder_ffn_dim=48,
    max_position_embeddings=64,
    activation_function="swish",
    scale_embedding=True,
    init_std=0.1,
    pad_token_id=63,  # Marian's conventions: the last id pads and starts, 0 ends
    decoder_start_token_id=63,
    eos_token_id=0,
)
# BART: exact GELU, each stack its own offset position table and embedding LayerNorm, 1 encoder
# layer over 2 decoder layers
BART = dict(
    vocab_size=64,
    d_model=32,
    encoder_layers=1,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=40,
    decoder_ffn_dim=40,
    max_position_embeddings=24,
    init_std=0.1,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_eos_token_id=None,
)
T5_TIED = dict(T5, feed_forward_proj="relu", tie_word_embeddings=True, num_decoder_layers=2)
# Marian whose stacks differ (4 encoder heads over 2 in the decoder, FFN 48 over 40), generated
# as transformers' generate does by default: its forced_eos_token_id (0) ends a row that
# reaches max_new_tokens
MARIAN_SHAPES = dict(MARIAN, decoder_attention_heads=2, decoder_ffn_dim=40, decoder_layers=2)


FLAGS = cli.ScriptFlags(__doc__)
flags.DEFINE_list(
    "names",
    [],
    "Write only these fixtures (e.g. --names=bart,marian); default: all of them.",
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "tokenizers_only",
    False,
    "Write only the decoder fixtures' tokenizer and chat template files into their folders.",
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "check",
    True,
    "Check that transformers loads what save_hf writes (--nocheck skips the round trip).",
    flag_values=FLAGS,
)


def perturb(model, seed: int, scale: float = 0.05) -> None:
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      if p.requires_grad:  # not the fixed tables (Marian's sinusoids), which files do not hold
        p.add_(scale * torch.randn(p.shape, generator=g))


def mxfp4_encode(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Expert matrices w [E, in, out] (in a multiple of 32) in MXFP4 as gpt-oss's files hold them:
  blocks [E, out, in / 32, 16] uint8 (two E2M1 codes a byte, the low nibble first), scales
  [E, out, in / 32] uint8 (a power of two per 32 inputs, biased by 127); each value rounded to
  the nearest code under its block's scale, the smallest power of two that takes its largest."""
  from transformers_jax.interop.mxfp4 import E2M1

  x = np.swapaxes(w, 1, 2)
  x = x.reshape(*x.shape[:2], -1, 32)
  top = np.abs(x).max(-1)
  exponent = np.ceil(np.log2(np.maximum(top, 1e-30) / 6)).astype(np.int32)
  codes = np.abs((x / np.ldexp(1.0, exponent)[..., None])[..., None] - E2M1).argmin(-1)
  codes = codes.astype(np.uint8)
  return codes[..., 0::2] | (codes[..., 1::2] << 4), (exponent + 127).astype(np.uint8)


def snap_to_mxfp4(model) -> None:
  """gpt-oss's expert matrices replaced by the values their MXFP4 encoding decodes to."""
  from transformers_jax.interop.mxfp4 import expert_matrices

  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        p.copy_(torch.from_numpy(expert_matrices(*mxfp4_encode(p.numpy()))))


def write_mxfp4(directory: pathlib.Path) -> pathlib.Path:
  """gpt_oss_mxfp4: the gpt_oss fixture with its experts packed in MXFP4 and config.json's
  quantization_config as the released files say it (the same reference outputs)."""
  from safetensors.numpy import load_file, save_file

  packed = OUT / "gpt_oss_mxfp4"
  shutil.rmtree(packed, ignore_errors=True)
  packed.mkdir()
  tensors = {}
  for name, array in load_file(directory / "model.safetensors").items():
    if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
      tensors[name + "_blocks"], tensors[name + "_scales"] = mxfp4_encode(array)
    else:
      tensors[name] = array
  save_file(tensors, str(packed / "model.safetensors"), metadata={"format": "pt"})
  config = json.loads((directory / "config.json").read_text())
  keep = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
  config["quantization_config"] = dict(quant_method="mxfp4", modules_to_not_convert=keep)
  (packed / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
  shutil.copy(directory / "reference.npz", packed / "reference.npz")
  print("gpt_oss_mxfp4   the same, its experts in MXFP4")
  return packed


def check_mxfp4(packed: pathlib.Path) -> None:
  """transformers reads gpt_oss_mxfp4 (dequantizing the experts) to the reference logits, and
  interop/mxfp4.py decodes any bytes as transformers does."""
  from transformers.integrations.mxfp4 import convert_moe_packed_tensors

  from transformers_jax.interop.mxfp4 import expert_matrices

  rng = np.random.default_rng(SEED)
  blocks = rng.integers(0, 256, (3, 5, 4, 16), dtype=np.uint8)
  scales = rng.integers(100, 150, (3, 5, 4), dtype=np.uint8)
  theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales))
  ours = expert_matrices(blocks, scales)
  assert np.array_equal(ours, theirs.float().numpy()), "MXFP4 decodes unlike transformers"
  model = transformers.GptOssForCausalLM.from_pretrained(packed).eval()
  ref = np.load(packed / "reference.npz")
  with torch.no_grad():
    logits = model(torch.from_numpy(ref["tokens"].astype(np.int64))).logits.float().numpy()
  assert np.max(np.abs(logits - ref["logits"])) < 1e-5, "transformers reads gpt_oss_mxfp4 otherwise"
  print("gpt_oss_mxfp4   transformers reads it to the reference; MXFP4 decodes as transformers'")


def build(name: str):
  torch.manual_seed(SEED)
  if name == "gpt2":
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
  elif name in ("bert", "bert_mlm"):
    config = transformers.BertConfig(**BERT)
    cls = transformers.BertModel if name == "bert" else transformers.BertForMaskedLM
    model = cls(config)
  elif name == "llama":
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
  elif name == "mistral":
    model = transformers.MistralForCausalLM(transformers.MistralConfig(**MISTRAL))
  elif name == "mixtral":
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**MIXTRAL))
  elif name == "gemma":
    model = transformers.GemmaForCausalLM(transformers.GemmaConfig(**GEMMA))
  elif name == "gpt_oss":
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**GPT_OSS))
  elif name == "qwen3_moe":
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**QWEN3_MOE))
  elif name == "gemma2":
    model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**GEMMA2))
  elif name == "qwen2":
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**QWEN2))
  elif name in OPEN_MODELS:
    config_class, model_class, config = OPEN_MODELS[name]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
  elif name == "llama4_text":
    model = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**LLAMA4))
  elif name == "deepseek_v3":
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**DEEPSEEK_V3))
    g = torch.Generator().manual_seed(SEED + 5)
    for buffer_name, buffer in model.named_buffers():
      if buffer_name.endswith("e_score_correction_bias"):  # state: perturb() leaves it
        buffer.copy_(0.1 * torch.randn(buffer.shape, generator=g))
  elif name in ("t5", "t5_tied"):
    config = transformers.T5Config(**(T5 if name == "t5" else T5_TIED))
    model = transformers.T5ForConditionalGeneration(config)
  elif name in ("marian", "marian_shapes"):
    config = MARIAN if name == "marian" else MARIAN_SHAPES
    model = transformers.MarianMTModel(transformers.MarianConfig(**config))
  elif name == "bart":
    model = transformers.BartForConditionalGeneration(transformers.BartConfig(**BART))
  elif name in ("vit", "vit_classifier"):
    config = transformers.ViTConfig(**VIT)
    if name == "vit":
      model = transformers.ViTModel(config)
    else:
      config.id2label = {i: f"class_{i}" for i in range(VIT_LABELS)}
      config.label2id = {v: k for k, v in config.id2label.items()}
      model = transformers.ViTForImageClassification(config)
  else:
    raise ValueError(name)
  # a random T5, Gemma, Marian or BART this small keeps repeating one token unless shaken
  # harder (the encoder-decoders: and with another draw, whose greedy tokens vary)
  shake = 1.0 if name.startswith("t5") else 0.4 if name.startswith(("gemma", "qwen3")) else 0.05
  shake = 0.4 if name in ("olmo2", "olmo3", "smollm3") else shake
  shake = 0.2 if name == "gpt_oss" else shake
  shake = 0.3 if name in ("deepseek_v3", "llama4_text") else shake
  shake, draw = {"marian": (0.3, 2), "bart": (0.3, 2), "t5_tied": (0.4, 3)}.get(name, (shake, 1))
  shake, draw = {"marian_shapes": (0.3, 2)}.get(name, (shake, draw))
  perturb(model, SEED + draw, shake)
  if name == "gpt_oss":
    snap_to_mxfp4(model)
  return model.eval()


def inputs(name: str) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(SEED)
  if name in DECODERS:  # 10 and 5 + 8 tokens: Llama's positions pass its original context
    vocab = DECODERS[name]["vocab_size"]
    return {
        "tokens": rng.integers(0, vocab, (2, 10)).astype(np.int32),
        "prompt": rng.integers(0, vocab, (1, 5)).astype(np.int32),
    }
  if name.startswith("t5") or name in ("marian", "bart", "marian_shapes"):
    src = rng.integers(2, T5["vocab_size"], (2, 9)).astype(np.int32)
    src_mask = np.ones((2, 9), np.int32)
    src_mask[1, 6:] = 0  # the second source is padded after 6 tokens
    src[1, 6:] = 0
    tgt = rng.integers(2, T5["vocab_size"], (2, 7)).astype(np.int32)
    tgt[:, 0] = 0  # decoder_start_token_id
    return {"src": src, "src_mask": src_mask, "tgt": tgt, "source": src[:1, :6]}
  if name.startswith("bert"):
    tokens = rng.integers(1, BERT["vocab_size"], (2, 10)).astype(np.int32)
    mask = np.ones((2, 10), np.int32)
    mask[1, 6:] = 0  # the second row is padded after 6 tokens
    tokens[1, 6:] = 0
    types = np.zeros((2, 10), np.int32)
    types[0, 5:] = 1
    types[1, 3:6] = 1
    return {"tokens": tokens, "attention_mask": mask, "token_types": types}
  size, channels = VIT["image_size"], VIT["num_channels"]
  return {"images": rng.standard_normal((2, size, size, channels)).astype(np.float32)}  # NHWC


def run(name: str, model, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  t = {k: torch.from_numpy(v.astype(np.int64) if v.dtype == np.int32 else v) for k, v in x.items()}
  out = {}
  with torch.no_grad():
    if name in DECODERS:
      out["logits"] = model(t["tokens"]).logits
      generated = model.generate(
          t["prompt"],
          max_new_tokens=8,
          do_sample=False,
          attention_mask=torch.ones_like(t["prompt"]),
          pad_token_id=0,
      )
      out["greedy"] = generated[:, x["prompt"].shape[1] :]
    elif name == "marian_shapes":  # generate as its config says (forced_eos_token_id)
      o = model(input_ids=t["src"], attention_mask=t["src_mask"], decoder_input_ids=t["tgt"])
      out["logits"] = o.logits
      generated = model.generate(t["source"], max_new_tokens=8, do_sample=False, num_beams=1)
      out["greedy"] = generated[:, 1:]
    elif name.startswith("t5") or name in ("marian", "bart"):
      o = model(input_ids=t["src"], attention_mask=t["src_mask"], decoder_input_ids=t["tgt"])
      out["logits"] = o.logits
      generated = model.generate(  # plain greedy: Marian's config would force an end token
          t["source"],
          max_new_tokens=8,
          do_sample=False,
          num_beams=1,
          min_new_tokens=8,
          forced_eos_token_id=None,
      )
      out["greedy"] = generated[:, 1:]  # after decoder_start_token_id
    elif name.startswith("bert"):
      o = model(
          input_ids=t["tokens"],
          attention_mask=t["attention_mask"],
          token_type_ids=t["token_types"],
          output_hidden_states=True,
      )
      out["hidden"] = o.hidden_states[-1]
      if name == "bert":
        out["pooled"] = o.pooler_output
      else:
        out["logits"] = o.logits
    else:
      o = model(pixel_values=t["images"].permute(0, 3, 1, 2), output_hidden_states=True)
      if name == "vit":
        out["hidden"] = o.last_hidden_state
        out["pooled"] = o.pooler_output
      else:
        out["logits"] = o.logits
  return {k: v.numpy() for k, v in out.items()}


def write(name: str) -> pathlib.Path:
  model = build(name)
  directory = OUT / name
  shutil.rmtree(directory, ignore_errors=True)
  shard = {"bert_mlm": "20KB"}.get(name)  # one fixture is sharded, to cover the index format
  kwargs = {"max_shard_size": shard} if shard else {}
  model.save_pretrained(directory, safe_serialization=True, **kwargs)
  x = inputs(name)
  y = run(name, model, x)
  # trained parameters: Marian's fixed sinusoids are parameters that no file holds
  count = sum(p.numel() for p in model.parameters() if p.requires_grad)
  np.savez(directory / "reference.npz", **x, **y, hf_param_count=np.int64(count))
  size = sum(f.stat().st_size for f in directory.iterdir())
  print(
      f"{name:15s} {count:7d} parameters, {size / 1024:6.1f} KiB: "
      f"{', '.join(sorted(p.name for p in directory.iterdir()))}"
  )
  return directory


def check_export(name: str, directory: pathlib.Path) -> None:
  """load_hf -> save_hf -> transformers.from_pretrained reproduces the reference outputs."""
  from transformers_jax.interop import load_hf, save_hf

  fields, params = load_hf(directory)
  with tempfile.TemporaryDirectory() as tmp:
    architecture = build(name).__class__.__name__
    save_hf(tmp, fields, params, architecture=architecture)
    cls = getattr(transformers, architecture)
    model = cls.from_pretrained(tmp).eval()
  ref = np.load(directory / "reference.npz", allow_pickle=False)
  got = run(name, model, {k: ref[k] for k in inputs(name)})
  for k, v in got.items():
    err = np.max(np.abs(v - ref[k]))
    assert err < 1e-5, (name, k, err)
  print(f"{name:15s} save_hf -> from_pretrained matches the reference")


def write_rope() -> None:
  """rope_llama3.npz: transformers' RoPE frequencies for Llama 3.1's scaling (factor 8, low 1,
  high 4, original context 8,192; theta 500,000, 128-wide heads), which positions.rope_frequencies
  must reproduce."""
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

  rope = dict(
      rope_type="llama3",
      rope_theta=500000.0,
      factor=8.0,
      low_freq_factor=1.0,
      high_freq_factor=4.0,
      original_max_position_embeddings=8192,
  )
  config = transformers.LlamaConfig(
      hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072, rope_parameters=rope
  )
  inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
  np.savez(OUT / "rope_llama3.npz", inv_freq=inv_freq.numpy())
  print("rope_llama3     transformers' llama3 RoPE frequencies")
  write_rope_yarn()


def write_rope_yarn() -> None:
  """rope_yarn.npz: transformers' YaRN frequencies and attention factors for gpt-oss's scaling
  (factor 32 over 4,096 positions, betas 32 and 1, not truncated; theta 150,000, 64-wide heads)
  and for the same truncated with an explicit attention factor of 1 (DeepSeek-V3's form), which
  positions.rope_frequencies and yarn.Yarn.scale must reproduce."""
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

  out = {}
  for name, extra in (("gpt_oss", dict(truncate=False)), ("truncated", dict(attention_factor=1.0))):
    rope = dict(
        rope_type="yarn",
        rope_theta=150000.0,
        factor=32.0,
        beta_fast=32.0,
        beta_slow=1.0,
        original_max_position_embeddings=4096,
        **extra,
    )
    config = transformers.GptOssConfig(head_dim=64, rope_parameters=rope)
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    out[f"{name}_inv_freq"], out[f"{name}_factor"] = inv_freq.numpy(), np.float64(factor)
  np.savez(OUT / "rope_yarn.npz", **out)
  print("rope_yarn       transformers' YaRN RoPE frequencies")


# Every decoder fixture's tokenizer but GPT-2's (tokenizer.json, tokenizer_config.json with a chat template):
# a character-level BPE over lowercase text (letters, digits, a metaspace for the space, some
# punctuation and the newline), merges learnt from CHAT_TEXT up to the fixture's vocabulary, and
# ChatML's turn markers as special tokens. The template refuses roles it does not know.
CHAT_ALPHABET = list("abcdefghijklmnopqrstuvwxyz0123456789\u2581.,?!'-:\n")
CHAT_SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHAT_TEXT = (
    "system\nuser\nassistant\nyou are a helpful assistant. what is the answer? the answer is "
    "forty two. hello, how are you today? i am fine, thank you! tell me a story about a cat and "
    "a dog. once upon a time there was a small model that learnt to answer questions: it read "
    "the text, one token at a time, and wrote the next one. 0 1 2 3 4 5 6 7 8 9 10 100 2026. "
)


def chat_tokenizer(vocab_size: int):
  """A small real tokenizer (tokenizers' BPE) of at most `vocab_size` ids."""
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.normalizer = normalizers.Lowercase()
  tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
  tok.decoder = decoders.Metaspace(prepend_scheme="never")
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=CHAT_SPECIALS,
      initial_alphabet=CHAT_ALPHABET,
      limit_alphabet=len(CHAT_ALPHABET),
      show_progress=False,
  )
  tok.train_from_iterator([CHAT_TEXT] * 4, trainer=trainer)
  assert tok.get_vocab_size() <= vocab_size, (tok.get_vocab_size(), vocab_size)
  return tok


def write_chat_tokenizer(name: str, directory: pathlib.Path) -> None:
  """tokenizer.json and tokenizer_config.json (the chat template, the end-of-turn token) of
  decoder fixture `name`; checked against transformers' own loading and apply_chat_template."""
  import json

  vocab_size = DECODERS[name]["vocab_size"]
  tok = chat_tokenizer(vocab_size)
  tok.save(str(directory / "tokenizer.json"))
  config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "chat_template": CHAT_TEMPLATE,
      "bos_token": None,
      "eos_token": "<|im_end|>",
      "pad_token": "<|im_end|>",
      "unk_token": "<unk>",
      "model_max_length": 64,
  }
  (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
  hf = transformers.AutoTokenizer.from_pretrained(directory)
  messages = [{"role": "user", "content": "What is it?"}, {"role": "assistant", "content": "42."}]
  rendered = hf.apply_chat_template(messages, tokenize=False)
  from transformers_jax.data.chat import read_template

  assert read_template(directory).render(messages) == rendered, rendered
  print(f"{name:15s} tokenizer of {tok.get_vocab_size()} ids (of {vocab_size}), chat template")


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  if torch is None:
    raise UserError('this script needs torch and transformers: pip install -e ".[hf]"')
  print(f"torch {torch.__version__}, transformers {transformers.__version__}")
  names = ("gpt2", "bert", "bert_mlm", "vit", "vit_classifier", "llama", "mistral", "qwen2")
  names += ("mixtral", "gemma", "gemma2", "t5", "marian", "bart", "t5_tied", "marian_shapes")
  names += tuple(OPEN_MODELS) + ("gpt_oss", "qwen3_moe", "deepseek_v3", "llama4_text")
  unknown = sorted(set(FLAGS.names) - set(names))
  if unknown:
    raise UserError(f"--names: no fixture called {unknown[0]}; the fixtures are {', '.join(names)}")
  if not FLAGS.names and not FLAGS.tokenizers_only:
    write_rope()
  for name in FLAGS.names or names:
    directory = OUT / name if FLAGS.tokenizers_only else write(name)
    if name in DECODERS and name != "gpt2":  # GPT-2: the model converted without a tokenizer
      write_chat_tokenizer(name, directory)
    if FLAGS.check and not FLAGS.tokenizers_only:
      check_export(name, directory)
    if name == "gpt_oss":
      packed = write_mxfp4(directory)
      if FLAGS.check:
        check_mxfp4(packed)


if __name__ == "__main__":
  cli.run_script(main)
