"""Tokenizers: raw UTF-8 bytes, or byte-level BPE trained locally.

Both share one small interface (:class:`Tokenizer`) and save to JSON only.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np

from transformers_jax.data import chat
from transformers_jax.data.errors import DataError
from transformers_jax.records import write_text_atomically

BPE_SPECIALS = ("[PAD]", "[BOS]", "[EOS]", "[MASK]")


class Tokenizer:
  """Interface: ``vocab_size``, ``encode(_batch)``, ``decode``, special ids (None where absent), ``to_json``."""

  kind: str = ""
  vocab_size: int = 0
  pad_id: int | None = None
  bos_id: int | None = None
  eos_id: int | None = None
  mask_id: int | None = None

  @property
  def cls_id(self) -> int | None:
    return self.bos_id

  @property
  def sep_id(self) -> int | None:
    return self.eos_id

  @property
  def special_ids(self) -> list[int]:
    """Sorted distinct special ids."""
    ids = (self.pad_id, self.bos_id, self.eos_id, self.mask_id)
    return sorted({i for i in ids if i is not None})

  def encode(self, text: str) -> list[int]:
    raise NotImplementedError

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
    """encode_batch's ids as int64 arrays."""
    return [np.asarray(ids, dtype=np.int64) for ids in self.encode_batch(texts)]

  def decode(self, ids: Iterable[int]) -> str:
    raise NotImplementedError

  def to_json(self) -> str:
    raise NotImplementedError

  def save(self, path: str | pathlib.Path) -> None:
    write_text_atomically(path, self.to_json())  # every process of a run saves the same file


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes as ids 0..255; ``specials=True`` adds pad=256, bos=257, eos=258, mask=259."""

  kind = "byte"

  def __init__(self, specials: bool = False):
    self.specials = specials
    self.vocab_size = 260 if specials else 256
    if specials:
      self.pad_id, self.bos_id, self.eos_id, self.mask_id = 256, 257, 258, 259

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
    # the same ids, without a Python int per byte (a 4 MB corpus: 4 ms, not 120)
    return [np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int64) for t in texts]

  def decode(self, ids: Iterable[int]) -> str:
    return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

  def to_json(self) -> str:
    return json.dumps({"kind": self.kind, "specials": self.specials})


class BPETokenizer(Tokenizer):
  """Byte-level BPE from the Hugging Face ``tokenizers`` library, with [PAD] [BOS] [EOS] [MASK]."""

  kind = "bpe"

  def __init__(self, hf_tokenizer):
    self.hf = hf_tokenizer
    self.vocab_size = hf_tokenizer.get_vocab_size()
    # Our own BPE files carry [PAD]/[BOS]/[EOS]/[MASK]; a published tokenizer (e.g. GPT-2's)
    # may have none of them, which is fine for language modelling.
    self.pad_id, self.bos_id, self.eos_id, self.mask_id = (
        hf_tokenizer.token_to_id(t) for t in BPE_SPECIALS
    )
    if self.eos_id is None:
      self.eos_id = hf_tokenizer.token_to_id("<|endoftext|>")

  def encode(self, text: str) -> list[int]:
    return self.hf.encode(text).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    # the fast variant skips character offsets (same ids); older `tokenizers` lack it
    encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)
    return [e.ids for e in encode(list(texts))]

  def decode(self, ids: Iterable[int]) -> str:
    return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

  def to_json(self) -> str:
    return self.hf.to_str()


class ChatTokenizer(Tokenizer):
  """A conversation row (its JSON text) -> ids 2 * token + (1 if trained on): the token cache
  and its packing carry the loss mask in the ids themselves (data.chat.decode_ids splits
  them back)."""

  kind = "chat"

  def __init__(self, inner: Tokenizer, template: chat.ChatTemplate):
    self.inner, self.template = inner, template
    self.vocab_size = 2 * inner.vocab_size
    self.pad_id = 2 * inner.pad_id if inner.pad_id is not None else None

  def encode(self, text: str) -> list[int]:
    if not text.strip():  # the separator between documents: the template ends each turn
      return []
    try:
      row = json.loads(text)
    except ValueError as e:
      raise chat.ChatRowError(
          f"the row is not JSON ({e}): write one JSON object per line", text
      ) from None
    try:
      ids, mask = chat.encode_conversation(self.inner, self.template, chat.conversation(row))
    except chat.ChatRowError as e:
      raise chat.ChatRowError(e.problem, text) from None
    return [2 * i + m for i, m in zip(ids, mask)]

  def decode(self, ids) -> str:
    return self.inner.decode([int(i) // 2 for i in ids])

  def to_json(self) -> str:
    return json.dumps(
        {"kind": self.kind, "tokenizer": self.inner.to_json(), **self.template.to_spec()}
    )

  @classmethod
  def from_spec(cls, spec: dict) -> ChatTokenizer:
    template = chat.ChatTemplate(
        spec["template"], spec.get("special_tokens"), spec.get("where", "")
    )
    return cls(load_tokenizer_json(spec["tokenizer"]), template)


def train_bpe(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
  """Train byte-level BPE on ``texts``; the vocabulary may be smaller if the text is tiny."""
  from tokenizers import Tokenizer as HFTokenizer
  from tokenizers import decoders, models, pre_tokenizers, trainers

  if vocab_size < 256 + len(BPE_SPECIALS):
    raise DataError(
        f"BPE vocab_size {vocab_size} is below {256 + len(BPE_SPECIALS)} (256 bytes + specials): "
        "raise --config.model.vocab_size"
    )
  hf = HFTokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=list(BPE_SPECIALS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  hf.train_from_iterator(texts, trainer=trainer)
  return BPETokenizer(hf)


def load_tokenizer(path: str | pathlib.Path) -> Tokenizer:
  """Load a tokenizer saved with ``Tokenizer.save``."""
  path = pathlib.Path(path)
  try:
    return load_tokenizer_json(path.read_text(encoding="utf-8"), path)
  except (OSError, ValueError) as e:
    raise DataError(
        f"cannot read tokenizer file '{path}' ({e}): pass a JSON file written by Tokenizer.save"
    ) from e


def load_tokenizer_json(text: str, path: str | pathlib.Path = "<json>") -> Tokenizer:
  """A tokenizer from the JSON text ``Tokenizer.to_json`` wrote."""
  spec = json.loads(text)
  if isinstance(spec, dict) and spec.get("kind") == "byte":
    return ByteTokenizer(bool(spec.get("specials")))
  if isinstance(spec, dict) and spec.get("kind") == "chat":  # conversations: data/chat.py
    return ChatTokenizer.from_spec(spec)
  if isinstance(spec, dict) and "model" in spec:
    from tokenizers import Tokenizer as HFTokenizer

    return BPETokenizer(HFTokenizer.from_str(json.dumps(spec)))
  raise DataError(
      f"tokenizer file '{path}' is neither a byte nor a BPE tokenizer: pass a file written by Tokenizer.save"
  )


def make_tokenizer(
    kind: str, vocab_size: int, texts: Sequence[str] | None = None, specials: bool = False
) -> Tokenizer:
  """'byte' (``vocab_size`` must hold it) or 'bpe' (trained on ``texts``, always with specials)."""
  if kind == "byte":
    tok = ByteTokenizer(specials)
    if vocab_size < tok.vocab_size:
      raise DataError(
          f"vocab_size {vocab_size} is smaller than the byte tokenizer's {tok.vocab_size}: "
          f"set --config.model.vocab_size to at least {tok.vocab_size}"
      )
    return tok
  if kind == "bpe":
    if not texts:
      raise DataError("the BPE tokenizer needs training text: pass texts to make_tokenizer")
    return train_bpe(texts, vocab_size)
  raise DataError(f"unknown tokenizer kind {kind!r}: use 'byte' or 'bpe'")


def token_byte_lengths(tok: Tokenizer) -> list[int]:
  """UTF-8 bytes each id stands for (0 for special ids), for bits per byte."""
  special = set(tok.special_ids)
  if tok.kind == "byte":
    return [0 if i in special or i >= 256 else 1 for i in range(tok.vocab_size)]
  from tokenizers import pre_tokenizers

  alphabet = set(pre_tokenizers.ByteLevel.alphabet())  # byte-level BPE: one char per byte
  out = []
  for i in range(tok.vocab_size):
    piece = tok.hf.id_to_token(i)
    if i in special or piece is None:
      out.append(0)
    elif all(ch in alphabet for ch in piece):
      out.append(len(piece))
    else:
      out.append(len(tok.hf.decode([i]).encode("utf-8")))
  return out
