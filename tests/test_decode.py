"""Decoding: the KV cache equals a full forward pass, strategies agree where they must, beam
search beats greedy where it should, bad input is refused, sharded decoding equals one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformers_jax import decode
from transformers_jax.config import ModelConfig
from transformers_jax.decode import filter_logits, length_penalty, select_tokens
from transformers_jax.models import build_model, param_shapes

from conftest import run_python, subprocess_env

KEY = jax.random.PRNGKey(0)
# init_std 0.3: attention that is far from uniform, so a wrong mask or position shows
SMALL = dict(num_layers=2, d_model=32, num_heads=4, vocab_size=50, max_len=16, init_std=0.3)
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15]]  # different lengths
BOS, EOS = 48, 49


def init(cfg, seed=0):
  """Random parameters (normal, std init_std) of `cfg`'s shapes: nothing traced or compiled."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.normal(0.0, cfg.init_std, s.shape), s.dtype), param_shapes(cfg)
  )


def full_logits(cfg, params, prompts, tokens):
  """Logits of one full forward pass (no cache) predicting each generated token, [B, M, V].

  Rows are right-padded; causal attention keeps the padding from earlier positions."""
  model = build_model(cfg)
  M = tokens.shape[1]
  if cfg.family == "decoder":
    seqs = np.zeros((len(prompts), max(map(len, prompts)) + M - 1), np.int32)
    for b, p in enumerate(prompts):
      seqs[b, : len(p) + M - 1] = list(p) + list(tokens[b, :-1])
    logits = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(seqs))["logits"])
    return np.stack([logits[b, len(p) - 1 : len(p) - 1 + M] for b, p in enumerate(prompts)])
  src = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
  for b, p in enumerate(prompts):
    src[b, : len(p)] = p
  tgt = np.concatenate([np.full((len(prompts), 1), BOS), tokens[:, :-1]], axis=1)
  return np.asarray(
      jax.jit(model.apply)({"params": params}, src, tgt, (src > 0).astype(np.int32))["logits"]
  )


def run(cfg, params, inputs, max_new, **kw):
  if cfg.family == "decoder":
    return decode.generate(cfg, params, inputs, max_new, **kw)
  kw.setdefault("beam_size", 0)
  return decode.translate(cfg, params, inputs, BOS, EOS, max_new, **kw)


# ------------------------------------------------------------------ cache == full forward
@pytest.mark.parametrize(
    "family,extra",
    [
        ("decoder", dict(positions="learned")),
        ("decoder", dict(positions="rope", num_kv_heads=2)),
        ("decoder", dict(positions="sinusoidal", num_kv_heads=1, scan_layers=True)),
        ("encoder_decoder", dict(positions="sinusoidal")),
        ("encoder_decoder", dict(positions="rope", num_kv_heads=2, scan_layers=True)),
        # score biases over cache slots: ALiBi with GQA; T5's tables in both stacks, scanned
        ("decoder", dict(positions="alibi", num_kv_heads=2)),
        ("encoder_decoder", dict(positions="t5", scan_layers=True)),
        # a sliding window of 3 on every other block (the window traced under the scan)
        ("decoder", dict(positions="rope", sliding_window=3, sliding_every=2, scan_layers=True)),
        # rings of 3 slots (a static window): block 0 of two looped ones; every block, scanned,
        # with ALiBi's bias read at the positions the slots hold
        ("decoder", dict(positions="rope", sliding_window=3, sliding_every=2)),
        ("decoder", dict(positions="alibi", sliding_window=3, num_kv_heads=2, scan_layers=True)),
        # per-layer patterns (model.layer_types), looped: rings of 4 (chunks, by each row's own
        # positions) and 3 slots (a window, RoPE at its own base), q/k norms over the whole
        # projection; scanned: NoPE beside chunks of 3 (both traced), parameterless q/k norms
        (
            "decoder",
            dict(positions="rope", layer_types="chunked,sliding", attention_chunk=4)
            | dict(sliding_window=3, rope_local_theta=50.0, qk_norm=True, qk_norm_kind="full"),
        ),
        (
            "decoder",
            dict(positions="rope", layer_types="nope,chunked", attention_chunk=3, num_kv_heads=2)
            | dict(qk_norm=True, qk_norm_kind="l2", scan_layers=True),
        ),
        # the decoder stack with its own heads and feed-forward width
        ("encoder_decoder", dict(positions="rope", decoder_num_heads=2, decoder_d_ff=24)),
        # a window of one position (a ring of one slot) with GQA: each query sees itself only
        # (transformers' cached generate keeps a key too many there and parts from its own
        # forward pass from the second new token on; scripts/check_open_models.py)
        ("decoder", dict(positions="rope", sliding_window=1, num_kv_heads=2)),
    ],
)
def test_cached_logits_equal_full_forward_at_every_step(family, extra):
  """Prompts of different lengths in one batch, every positional encoding, GQA and MQA, looped
  and scanned layers: each step's logits equal a forward pass over the sequence so far."""
  cfg = ModelConfig(family=family, **SMALL, **extra)
  params = init(cfg)
  out = run(cfg, params, PROMPTS, 40, return_logits=True)
  # the positions bound the new tokens: 16 - 7 + 1 for the longest prompt; 16 for a target
  assert out.max_new_tokens == (10 if family == "decoder" else 16)
  assert out.logits.shape == (3, out.max_new_tokens, cfg.vocab_size)
  full = full_logits(cfg, params, PROMPTS, out.tokens)
  for b in range(len(PROMPTS)):
    n = out.lengths[b] + out.stopped[b]  # steps this row took
    np.testing.assert_allclose(out.logits[b, :n], full[b, :n], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out.tokens[b, :n], full[b, :n].argmax(-1))


