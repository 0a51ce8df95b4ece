"""Data helpers the text tasks share: the run's tokenizer, documents of the bundled corpus or a
user's text, token files, and the train / validation split of a user's rows."""

from __future__ import annotations

import pathlib

from transformers_jax import data as D


def vocab_check(tokenizer, model_cfg):
  if tokenizer.vocab_size > model_cfg.vocab_size:
    raise ValueError(
        f"model.vocab_size={model_cfg.vocab_size} is smaller than the {tokenizer.kind} "
        f"tokenizer's {tokenizer.vocab_size} ids: set --config.model.vocab_size="
        f"{tokenizer.vocab_size}"
    )


def run_tokenizer(config, model_cfg, workdir: pathlib.Path, texts, specials: bool):
  path = workdir / "tokenizer.json"
  workdir.mkdir(parents=True, exist_ok=True)
  if path.exists():
    tok = D.load_tokenizer(path)
  elif config.data.tokenizer not in ("byte", "bpe"):  # a saved tokenizer, e.g. a converted one
    if not pathlib.Path(config.data.tokenizer).is_file():
      raise D.DataError(
          f"data.tokenizer={config.data.tokenizer!r} is neither 'byte', 'bpe' nor "
          "a tokenizer file: pass one of those"
      )
    tok = D.load_tokenizer(config.data.tokenizer)
    tok.save(path)
  else:
    kind = config.data.tokenizer
    tok = D.make_tokenizer(
        kind, model_cfg.vocab_size, texts=texts if kind == "bpe" else None, specials=specials
    )
    tok.save(path)
  vocab_check(tok, model_cfg)
  return tok


def split_rows(n: int, path: str) -> tuple[list[int], list[int]]:
  """(training rows, validation rows) of a user's n-row file: every 20th row is held out, or
  the last one when there are fewer than 20; no row is in both."""
  if n < 2:
    raise D.DataError(
        f"data.path '{path}' holds {n} example(s): give at least 2, one of which "
        "is held out for validation"
    )
  val = [i for i in range(n) if i % 20 == 19] or [n - 1]
  held = set(val)
  return [i for i in range(n) if i not in held], val


def text_docs(config):
  """(train docs, validation docs) of the bundled corpus or the user's .txt path."""
  if config.data.path:
    docs = D.read_text_path(config.data.path)
    val = [d for d in docs if D.corpus.is_validation_name(d[0], 0.05)]
    train = [d for d in docs if not D.corpus.is_validation_name(d[0], 0.05)]
    if not train or not val:  # too few files to split by file: hold out each file's tail
      cut = [(n, t, int(len(t) * 0.95)) for n, t in docs]
      train = [(n, t[:c]) for n, t, c in cut]
      val = [(n, t[c:]) for n, t, c in cut]
    return train, val
  corpus = D.build_corpus(config.data.max_bytes)
  return list(corpus.train_docs), list(corpus.val_docs)


def token_arrays(config, model_cfg, workdir, specials):
  train_docs, val_docs = text_docs(config)
  texts = [t for _, t in train_docs]
  tok = run_tokenizer(config, model_cfg, workdir, texts, specials)
  cache = pathlib.Path(config.data.cache_dir or workdir / "data")
  cache.mkdir(parents=True, exist_ok=True)
  name = "user" if config.data.path else "corpus"
  train = D.prepare_tokens(
      texts, tok, cache / f"{name}-{tok.kind}-train.tokens", model_cfg.vocab_size
  )
  val = D.prepare_tokens(
      [t for _, t in val_docs],
      tok,
      cache / f"{name}-{tok.kind}-validation.tokens",
      model_cfg.vocab_size,
  )
  summary = (
      f"{name} text: {len(train_docs)} train / {len(val_docs)} validation documents, "
      f"{len(train):,} / {len(val):,} {tok.kind} tokens"
  )
  return tok, train, val, summary
