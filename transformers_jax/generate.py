"""Generate from a training run's latest checkpoint (decoder-only and encoder-decoder):

    python -m transformers_jax.generate --workdir runs/x --prompt "def main(" --max_new_tokens 200 \
        [--temperature 0.8 --top_k 40 --top_p 0.95 --seed 0 | --beam_size 4 --alpha 0.6]
    python -m transformers_jax.generate --workdir runs/numbers --source "4213"
    python -m transformers_jax.generate --workdir runs/sft --chat "What is it?" --temperature 0

`--temperature 0` is greedy. The encoder-decoder translates `--source` with beam search (beam 4,
alpha 0.6) unless a sampling flag or `--beam_size 0` is given, and stops at the tokenizer's eos.
`--prompt_ids 1,2,3` / `--source_ids` take token ids, `--print_ids` prints the generated ids.
The run's config.json gives the model and tokenizer.json the tokenizer; `--member I` picks one
member of a population's run.
"""

from __future__ import annotations

import sys

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.cli import parse_ids
from transformers_jax.data.chat import chat_prompt, find_template
from transformers_jax.run_folder.runs import Run, load_run
from transformers_jax.tasks.sft import end_of_turn_ids

flags.DEFINE_string("workdir", None, "A training run's directory (config.json, checkpoints/).")
flags.DEFINE_string("prompt", None, "Decoder-only: text to continue.")
flags.DEFINE_string("prompt_ids", None, "Decoder-only: token ids to continue, e.g. 1,2,3.")
flags.DEFINE_string(
    "chat",
    None,
    "Decoder-only: a user turn, rendered by the run's chat template with the generation prompt; "
    "prints the assistant's reply, which ends at the template's end-of-turn token.",
)
flags.DEFINE_string("source", None, "Encoder-decoder: text to translate.")
flags.DEFINE_string("source_ids", None, "Encoder-decoder: token ids to translate.")
flags.DEFINE_bool("print_ids", False, "Print the generated token ids instead of text.")
flags.DEFINE_integer(
    "max_new_tokens",
    200,
    "Tokens to generate (at most what model.max_len allows); encoder-decoder "
    "default: source length + 50.",
)
flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 = greedy.")
flags.DEFINE_integer("top_k", 40, "Sample among the k most probable tokens; 0 = all.")
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling: the smallest set with this probability.")
flags.DEFINE_integer(
    "beam_size",
    None,
    "Beam search width; 0 = sampling/greedy. Default 4 for the "
    "encoder-decoder (unless a sampling flag is given), 0 otherwise.",
)
flags.DEFINE_float("alpha", 0.6, "Beam search length penalty exponent (0 = none).")
flags.DEFINE_integer("seed", 0, "Sampling seed: the same seed gives the same sample.")
flags.DEFINE_string(
    "stop_ids", None, "Token ids that end generation, e.g. 10 (default: the tokenizer's eos)."
)
flags.DEFINE_integer("step", None, "Checkpoint step to load (default: the latest).")
flags.DEFINE_integer(
    "member",
    None,
    "A population's run: the member to generate from (0-based, as `member` in its "
    "metrics.jsonl); required for a population, refused for a single run.",
)
flags.DEFINE_enum(
    "quantization",
    "",
    ["", "int8"],
    "int8: the Block's weights quantized to int8 per channel for the matmuls (qwix; "
    "docs/quantization.md); '' = as the run trained.",
)
flags.DEFINE_enum(
    "kv_cache_dtype",
    "",
    ["", "int8"],
    "int8: the key/value cache stored in int8 with a scale per token and head; '' = the "
    "compute dtype.",
)
FLAGS = flags.FLAGS


def _input_ids(tok, text_flag: str, ids_flag: str) -> list[int]:
  text, ids = FLAGS[text_flag].value, FLAGS[ids_flag].value
  if (text is None) == (ids is None):
    raise UserError(f"give exactly one of --{text_flag} and --{ids_flag}")
  if ids is not None:
    return parse_ids(ids, ids_flag)
  if tok is None:
    raise UserError(f"the run has no tokenizer.json: pass --{ids_flag}")
  return tok.encode(text)


def _chat_template(tok):
  """The run's chat template when --chat is given (None without --chat); --chat with
  --prompt or --prompt_ids, or a run without a tokenizer or template, is refused."""
  if FLAGS.chat is None:
    return None
  if FLAGS.prompt is not None or FLAGS.prompt_ids is not None:
    raise UserError("--chat is a user turn in place of --prompt/--prompt_ids: give only one")
  if tok is None:
    raise UserError(f"--chat: {FLAGS.workdir} has no tokenizer.json to write the turn with")
  template = find_template(FLAGS.workdir)
  if template is None:
    raise UserError(
        f"--chat: {FLAGS.workdir} keeps no chat template (hf_files/chat_template.jinja or a "
        "tokenizer_config.json with chat_template): convert a model that has one, train with "
        "--config.task=sft, or use --prompt"
    )
  return template


