"""DeepSeek-V3 (DeepseekV3ForCausalLM) <-> the decoder family with multi-head latent attention
(modules/mla.py) and DeepSeek's mixture of experts (modules/moe_routing.py): pre-norm RMSNorm,
the first `first_k_dense_replace` blocks dense (their own intermediate_size), then MoE blocks of
n_routed_experts SwiGLU experts (moe_intermediate_size wide) chosen by sigmoid scores plus the
e_score_correction_bias within topk_group of n_group groups, beside n_shared_experts; RoPE with
YaRN's scaling on the decoupled key.

DeepSeek lays each head's RoPE features out in interleaved pairs (rope_interleave, the released
checkpoints' and transformers' default): their rows of q_b_proj (q_proj) and
kv_a_proj_with_mqa are reordered, even features first, on import, so that our half-split RoPE
computes the same scores, and put back on export. The hub's checkpoints hold the
multi-token prediction module after the last block, as `layers.<L>` (its embed_tokens and
shared_head.head copies of the model's, which transformers leaves unread): it is imported as
model.mtp_depth's modules (models/mtp.py) and exported in that layout.
"""

from __future__ import annotations

import math
import re

from transformers_jax.interop.common import (
    PRE_NORMS,
    ROPE_DECODER,
    Family,
    Rule,
    UnsupportedArchitecture,
    UnsupportedConfig,
    decoder_rules,
    get,
    linear,
    require,
)
from transformers_jax.interop.rope_scaling import read_rope, write_rope
from transformers_jax.modules.yarn import mscale, parse_yarn

MTP_OWN_COPIES = ("embed_tokens.weight", "shared_head.head.weight")  # the hub's copies


def rope_rows(lead: int, rope: int, heads: int = 1) -> tuple[int, ...]:
  """The torch rows of `heads` blocks of `lead` unrotated then `rope` interleaved rotated
  features, in our order: each block's rotated ones even features first (half-split pairs)."""
  out = []
  for h in range(heads):
    first = h * (lead + rope)
    out += list(range(first, first + lead))
    out += [first + lead + i for i in (*range(0, rope, 2), *range(1, rope, 2))]
  return tuple(out)


def _rope(hf, where: str) -> tuple[float, str]:
  """(rope_theta, model.rope_scaling) of a config.json: no scaling or YaRN (read by
  interop/rope_scaling.py), with the mscale_all_dim whose square multi-head latent attention
  multiplies its scores by."""
  theta, scaling = read_rope(hf, where, 10000.0)
  if scaling and not scaling.startswith("yarn:"):
    raise UnsupportedArchitecture(
        f"{where}: RoPE scaling {scaling.partition(':')[0]!r} is not supported (only 'yarn', "
        "DeepSeek-V3's): use a checkpoint without it"
    )
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  if scaling and rope.get("mscale_all_dim"):
    scaling = parse_yarn(scaling)._replace(mscale_all_dim=float(rope["mscale_all_dim"])).text()
  return theta, scaling