def test_a_static_sliding_window_keeps_a_ring_of_window_slots():
  """Layers with a static window cache `window` slots, whatever the length; the others (and
  every layer when the window is traced under a scan) one slot per position."""
  kw = dict(SMALL, positions="rope", sliding_window=3)
  dummy = jnp.zeros((2, 12), jnp.int32)

  def slots(**extra):
    model = build_model(ModelConfig(**kw, **extra), decode=True)
    cache = decode.init_cache(model, dummy, dummy, dummy)["decoder"]
    return {k: v["self_attn"]["cached_key"].shape[-2] for k, v in cache.items()}

  assert slots(sliding_every=2) == {"layer_0": 3, "layer_1": 12}
  assert slots(scan_layers=True) == {"layers": 3}
  assert slots(sliding_every=2, scan_layers=True) == {"layers": 12}


def test_cross_attention_keys_are_cached_once():
  """After the first decode step the cross-attention keys/values sit in the cache; a later step
  does not read the encoder output at all."""
  cfg = ModelConfig(family="encoder_decoder", positions="sinusoidal", **SMALL)
  params, model = init(cfg), build_model(cfg, decode=True)
  src, mask = jnp.asarray([PROMPTS[0]]), jnp.ones((1, 5), jnp.int32)
  cache = decode.init_cache(model, src, jnp.zeros((1, 4), jnp.int32))
  assert "cross_key" not in cache["decoder"]["layer_0"].get("cross_attn", {})
  encoded = jax.jit(lambda src: model.apply({"params": params}, src, mask, method="encode"))(src)
  step = jax.jit(
      lambda cache, enc, tok: model.apply(  # noqa: E731
          {"params": params, "cache": cache},
          enc,
          tok,
          mask,
          method="decode_logits",
          mutable=["cache"],
      )
  )
  _, state = step(cache, encoded, jnp.asarray([[BOS]]))
  cross = state["cache"]["decoder"]["layer_0"]["cross_attn"]
  assert cross["cross_key"].shape == (1, cfg.kv_heads, 5, 8)
  a, _ = step(state["cache"], encoded, jnp.asarray([[3]]))
  b, _ = step(state["cache"], jnp.zeros_like(encoded), jnp.asarray([[3]]))
  np.testing.assert_array_equal(a["logits"], b["logits"])