def main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}: pass options as --flag=value")
  if not FLAGS.workdir:
    raise UserError("--workdir is required: the directory of a training run")
  from transformers_jax import decode
  from transformers_jax.modules import quantization

  cfg, params, tok, step = load_run(FLAGS.workdir, FLAGS.step, FLAGS.member)
  cfg = quantization.decoding_config(cfg, FLAGS.quantization, FLAGS.kv_cache_dtype)
  if FLAGS.member is not None:  # say which model answers (stderr: stdout is the text alone)
    from transformers_jax.train.members import chosen

    print(
        f"generating with {chosen(FLAGS.workdir, FLAGS.member)} of {FLAGS.workdir}, step {step}",
        file=sys.stderr,
    )
  sampling_flags = any(FLAGS[f].present for f in ("temperature", "top_k", "top_p"))
  if sampling_flags and FLAGS.beam_size:  # beam search keeps the likeliest: it draws nothing
    raise UserError(
        f"--beam_size={FLAGS.beam_size} with --temperature/--top_k/--top_p: beam search is "
        "deterministic and would ignore the sampling flags; give one or the other"
    )
  common = dict(
      temperature=FLAGS.temperature,
      top_k=FLAGS.top_k,
      top_p=FLAGS.top_p,
      seed=FLAGS.seed,
      alpha=FLAGS.alpha,
  )
  if cfg.family == "decoder":
    if FLAGS.source is not None or FLAGS.source_ids is not None:
      raise UserError(
          "this run is a decoder-only model: --source/--source_ids are an encoder-decoder's; "
          "give only --prompt or --prompt_ids"
      )
    template = _chat_template(tok)
    if template is not None:
      prompt = chat_prompt(tok, template, FLAGS.chat)
    else:
      prompt = _input_ids(tok, "prompt", "prompt_ids")
    if FLAGS.stop_ids is not None:
      stop = parse_ids(FLAGS.stop_ids, "stop_ids")
    elif template is not None:
      stop = end_of_turn_ids(tok, template)
    else:
      stop = [tok.eos_id] if tok is not None and tok.eos_id is not None else []
    out = decode.generate(
        cfg,
        params,
        [prompt],
        FLAGS.max_new_tokens,
        stop_tokens=stop,
        beam_size=FLAGS.beam_size or 0,
        **common,
    )
  elif cfg.family == "encoder_decoder":
    if FLAGS.chat is not None:
      raise UserError("--chat: this run is an encoder-decoder model: give --source")
    if FLAGS.prompt is not None or FLAGS.prompt_ids is not None:
      raise UserError(
          "this run is an encoder-decoder model: --prompt/--prompt_ids are a decoder-only "
          "model's; give only --source or --source_ids"
      )
    source = _input_ids(tok, "source", "source_ids")
    if tok is not None and tok.bos_id is not None and tok.eos_id is not None:
      start_end = tok.bos_id, tok.eos_id
    else:  # a converted model without tokenizer files: its config.json's ids
      start_end = Run(FLAGS.workdir).hf_start_and_end_ids()
    if start_end is None:
      raise UserError(
          "translation needs start and end ids: the run's tokenizer has no bos/eos and it was "
          "not converted from a config.json with decoder_start_token_id and eos_token_id"
      )
    if FLAGS.stop_ids is not None:
      raise UserError("--stop_ids: the encoder-decoder stops at the tokenizer's eos")
    beam = FLAGS.beam_size if FLAGS.beam_size is not None else (0 if sampling_flags else 4)
    new = FLAGS.max_new_tokens if FLAGS["max_new_tokens"].present else None
    forced = Run(FLAGS.workdir).hf_forced_eos_id() if tok is None else None
    out = decode.translate(
        cfg, params, [source], *start_end, new, beam_size=beam, forced_eos_id=forced, **common
    )
  else:
    raise UserError(
        f"a model.family={cfg.family} model does not generate text: use a "
        "decoder or encoder_decoder run"
    )
  asked = (
      FLAGS.max_new_tokens if FLAGS["max_new_tokens"].present or cfg.family == "decoder" else None
  )
  if asked is not None and out.max_new_tokens < asked:
    print(
        f"note: max_new_tokens lowered to {out.max_new_tokens}: model.max_len={cfg.max_len} "
        "positions",
        file=sys.stderr,
    )
  ids = out.ids()[0]
  if FLAGS.print_ids or tok is None:
    print(",".join(map(str, ids)))
  elif FLAGS.chat is not None:  # the reply alone
    print(tok.decode(ids))
  elif cfg.family == "decoder":
    print((FLAGS.prompt if FLAGS.prompt is not None else tok.decode(prompt)) + tok.decode(ids))
  else:
    print(tok.decode(ids))


if __name__ == "__main__":
  cli.run(main)