class DeepSeekV3(Family):
  model_type = "deepseek_v3"
  architectures = {"DeepseekV3ForCausalLM": ("lm",)}
  base_prefix = {"DeepseekV3ForCausalLM": "model."}
  load_prefix = "model."
  explicit_head_dim = True  # config.json's head_dim is the rotated width, which we derive
  aliases = {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"}
  defaults = dict(  # transformers' DeepseekV3Config
      vocab_size=129280,
      hidden_size=7168,
      intermediate_size=18432,
      moe_intermediate_size=2048,
      num_hidden_layers=61,
      num_attention_heads=128,
      num_key_value_heads=None,
      n_shared_experts=1,
      n_routed_experts=256,
      routed_scaling_factor=2.5,
      kv_lora_rank=512,
      q_lora_rank=1536,
      qk_rope_head_dim=64,
      v_head_dim=128,
      qk_nope_head_dim=128,
      n_group=8,
      topk_group=4,
      num_experts_per_tok=8,
      first_k_dense_replace=3,
      norm_topk_prob=True,
      hidden_act="silu",
      max_position_embeddings=4096,
      initializer_range=0.02,
      rms_norm_eps=1e-6,
      tie_word_embeddings=False,
      rope_interleave=True,
      attention_bias=False,
      attention_dropout=0.0,
  )
  summary_keys = (
      "num_hidden_layers",
      "hidden_size",
      "num_attention_heads",
      "kv_lora_rank",
      "q_lora_rank",
      "n_routed_experts",
      "moe_intermediate_size",
      "intermediate_size",
      "vocab_size",
  )

  def config(self, hf):
    """As Family's, except that a q_lora_rank given as null means queries projected directly
    (where a missing one takes the default, 1,536)."""
    out = super().config(hf)
    if "q_lora_rank" in hf and hf["q_lora_rank"] is None:
      out["q_lora_rank"] = None
    return out

  def fields(self, hf, architecture, where):
    # the hub's config.json also says how the original code routes: only DeepSeek-V3's way
    require(hf, where, hidden_act="silu", attention_bias=False, rope_interleave=True)
    require(hf, where, scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1)
    heads = hf["num_attention_heads"]
    if get(hf, "num_key_value_heads", default=heads) != heads:
      raise UnsupportedArchitecture(
          f"{where}: num_key_value_heads={hf['num_key_value_heads']!r} is not supported (only "
          f"num_attention_heads={heads}: latent attention expands keys for every head)"
      )
    if hf["n_shared_experts"] < 1:
      raise UnsupportedArchitecture(
          f"{where}: n_shared_experts={hf['n_shared_experts']!r} is not supported (at least 1 "
          "maps onto our blocks)"
      )
    theta, scaling = _rope(hf, where)
    layers, dense = hf["num_hidden_layers"], hf["first_k_dense_replace"]
    if dense >= layers:
      raise UnsupportedArchitecture(
          f"{where}: first_k_dense_replace={dense!r} is not supported (below "
          f"num_hidden_layers={layers}: a model with MoE blocks)"
      )
    return dict(
        family="decoder",
        num_layers=layers,
        d_model=hf["hidden_size"],
        num_heads=heads,
        d_ff=hf["moe_intermediate_size"],
        vocab_size=hf["vocab_size"],
        max_len=hf["max_position_embeddings"],
        positions="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        norm_placement="pre",
        norm="rmsnorm",
        norm_eps=hf["rms_norm_eps"],
        activation="swiglu",
        use_bias=False,
        tie_embeddings=bool(hf["tie_word_embeddings"]),
        head="lm",
        dropout=0.0,
        attention_dropout=hf["attention_dropout"],
        init_std=hf["initializer_range"],
        kv_lora_rank=hf["kv_lora_rank"],
        q_lora_rank=hf["q_lora_rank"] or 0,
        qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"],
        v_head_dim=hf["v_head_dim"],
        feed_forward="moe",
        moe_impl="ragged",
        moe_dropless=True,
        num_experts=hf["n_routed_experts"],
        top_k=hf["num_experts_per_tok"],
        num_shared_experts=hf["n_shared_experts"],
        moe_first_dense=dense,
        moe_dense_d_ff=hf["intermediate_size"],
        moe_score="sigmoid",
        moe_score_bias=True,
        moe_groups=hf["n_group"] or 1,
        moe_top_groups=hf["topk_group"] or 1,
        moe_routed_scale=float(hf["routed_scaling_factor"]),
        router_norm_topk=bool(hf["norm_topk_prob"]),
    )

  def adjust_loaded(self, tensors, fields):
    """The multi-token prediction modules the checkpoint holds after the last block."""
    L, depth = fields["num_layers"], 0
    while f"layers.{L + depth}.eh_proj.weight" in tensors:
      depth += 1
    fields["mtp_depth"] = depth

  def hf_config(self, c, architecture):
    rope = write_rope(c)["rope_scaling"]
    settings = parse_yarn(c.rope_scaling)
    if (
        settings is not None
    ):  # DeepSeek's own keys: the attention factor as mscale over mscale_all_dim
      rope["type"] = "yarn"
      rope["mscale_all_dim"] = settings.mscale_all_dim
      if settings.factor > 1:  # m(s, mscale) = attention factor * m(s, mscale_all_dim)
        rope["mscale"] = (settings.scale * mscale(settings.factor, settings.mscale_all_dim) - 1) / (
            0.1 * math.log(settings.factor)
        )
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.dense_ff_width,
        moe_intermediate_size=c.ff_width,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_heads,
        n_shared_experts=c.num_shared_experts,
        n_routed_experts=c.num_experts,
        routed_scaling_factor=c.moe_routed_scale,
        kv_lora_rank=c.kv_lora_rank,
        q_lora_rank=c.q_lora_rank or None,
        qk_rope_head_dim=c.qk_rope_head_dim,
        v_head_dim=c.v_head_dim,
        qk_nope_head_dim=c.qk_nope_head_dim,
        n_group=c.moe_groups,
        topk_group=c.moe_top_groups,
        num_experts_per_tok=c.top_k,
        first_k_dense_replace=c.moe_first_dense,
        norm_topk_prob=c.router_norm_topk,
        hidden_act="silu",
        max_position_embeddings=c.max_len,
        initializer_range=c.init_std,
        rms_norm_eps=c.norm_eps,
        tie_word_embeddings=c.tie_embeddings,
        rope_theta=c.rope_theta,
        rope_scaling=rope,
        rope_interleave=True,
        attention_bias=False,
        attention_dropout=c.attention_dropout,
        num_nextn_predict_layers=c.mtp_depth,
    )

  def block_rules(self, c, h: str, ours: tuple[str, ...], moe: bool) -> list[Rule]:
    """One block's tensors under `h` (`model.layers.<i>.`) <-> ours under `ours`."""
    H, N, R, C = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
    attn, a = ours + ("self_attn",), h + "self_attn."
    rules = [
        Rule("copy", (h + hf_name + ".weight",), (ours + (name, "scale"),))
        for hf_name, name in PRE_NORMS
    ]
    q_rows = rope_rows(N, R, H)
    if c.q_lora_rank:
      rules += linear(a + "q_a_proj", attn + ("query_down",))
      rules.append(
          Rule("copy", (a + "q_a_layernorm.weight",), (attn + ("query_latent_norm", "scale"),))
      )
      rules += linear(a + "q_b_proj", attn + ("query_up",), rows=q_rows)
    else:
      rules += linear(a + "q_proj", attn + ("query",), rows=q_rows)
    rules += linear(a + "kv_a_proj_with_mqa", attn + ("kv_down",), rows=rope_rows(C, R))
    rules.append(
        Rule("copy", (a + "kv_a_layernorm.weight",), (attn + ("kv_latent_norm", "scale"),))
    )
    rules += linear(a + "kv_b_proj", attn + ("kv_up",))
    rules += linear(a + "o_proj", attn + ("out",), n_in=2)
    ffn, m = ours + ("ffn",), h + "mlp."
    names = (("gate_proj", "wi_0"), ("up_proj", "wi_1"), ("down_proj", "wo"))
    if not moe:
      return rules + [r for hf_name, name in names for r in linear(m + hf_name, ffn + (name,))]
    rules += linear(m + "gate", ffn + ("router",))
    rules.append(
        Rule("copy", (m + "gate.e_score_correction_bias",), (ffn + ("e_score_correction_bias",),))
    )
    for hf_name, name in (("gate_proj", "wi"), ("up_proj", "wi_1"), ("down_proj", "wo")):
      experts = tuple(f"{m}experts.{e}.{hf_name}.weight" for e in range(c.num_experts))
      rules.append(Rule("experts", experts, (ffn + (name,),)))
    for hf_name, name in names:
      rules += linear(m + "shared_experts." + hf_name, ffn + ("shared", name))
    return rules

  def rules(self, c, base):
    mtp = []  # the hub's layout: one more `layers.<L + k>` each
    for k in range(c.mtp_depth):
      h, ours = f"{base}layers.{c.num_layers + k}.", ("mtp", f"depth_{k}")
      for hf_name, name in (("enorm", "embed_norm"), ("hnorm", "hidden_norm")):
        mtp.append(Rule("copy", (h + hf_name + ".weight",), (ours + (name, "scale"),)))
      mtp += linear(h + "eh_proj", ours + ("proj",))
      mtp.append(Rule("copy", (h + "shared_head.norm.weight",), (ours + ("final_norm", "scale"),)))
      mtp += self.block_rules(c, h, ours + ("block",), c.is_moe_layer(c.num_layers + k))

    def block(i, h, ours):  # (block_rules names the norms: the MTP blocks' too)
      return self.block_rules(c, h, ours, c.is_moe_layer(i))

    return decoder_rules(c, base, block, norms=(), after_blocks=mtp)

  def ignorable(self, c):
    patterns = [
        rf"layers\.{c.num_layers + k}\.{re.escape(n)}"
        for k in range(c.mtp_depth)
        for n in MTP_OWN_COPIES
    ]
    if c.tie_embeddings:
      patterns.append(r"lm_head\.weight")  # a tied copy of the token embedding
    return patterns

  def adjust_saved(self, tensors, c):
    """The hub's copies of the embedding and head in each multi-token prediction module."""
    base = self.base_prefix["DeepseekV3ForCausalLM"]
    for k in range(c.mtp_depth):
      h = f"{base}layers.{c.num_layers + k}."
      for copy, source in zip(MTP_OWN_COPIES, (f"{base}embed_tokens.weight", "lm_head.weight")):
        if source not in tensors:  # tied: the head is the embedding
          source = f"{base}embed_tokens.weight"
        shape, dtype = tensors.spec(source)
        tensors.plan(h + copy, shape, dtype, lambda s=source: tensors[s])

  def default_architecture(self, c):
    return "DeepseekV3ForCausalLM" if c.family == "decoder" and c.mla else None

  def requirements(self, c, architecture):
    return dict(
        ROPE_DECODER,
        use_bias=False,
        feed_forward="moe",
        activation="swiglu",
        mla=True,
        moe_every=1,
        moe_score="sigmoid",
        moe_score_bias=True,
        num_shared_experts=c.num_shared_experts,
        moe_first_dense=c.moe_first_dense,
        moe_dense_d_ff=c.moe_dense_d_ff,
        moe_groups=c.moe_groups,
        moe_top_groups=c.moe_top_groups,
        moe_routed_scale=c.moe_routed_scale,
        router_norm_topk=c.router_norm_topk,
        mtp_depth=c.mtp_depth,
        rope_scaling=c.rope_scaling if c.rope_scaling.startswith("yarn:") else "",
    )

  def check_exportable(self, c, architecture):
    if c.num_shared_experts < 1:
      raise UnsupportedConfig(
          f"cannot write model.num_shared_experts={c.num_shared_experts} as {architecture} "
          "(which builds at least 1): change the config or pick another architecture"
      )
