"""Supervised fine-tuning on conversations (`--config.task=sft`): a decoder learns the assistant's
turns of chat transcripts, rendered by the model's own chat template (data/chat.py).

data.path holds JSONL rows `{"messages": [{"role": ..., "content": ...}, ...]}` (or
`{"prompt": ..., "completion": ...}`). Each row is rendered by the run's chat template and
tokenized once into the token cache (data/token_cache.py), which keeps each token's id and
whether it is the assistant's (2 * id + 1 if so; data.chat.ChatTokenizer). Rows are always
packed: whole conversations side by side with segment ids, no attention or target across two
of them, a conversation longer than a row cut into row-long pieces. The loss is next-token
cross-entropy on the assistant's tokens only; the metrics give the fraction of the rows' tokens
it covers (`loss_fraction`).

The chat template: `sft.chat_template` (a .jinja file, or a folder holding one or a
tokenizer_config.json with a chat_template), else the one kept beside the run's tokenizer (a
converted model's hf_files/, found from data.tokenizer or init_from). The run keeps it in its
hf_files/, where `generate --chat` and `convert --to_hf` find it.
"""

from __future__ import annotations

import pathlib
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformers_jax.data import pipeline, sources
from transformers_jax.data.chat import (
    TEMPLATE_FILE,
    TOKENIZER_CONFIG,
    ChatRowError,
    ChatTemplate,
    chat_prompt,
    decode_ids,
    find_template,
)
from transformers_jax.data.errors import DataError
from transformers_jax.data.token_cache import build_cache
from transformers_jax.data.tokenizers import ChatTokenizer
from transformers_jax.tasks.base import TaskData
from transformers_jax.tasks.lm import LanguageModeling, generate_sample
from transformers_jax.tasks.text_data import run_tokenizer


class ChatRows(pipeline.RowLayout):
  """Packed rows of conversations: tokens [rows, seq_len + 1], segment_ids, positions and
  weights [rows, seq_len]; a target is weighted where it is the assistant's token of the same
  conversation."""

  overlap = 1

  def window(self, seq_len):
    return seq_len + 1

  def finish(self, tokens, segments, positions, seed, step, rows):
    ids, assistant = decode_ids(tokens)
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    return {
        "tokens": ids.astype(np.int32),
        "segment_ids": segments[:, :-1],
        "positions": positions[:, :-1],
        "weights": (same & (assistant[:, 1:] == 1)).astype(np.float32),
    }


class SupervisedFineTuning(LanguageModeling):
  name = "sft"
  summary = "supervised fine-tuning on chat JSONL: the chat template's text, loss on the assistant"
  bundled_data = ""
  packs = "conversations"
  reads_fields = ("data.path",)

  def config_defaults(self):
    c = ml_collections.ConfigDict()
    # sft: the chat template (a .jinja file, or a folder with one or with a tokenizer_config.json
    # holding it); "" = the one kept beside the run's tokenizer (data.tokenizer, init_from)
    c.chat_template = ""
    return c

  def check(self, config, model_cfg) -> None:
    super().check(config, model_cfg)
    if not config.data.path:
      raise ValueError(
          "data.path='': task=sft trains on conversations: set --config.data.path to a .jsonl "
          'file of {"messages": [{"role": ..., "content": ...}, ...]} rows'
      )
    if config.data.tokenizer == "bpe":
      raise ValueError(
          "data.tokenizer='bpe': a tokenizer trained on the conversations would not know the "
          "chat template's tokens: give the model's (e.g. --config.data.tokenizer="
          "RUN/tokenizer.json of a converted model)"
      )

  def batch_shapes(self, model_cfg, config):
    B, T = config.batch_size, config.seq_len
    return {
        "tokens": ((B, T + 1), np.int32),
        "segment_ids": ((B, T), np.int32),
        "positions": ((B, T), np.int32),
        "weights": ((B, T), np.float32),
    }

  def loss(self, outputs, batch, model_cfg, options, z_loss=0.0, train=True) -> dict:
    sums = super().loss(outputs, batch, model_cfg, options, z_loss, train)
    sums["tokens"] = jnp.sum((batch["segment_ids"] > 0).astype(jnp.float32))
    return sums

  def metrics(self, sums, weight) -> dict:
    return {
        **super().metrics(sums, weight),
        "loss_fraction": sums["weight"] / jnp.maximum(sums["tokens"], 1.0),
    }

  def eval_summary(self, data, totals) -> dict:
    out = super().eval_summary(data, totals)
    out["eval_loss_fraction"] = float(totals["weight"]) / max(float(totals["tokens"]), 1.0)
    return out

  def data(self, config, model_cfg, workdir):
    workdir = pathlib.Path(workdir)
    split = config.data.get("split", "train")
    files = sources.list_files(config.data.path, split)
    others = [f.name for f in files if f.suffix != ".jsonl"]
    if others:
      raise DataError(
          f"data.path '{config.data.path}' holds {others[0]}: task=sft reads conversations "
          'from .jsonl files ({"messages": [...]} or {"prompt", "completion"} per line)'
      )
    tok = run_tokenizer(config, model_cfg, workdir, None, specials=False)
    template = run_template(config, workdir)
    chat = ChatTokenizer(tok, template)
    root = pathlib.Path(config.data.cache_dir or workdir / "data") / "token_cache"
    try:
      cache = build_cache(
          config.data.path,
          chat,
          root,
          2 * model_cfg.vocab_size,
          workers=config.data.tokenize_workers or 1,
          text_field=sources.WHOLE_ROW,
          split=split,
      )
    except ChatRowError as e:
      raise DataError(_located(files, e)) from None
    train_spans, val_spans = pipeline.split_spans(cache)
    common = dict(
        layout=ChatRows(),
        batch_size=config.batch_size,
        seq_len=config.seq_len,
        seed=config.seed,
        packing=True,
        pad_id=chat.pad_id or 0,
    )
    train = pipeline.TokenSpans(cache, train_spans)
    whole = pipeline.StepBatches(train, **common)
    local = pipeline.StepBatches(
        train, process_index=jax.process_index(), process_count=jax.process_count(), **common
    )
    held = pipeline.StepBatches(
        pipeline.TokenSpans(cache, val_spans), **{**common, "seed": config.seed + 1}
    )
    evals = pipeline.packed_eval_rows(held, config.eval_batches)
    share = sum(float(b["weights"].sum()) for b in evals) / max(
        sum(float((b["segment_ids"] > 0).sum()) for b in evals), 1.0
    )
    summary = (
        f"{config.data.path}: {cache.num_tokens:,} tokens of conversations rendered by the chat "
        f"template of {template.where} ({len(cache.shards)} shards, {cache.folder}); packed; "
        f"{share:.0%} of the held-out tokens are the assistant's"
    )

    def rows(step, start, stop):  # rows [start, stop) of the global batch, built alone
      drawn = [
          train.packed_row(np.random.default_rng([config.seed, step, r]), *whole_shape)
          for r in range(start, stop)
      ]
      tokens, segments, positions = (np.stack(x) for x in zip(*drawn))
      return whole.finish(tokens, segments, positions, step, range(start, stop))

    whole_shape = (whole.length, whole.pad_id, whole.stride)
    data = TaskData(whole, evals, tok, summary, train_rows=rows)
    data.train_stream = lambda start, end: pipeline.batch_stream(
        local, start, end, config.data.workers, config.data.prefetch
    )
    data.source = f"{config.data.path} (token cache {cache.folder.name})"
    data.chat_template = template
    return data

  def sample(self, data, model_cfg, params, config):
    """The config's sample prompt as a user turn, answered with the KV cache."""
    tok, template = data.tokenizer, data.chat_template
    prompt = chat_prompt(tok, template, config.sample.prompt)[-model_cfg.max_len :]
    stop = end_of_turn_ids(tok, template)
    out = generate_sample(model_cfg, params, config, prompt, stop_tokens=stop)
    return f"user: {config.sample.prompt}\nassistant: {tok.decode(out.ids()[0])}"


