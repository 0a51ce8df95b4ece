"""One objective per family, with its data: what a batch holds and how its loss is computed.

  lm        decoder-only    next-token prediction on text
  mlm       encoder (mlm)   masked LM: 15% of tokens chosen, 80/10/10 mask/random/keep
  classify  encoder (classifier) or vit: one label per sequence or image
  seq2seq   encoder_decoder teacher forcing; padding masked out of loss and attention

Batches are numpy dicts, a pure function of (seed, step), global (every process builds the same
batch and keeps its own rows). Losses return sums so that micro-batches add up exactly.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformers_jax import data as D

BUNDLED = {"lm": "corpus", "mlm": "corpus", "classify_text": "corpus_kind",
           "seq2seq": "numbers", "classify_image": "digits"}


def task_name(model_cfg) -> str:
  if model_cfg.family == "decoder":
    return "lm"
  if model_cfg.family == "encoder_decoder":
    return "seq2seq"
  if model_cfg.family == "vit":
    if model_cfg.head_kind != "classifier":
      raise ValueError("model.head: training a ViT needs head=classifier")
    return "classify_image"
  if model_cfg.head_kind == "mlm":
    return "mlm"
  if model_cfg.head_kind == "classifier":
    return "classify_text"
  raise ValueError("model.head=pooler has no training objective: use head=mlm (pre-training) "
                   "or head=classifier (fine-tuning)")


@dataclasses.dataclass
class Task:
  name: str
  train_batch: Callable[[int], dict]  # step -> global numpy batch
  eval_batches: list  # fixed held-out batches
  tokenizer: D.Tokenizer | None
  tokens_per_example: int
  summary: str


# ----------------------------------------------------------------------------- losses
def cross_entropy(logits, targets, weights, label_smoothing: float = 0.0,
                  num_classes: int | None = None) -> dict:
  """Sums over weighted positions: smoothed loss, plain nll, correct predictions, weight.

  Written as reductions over the class axis (log-sum-exp, a one-hot product) rather than a
  gather, so logits split over the vocabulary (`tensor`) are never gathered whole.
  `num_classes`: the real classes when the last axis is padded (padded logits are masked by
  the model); label smoothing spreads over the real ones only.
  """
  logits = logits.astype(jnp.float32)
  n = logits.shape[-1]
  lse = jax.nn.logsumexp(logits, axis=-1)
  one_hot = jax.nn.one_hot(targets, n, dtype=jnp.float32)
  nll = lse - jnp.sum(logits * one_hot, axis=-1)
  loss = nll
  if label_smoothing:
    real = num_classes or n
    mean_logit = (jnp.sum(logits * (jnp.arange(n) < real), axis=-1) / real if real < n
                  else jnp.mean(logits, axis=-1))
    loss = (1.0 - label_smoothing) * nll - label_smoothing * (mean_logit - lse)
  w = weights.astype(jnp.float32)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return {"loss": jnp.sum(loss * w), "nll": jnp.sum(nll * w), "correct": jnp.sum(correct * w),
          "weight": jnp.sum(w)}


def model_outputs(task: str, model, variables, batch, rngs, mutable):
  """Run the model on a batch of `task`; returns ((logits, targets, weights), state)."""
  if task == "lm":
    tokens = batch["tokens"]
    out, state = model.apply(variables, tokens[:, :-1], rngs=rngs, mutable=mutable)
    w = batch.get("weights", jnp.ones(tokens[:, 1:].shape, jnp.float32))
    return (out["logits"], tokens[:, 1:], w), state
  if task == "mlm":
    out, state = model.apply(variables, batch["inputs"], rngs=rngs, mutable=mutable)
    return (out["logits"], batch["labels"], batch["weights"]), state
  if task == "classify_text":
    out, state = model.apply(variables, batch["tokens"], batch["attention_mask"], rngs=rngs,
                             mutable=mutable)
    return (out["logits"], batch["labels"], batch["weights"]), state
  if task == "seq2seq":
    out, state = model.apply(variables, batch["src"], batch["tgt_in"], batch["src_mask"],
                             batch["tgt_mask"], rngs=rngs, mutable=mutable)
    w = batch["tgt_mask"].astype(jnp.float32)
    if "weights" in batch:
      w = w * batch["weights"][:, None]
    return (out["logits"], batch["tgt_out"], w), state
  if task == "classify_image":
    out, state = model.apply(variables, batch["images"], rngs=rngs, mutable=mutable)
    return (out["logits"], batch["labels"], batch["weights"]), state
  raise ValueError(f"unknown task {task}")


# ----------------------------------------------------------------------------- data
def _vocab_check(tokenizer, model_cfg):
  if tokenizer.vocab_size > model_cfg.vocab_size:
    raise ValueError(
        f"model.vocab_size={model_cfg.vocab_size} is smaller than the {tokenizer.kind} "
        f"tokenizer's {tokenizer.vocab_size} ids: set --config.model.vocab_size="
        f"{tokenizer.vocab_size}")


def _tokenizer(config, model_cfg, workdir: pathlib.Path, texts, specials: bool):
  path = workdir / "tokenizer.json"
  workdir.mkdir(parents=True, exist_ok=True)
  if path.exists():
    tok = D.load_tokenizer(path)
  elif config.data.tokenizer not in ("byte", "bpe"):  # a saved tokenizer, e.g. a converted one
    if not pathlib.Path(config.data.tokenizer).is_file():
      raise D.DataError(f"data.tokenizer={config.data.tokenizer!r} is neither 'byte', 'bpe' nor "
                        "a tokenizer file: pass one of those")
    tok = D.load_tokenizer(config.data.tokenizer)
    tok.save(path)
  else:
    kind = config.data.tokenizer
    tok = D.make_tokenizer(kind, model_cfg.vocab_size, texts=texts if kind == "bpe" else None,
                           specials=specials)
    tok.save(path)
  _vocab_check(tok, model_cfg)
  return tok


def _split_rows(n: int, path: str) -> tuple[list[int], list[int]]:
  """(training rows, validation rows) of a user's n-row file: every 20th row is held out, or
  the last one when there are fewer than 20; no row is in both."""
  if n < 2:
    raise D.DataError(f"data.path '{path}' holds {n} example(s): give at least 2, one of which "
                      "is held out for validation")
  val = [i for i in range(n) if i % 20 == 19] or [n - 1]
  held = set(val)
  return [i for i in range(n) if i not in held], val


def _text_docs(config):
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


def _token_arrays(config, model_cfg, workdir, specials):
  train_docs, val_docs = _text_docs(config)
  texts = [t for _, t in train_docs]
  tok = _tokenizer(config, model_cfg, workdir, texts, specials)
  cache = pathlib.Path(config.data.cache_dir or workdir / "data")
  cache.mkdir(parents=True, exist_ok=True)
  name = "user" if config.data.path else "corpus"
  train = D.prepare_tokens(texts, tok, cache / f"{name}-{tok.kind}-train.tokens",
                           model_cfg.vocab_size)
  val = D.prepare_tokens([t for _, t in val_docs], tok,
                         cache / f"{name}-{tok.kind}-validation.tokens", model_cfg.vocab_size)
  summary = (f"{name} text: {len(train_docs)} train / {len(val_docs)} validation documents, "
             f"{len(train):,} / {len(val):,} {tok.kind} tokens")
  return tok, train, val, summary


def _lm_task(config, model_cfg, workdir):
  tok, train, val, summary = _token_arrays(config, model_cfg, workdir, specials=False)
  train_b, val_b = D.LMBatches(train), D.LMBatches(val)
  B, T, seed = config.batch_size, config.seq_len, config.seed
  evals = [{"tokens": x} for x in val_b.eval_batches(B, T, config.eval_batches)]
  return Task("lm", lambda step: {"tokens": train_b.batch(step, B, T, seed)}, evals, tok, T,
              summary)


def _mlm_task(config, model_cfg, workdir):
  tok, train, val, summary = _token_arrays(config, model_cfg, workdir, specials=True)
  if tok.mask_id is None:
    raise ValueError("data.tokenizer: masked LM needs a [MASK] token; use byte or bpe")
  train_b, val_b = D.LMBatches(train), D.LMBatches(val)
  B, T, seed = config.batch_size, config.seq_len, config.seed
  p = config.data.mlm_probability

  def masked(tokens, rng):
    inputs, labels, weights = D.mask_tokens(tokens, rng, tok.vocab_size, tok.mask_id,
                                            tok.special_ids, p)
    return {"inputs": inputs, "labels": labels, "weights": weights}

  def train_batch(step):
    return masked(train_b.batch(step, B, T, seed)[:, :T], np.random.default_rng([seed, step, 1]))

  evals = [masked(x[:, :T], np.random.default_rng([seed, i, 2]))
           for i, x in enumerate(val_b.eval_batches(B, T, config.eval_batches))]
  return Task("mlm", train_batch, evals, tok, T, summary)


def _classify_text_task(config, model_cfg, workdir):
  """Bundled: is a window of text Python source (0) or pydoc documentation (1)?
  User: a TSV of `text<TAB>label` with integer labels."""
  B, T, seed = config.batch_size, config.seq_len, config.seed
  if config.data.path:
    rows = D.load_tsv_pairs(config.data.path)
    try:
      labelled = [(text, int(label)) for text, label in rows]
    except ValueError:
      raise D.DataError(f"data.path '{config.data.path}': labels must be integers "
                        "(text<TAB>label per line)") from None
    train_idx, val_idx = _split_rows(len(labelled), config.data.path)
    docs_train = [labelled[i] for i in train_idx]
    docs_val = [labelled[i] for i in val_idx]
    summary = f"{len(labelled)} labelled texts from {config.data.path}"
  else:
    corpus = D.build_corpus(config.data.max_bytes)
    docs_train = [(t, int(n.startswith("pydoc/"))) for n, t in corpus.train_docs]
    docs_val = [(t, int(n.startswith("pydoc/"))) for n, t in corpus.val_docs]
    summary = ("corpus_kind: Python source (0) vs pydoc text (1), "
               f"{len(docs_train)} train / {len(docs_val)} validation documents")
  texts = [t for t, _ in docs_train]
  tok = _tokenizer(config, model_cfg, workdir, texts, specials=True)
  labels = sorted({y for _, y in docs_train + docs_val})
  if labels[0] < 0 or labels[-1] >= model_cfg.num_classes:
    raise D.DataError(f"labels span {labels[0]}..{labels[-1]} but model.num_classes="
                      f"{model_cfg.num_classes}: set --config.model.num_classes")

  def encode(texts_and_labels, rng):
    tokens = np.full((len(texts_and_labels), T), tok.pad_id, np.int32)
    for i, (text, _) in enumerate(texts_and_labels):
      ids = tok.encode(text)
      start = int(rng.integers(0, max(1, len(ids) - (T - 1)))) if rng is not None else 0
      window = [tok.cls_id, *ids[start:start + T - 1]]
      tokens[i, :len(window)] = window
    return {"tokens": tokens, "attention_mask": (tokens != tok.pad_id).astype(np.int32),
            "labels": np.array([y for _, y in texts_and_labels], np.int32),
            "weights": np.ones(len(texts_and_labels), np.float32)}

  by_label = {y: [d for d in docs_train if d[1] == y] for y in labels}
  by_label = {y: ds for y, ds in by_label.items() if ds}

  def train_batch(step):
    rng = np.random.default_rng([seed, step])
    ys = rng.choice(sorted(by_label), size=B)
    picks = [by_label[y][rng.integers(len(by_label[y]))] for y in ys]
    return encode(picks, rng)

  rng = np.random.default_rng([seed, 10**6])
  val = [docs_val[i % len(docs_val)] for i in range(B * config.eval_batches)]
  evals = [encode(val[i:i + B], rng) for i in range(0, len(val), B)]
  return Task("classify_text", train_batch, evals, tok, T, summary)


def _seq2seq_task(config, model_cfg, workdir):
  B, T, seed = config.batch_size, config.seq_len, config.seed
  if config.data.path:
    rows = D.load_tsv_pairs(config.data.path)
    texts = [s for s, _ in rows] + [t for _, t in rows]
    tok = _tokenizer(config, model_cfg, workdir, texts, specials=True)
    names = [f"'{config.data.path}' pair {i + 1}" for i in range(len(rows))]
    train_idx, val_idx = _split_rows(len(rows), config.data.path)
    train = D.PairBatches([rows[i] for i in train_idx], tok, T, T, [names[i] for i in train_idx])
    val = D.PairBatches([rows[i] for i in val_idx], tok, T, T, [names[i] for i in val_idx])
    summary = f"{len(rows)} pairs from {config.data.path}"
    batch = lambda step: train.batch(step, B, seed)  # noqa: E731
  else:
    pairs = D.NumberPairs(config.data.direction, config.data.max_number)
    tok = _tokenizer(config, model_cfg, workdir, None, specials=True)
    val = pairs.validation(B * config.eval_batches, tok, T, T)
    summary = (f"numbers {config.data.direction} up to {config.data.max_number:,}, "
               f"{len(val)} held-out pairs")
    batch = lambda step: pairs.batch(step, B, T, T, seed, tok)  # noqa: E731
  return Task("seq2seq", batch, val.eval_batches(B), tok, T, summary)


def _classify_image_task(config, model_cfg, workdir):
  B, seed = config.batch_size, config.seed
  if config.data.path:
    images, labels = D.load_npz(config.data.path, model_cfg.num_classes)
    if images.ndim == 3:
      images = images[..., None]
    order = np.random.default_rng(0).permutation(len(labels))
    cut = max(1, len(labels) // 10)
    val_idx, train_idx = order[:cut], order[cut:]
    train = (images[train_idx], labels[train_idx])
    val = (images[val_idx], labels[val_idx])
    summary = f"{len(labels)} images from {config.data.path}"
  else:
    train, val = D.digits_dataset("train"), D.digits_dataset("validation")
    summary = f"sklearn digits: {len(train[1])} train / {len(val[1])} validation images"
  expected = (model_cfg.image_size, model_cfg.image_size, model_cfg.num_channels)
  if tuple(train[0].shape[1:]) != expected:
    raise D.DataError(f"images are {tuple(train[0].shape[1:])} but the model expects {expected}: "
                      "set model.image_size / model.num_channels to match")
  if int(train[1].max()) >= model_cfg.num_classes:
    raise D.DataError(f"labels reach {int(train[1].max())} but model.num_classes="
                      f"{model_cfg.num_classes}: raise model.num_classes")
  train_b, val_b = D.ImageBatches(*train), D.ImageBatches(*val)

  def train_batch(step):
    b = train_b.batch(step, B, seed)
    return {**b, "weights": np.ones(B, np.float32)}

  return Task("classify_image", train_batch, val_b.eval_batches(B)[:config.eval_batches], None,
              model_cfg.seq_len_max, summary)


BUILDERS = {"lm": _lm_task, "mlm": _mlm_task, "classify_text": _classify_text_task,
            "seq2seq": _seq2seq_task, "classify_image": _classify_image_task}


def build_task(config, model_cfg, workdir) -> Task:
  name = task_name(model_cfg)
  bundled = config.data.name or BUNDLED[name]
  if bundled != BUNDLED[name]:
    raise ValueError(f"data.name={config.data.name!r}: the {name} objective's bundled data is "
                     f"{BUNDLED[name]!r}; for other data set --config.data.path")
  return BUILDERS[name](config, model_cfg, pathlib.Path(workdir))