# ------------------------------------------------------------------ strategies
@pytest.fixture(scope="module")
def lm():
  cfg = ModelConfig(positions="rope", num_kv_heads=2, **SMALL)
  return cfg, init(cfg)


def test_greedy_equals_top_k_1_sample_and_beam_1(lm):
  cfg, params = lm
  greedy = decode.generate(cfg, params, PROMPTS, 40, return_logits=True)  # compiled above
  top1 = decode.generate(cfg, params, PROMPTS, 40, temperature=1.0, top_k=1, seed=5)
  beam1 = decode.generate(cfg, params, PROMPTS, 40, beam_size=1)
  np.testing.assert_array_equal(greedy.tokens, top1.tokens)
  np.testing.assert_array_equal(greedy.tokens, beam1.tokens)
  # with a stop token: rows end there and the rest is padding
  stop = int(greedy.tokens[0, 2])
  g = decode.generate(cfg, params, PROMPTS, 40, stop_tokens=[stop], pad_id=0)
  first = list(greedy.tokens[0]).index(stop)
  assert g.stopped[0] and g.lengths[0] == first and g.ids()[0] == list(greedy.tokens[0, :first])
  assert (g.tokens[0, first + 1 :] == 0).all()
  for b in range(3):
    if not g.stopped[b]:
      np.testing.assert_array_equal(g.tokens[b], greedy.tokens[b])


def test_fixed_seed_gives_the_same_sample(lm):
  cfg, params = lm
  kw = dict(temperature=1.5, top_p=0.9)
  a = decode.generate(cfg, params, PROMPTS, 8, seed=3, **kw)
  b = decode.generate(cfg, params, PROMPTS, 8, seed=3, **kw)
  c = decode.generate(cfg, params, PROMPTS, 8, seed=4, **kw)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert (a.tokens != c.tokens).any()


def test_top_k_and_top_p_filters():
  logits = jnp.log(jnp.asarray([[0.05, 0.4, 0.1, 0.3, 0.15]]))
  kept = lambda x: set(np.flatnonzero(np.isfinite(np.asarray(x[0]))))  # noqa: E731
  assert kept(filter_logits(logits, top_k=2)) == {1, 3}
  assert kept(filter_logits(logits, top_p=0.4)) == {1}  # 0.4 alone reaches 0.4
  assert kept(filter_logits(logits, top_p=0.75)) == {1, 3, 4}  # 0.4 + 0.3 < 0.75
  assert kept(filter_logits(logits, top_k=4, top_p=0.99)) == {1, 2, 3, 4}
  assert kept(filter_logits(logits)) == {0, 1, 2, 3, 4}
  draws = {int(select_tokens(logits, jax.random.PRNGKey(i), 1.0, 0, 0.75)[0]) for i in range(50)}
  assert draws == {1, 3, 4}
  assert int(select_tokens(logits, KEY, 0.0)[0]) == 1


# ------------------------------------------------------------------ beam search
def bigram_model(table):
  """A decoder whose next-token distribution depends only on the last token: no positions, no
  norms, every block weight zero (each block is the identity), one-hot embeddings and an
  unembedding holding log `table`[last token]."""
  V = table.shape[0]
  cfg = ModelConfig(
      num_layers=1,
      d_model=V,
      num_heads=1,
      vocab_size=V,
      max_len=8,
      positions="none",
      norm_placement="none",
      final_norm=False,
      tie_embeddings=False,
      use_bias=False,
  )
  params = jax.tree_util.tree_map(jnp.zeros_like, init(cfg))
  params["embed"]["token_embed"]["embedding"] = jnp.eye(V)
  params["lm_head"]["kernel"] = jnp.log(jnp.asarray(table, jnp.float32))
  return cfg, params