def end_of_turn_ids(tok, template: ChatTemplate) -> list[int]:
  """The ids a reply ends with: the template's end-of-turn token, else the tokenizer's eos."""
  text = template.end_of_turn
  hf = getattr(tok, "hf", None)
  found = hf.token_to_id(text) if hf is not None and text else None
  if found is not None:
    return [found]
  return [tok.eos_id] if tok.eos_id is not None else []


def run_template(config, workdir: pathlib.Path) -> ChatTemplate:
  """The run's chat template (see the module docstring), kept in workdir/hf_files/."""
  given = config.get("sft", {}).get("chat_template", "")
  kept = workdir / "hf_files"
  if given:
    path = pathlib.Path(given)
    if path.is_file() and path.name != TOKENIZER_CONFIG:
      template = ChatTemplate(path.read_text(encoding="utf-8"), None, str(path))
    elif path.exists():
      template = find_template(path if path.is_dir() else path.parent)
    else:
      raise DataError(f"sft.chat_template='{given}' does not exist: give a .jinja file or folder")
    if template is None:
      raise DataError(
          f"sft.chat_template='{given}' holds no chat template (no {TEMPLATE_FILE}, no "
          f"chat_template in {TOKENIZER_CONFIG}): give the model's folder or a .jinja file"
      )
  else:
    tokenizer = pathlib.Path(config.data.tokenizer)
    beside = tokenizer.parent if tokenizer.is_file() else None
    template = find_template(workdir, beside, config.get("init_from", "") or None)
    if template is None:
      raise DataError(
          "task=sft needs a chat template, and none is kept beside the run's tokenizer "
          f"(data.tokenizer={config.data.tokenizer!r}; looked for {TEMPLATE_FILE} and "
          f"{TOKENIZER_CONFIG}'s chat_template in its folder's hf_files/): set "
          "--config.sft.chat_template=FILE.jinja, or use the tokenizer of a converted model "
          "that has one"
      )
  source = pathlib.Path(template.where)
  if source.parent.resolve() != kept.resolve():
    kept.mkdir(parents=True, exist_ok=True)
    (kept / TEMPLATE_FILE).write_text(template.source, encoding="utf-8")
    if (source.parent / TOKENIZER_CONFIG).is_file() and not (kept / TOKENIZER_CONFIG).exists():
      shutil.copy(source.parent / TOKENIZER_CONFIG, kept / TOKENIZER_CONFIG)
  return template


def _located(files, error: ChatRowError) -> str:
  """The error's message with the file and line of its row."""
  for path in files:
    with open(path, encoding="utf-8", errors="replace") as f:
      for number, line in enumerate(f, 1):
        if line.rstrip("\r\n") == error.row:
          return f"data.path '{path}' line {number}: {error.problem}"
  return f"data.path '{files[0].parent}': {error.problem}"