def test_beam_search_finds_a_more_probable_sequence_than_greedy():
  # tokens: 0 start, 1 A, 2 B, 3 C, 4 D, 5 end
  table = np.full((6, 6), 1e-6)
  table[0, [1, 2]] = 0.55, 0.45  # A is the greedy first step ...
  table[1, [3, 4, 5]] = 0.34, 0.33, 0.33  # ... but nothing after A is likely
  table[2, [3, 5]] = 0.05, 0.95  # while B is almost surely followed by the end
  table[3, 5] = table[4, 5] = table[5, 5] = 1.0
  cfg, params = bigram_model(table / table.sum(1, keepdims=True))
  greedy = decode.generate(cfg, params, [[0]], 5, stop_tokens=[5])
  assert greedy.ids() == [[1, 3]]  # P = 0.55 * 0.34 * 1.0 = 0.187
  beam = decode.generate(cfg, params, [[0]], 5, stop_tokens=[5], beam_size=4, alpha=0.6)
  assert beam.ids() == [[2]] and beam.stopped[0]  # P = 0.45 * 0.95 = 0.4275
  lp = float(length_penalty(2, 0.6))
  assert beam.scores[0] == pytest.approx(np.log(0.45 * 0.95) / lp, rel=1e-4)


def test_translation_beam_score_is_the_length_penalised_log_probability():
  """translate's default (beam 4, alpha 0.6): each result's score is log P(y | x) / lp(|y|)
  under a full forward pass."""
  cfg = ModelConfig(family="encoder_decoder", positions="sinusoidal", **SMALL)
  params = init(cfg)
  beam = decode.translate(cfg, params, PROMPTS, BOS, EOS, 8)
  assert beam.max_new_tokens == 8 and beam.scores.shape == (3,)
  logp = jax.nn.log_softmax(full_logits(cfg, params, PROMPTS, beam.tokens))
  for b in range(len(PROMPTS)):
    n = beam.lengths[b] + beam.stopped[b]  # with the eos
    total = sum(float(logp[b, j, t]) for j, t in enumerate(beam.tokens[b, :n]))
    assert beam.scores[b] == pytest.approx(total / float(length_penalty(n, 0.6)), abs=1e-4)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "prompts,kw,message",
    [
        ([list(range(17))], {}, "17 tokens but model.max_len=16"),
        ([[1, 2], []], {}, "prompt 2 is empty"),
        ([], {}, "no prompts"),
        ([[1, 50]], {}, "token id 50, outside the vocabulary"),
        ([[1, -1]], {}, "token id -1"),
        ([1, 2, 3], {}, "a list of prompts"),
        ([[1]], dict(temperature=-1.0), "temperature"),
        ([[1]], dict(temperature=float("nan")), "temperature=nan: must be a finite"),
        ([[1]], dict(temperature=float("inf")), "temperature=inf"),
        ([[1]], dict(beam_size=2, alpha=float("nan")), "alpha=nan"),
        ([[1]], dict(top_p=float("nan")), "top_p"),
        ([[1]], dict(top_p=0.0), "top_p"),
        ([[1]], dict(top_k=51), "top_k"),
        ([[1]], dict(stop_tokens=[99]), "stop token 99"),
        ([[1]], dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_prompts_and_settings_are_refused(lm, prompts, kw, message):
  cfg, params = lm
  kw = {"max_new_tokens": 4, **kw}
  with pytest.raises(ValueError, match=message):
    decode.generate(cfg, params, prompts, **kw)


def test_wrong_family_and_bad_sources_are_refused(lm):
  cfg, params = lm
  with pytest.raises(ValueError, match="use generate"):
    decode.translate(cfg, params, [[1]], BOS, EOS)
  s2s = ModelConfig(family="encoder_decoder", **SMALL)
  with pytest.raises(ValueError, match="use translate"):
    decode.generate(s2s, {}, [[1]], 4)
  with pytest.raises(ValueError, match="source is empty"):
    decode.translate(s2s, {}, [[]], BOS, EOS)
  with pytest.raises(ValueError, match="bos_id=None"):
    decode.translate(s2s, {}, [[1]], None, EOS)
  with pytest.raises(ValueError, match="not encoder: only decoder"):
    decode.generate(ModelConfig(family="encoder", head="mlm", **SMALL), {}, [[1]], 4)


# ------------------------------------------------------------------ sharded, and the CLI
SHARDED = """
import jax, numpy as np
from transformers_jax import decode
from transformers_jax.machine import parallel
from transformers_jax.config import ModelConfig
from transformers_jax.models import param_shapes
mesh = parallel.make_mesh({"data": 2, "tensor": 2})
for family in ("decoder", "encoder_decoder"):
  cfg = ModelConfig(family=family, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2,
                    vocab_size=50, max_len=16, init_std=0.3, positions="rope")
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(lambda s: rng.normal(0, 0.3, s.shape).astype(s.dtype),
                                  param_shapes(cfg))
  sharded = decode.shard_params(cfg, params, mesh)
  kernel = sharded["decoder"]["layer_0"]["self_attn"]["key"]["kernel"]
  assert len(kernel.sharding.device_set) == 4, kernel.sharding
  if family == "decoder":  # 2 rows: the batch splits over data=2
    kw = dict(beam_size=0, return_logits=True)
    run = lambda p, **k: decode.generate(cfg, p, [[1, 2, 3, 4, 5], [7, 8]], 6, **kw, **k)
  else:  # 3 rows: the batch is replicated, the heads still split over tensor=2
    run = lambda p, **k: decode.translate(cfg, p, [[1, 2, 3], [4], [5, 6, 7, 8]], 48, 49, 6, **k)
  a, b = run(params), run(sharded, mesh=mesh)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  if a.logits is not None:
    np.testing.assert_allclose(a.logits, b.logits, rtol=1e-4, atol=1e-4)
  else:
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-4, atol=1e-4)
print("ok")
"""


def test_sharded_decoding_equals_one_device():
  """4 CPU devices, data 2 x tensor 2, GQA + RoPE: the same tokens and logits as one device."""
  out = run_python(["-c", SHARDED], env=subprocess_env(4))
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_generate_cli_loads_the_latest_checkpoint(lm, tmp_path):
  from transformers_jax.train_config import experiment_config
  from transformers_jax.run_folder.runs import load_run
  from transformers_jax.errors import RunError
  from transformers_jax.run_folder.checkpoints import Checkpoints

  cfg, params = lm
  (tmp_path / "config.json").write_text(experiment_config(**cfg.to_dict()).to_json())
  ckpt = Checkpoints(tmp_path / "checkpoints", async_save=False)
  ckpt.save(3, {"params": params})
  ckpt.close()
  cmd = [
      "-m",
      "transformers_jax.generate",
      "--workdir",
      str(tmp_path),
      "--prompt_ids",
      "1,2,3",
      "--print_ids",
      "--temperature",
      "0",
      "--max_new_tokens",
      "30",
  ]
  out = run_python(cmd)
  assert out.returncode == 0, out.stderr[-2000:]
  expected = decode.generate(cfg, params, [[1, 2, 3]], 30).ids()[0]
  assert out.stdout.strip() == ",".join(map(str, expected))
  assert "lowered to 14" in out.stderr  # 16 positions, 3 of them the prompt's
  with pytest.raises(RunError, match="--step=5: .* checkpoints at steps 3"):
    load_run(tmp_path, step=5)
  # beam search with sampling flags would silently ignore them: one line, before any decoding
  out = run_python(cmd + ["--beam_size", "4"])
  assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(
      "error: --beam_size=4 with --temperature/--top_k/--top_p"
  )


def test_load_run_errors_name_the_fix(lm, tmp_path):
  from transformers_jax.errors import UserError
  from transformers_jax.train_config import experiment_config
  from transformers_jax.cli import parse_ids
  from transformers_jax.run_folder.runs import load_run
  from transformers_jax.errors import RunError

  assert parse_ids("1, 2,3", "prompt_ids") == [1, 2, 3]
  with pytest.raises(UserError, match="comma-separated integers"):
    parse_ids("1,x", "prompt_ids")
  with pytest.raises(RunError, match="has no config.json"):
    load_run(tmp_path)
  (tmp_path / "config.json").write_text(experiment_config(**lm[0].to_dict()).to_json())
  with pytest.raises(RunError, match="no checkpoint yet"):
    load_run(tmp_path)
