"""Chat templates and conversations as token ids with a loss mask (the `sft` objective and
`generate --chat`).

A checkpoint's chat template is Jinja text, kept beside its tokenizer (chat_template.jinja, or the
`chat_template` of tokenizer_config.json). It is rendered as transformers renders it: jinja2's
immutable sandbox (a template from the hub cannot reach Python objects or change its inputs),
`trim_blocks` and `lstrip_blocks`, loop controls, `raise_exception(message)`, `strftime_now`, a
`tojson` that keeps non-ASCII text, and the special tokens of tokenizer_config.json (`bos_token`,
`eos_token` ...) as variables. `{% generation %}` blocks render their body.

Which tokens a conversation trains on: each assistant turn's text is what rendering the turns
before it with the generation prompt leaves to the rendering that includes it, so a template
that renders a conversation turn by turn (as every template people generate with must) marks
exactly the assistant's words and its end-of-turn tokens, not the role headers. A token is in
the loss when its first character lies in such a span.

Bad rows raise ChatRowError (a DataError) saying what is wrong; the objective adds the line.
"""

from __future__ import annotations

import datetime
import json
import pathlib
from collections.abc import Sequence

import numpy as np

from transformers_jax.data.errors import DataError

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
# the folders a template is looked for in, inside a run or model folder (a run keeps a converted
# model's files in hf_files/)
SEARCHED = ("hf_files", ".")
ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatRowError(DataError):
  """A conversation that cannot be trained on: `problem` says why; `row` is its JSON text (the
  objective finds its line number from it)."""

  def __init__(self, problem: str, row: str = ""):
    super().__init__(problem, row)
    self.problem, self.row = problem, row

  def __str__(self) -> str:
    return self.problem


def _jinja():
  try:
    import jinja2
    from jinja2 import ext, nodes, sandbox
  except ImportError:
    raise DataError(
        "chat templates are rendered with jinja2, which is not installed: pip install -e "
        "'.[chat]'"
    ) from None

  class Generation(ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' marker of assistant text):
    renders its body."""

    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  return jinja2, sandbox, ext, Generation


def _raise_exception(message):
  raise ChatRowError(f"the chat template refuses the row ({message}): fix the row or the template")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  """Jinja's tojson as transformers defines it for chat templates: no HTML escaping, non-ASCII
  text kept."""
  return json.dumps(
      x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
  )


def _token_text(value) -> str | None:
  """A special token of tokenizer_config.json: a string, or {"content": ...}."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


class ChatTemplate:
  """A chat template, compiled once: `render(messages, add_generation_prompt)`."""

  def __init__(self, source: str, special_tokens: dict | None = None, where: str = "template"):
    jinja2, sandbox, ext, generation = _jinja()
    env = sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols, generation]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    self.source, self.where = source, where
    self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
    try:
      self.template = env.from_string(source)
    except jinja2.TemplateError as e:
      raise DataError(
          f"{where}: the chat template is not valid Jinja ({e}): fix or replace it"
      ) from None

  @property
  def end_of_turn(self) -> str | None:
    """The text that ends a turn (tokenizer_config.json's eos_token): where --chat stops."""
    return self.special_tokens.get("eos_token")

  def render(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
    import jinja2

    try:
      return self.template.render(
          messages=list(messages),
          add_generation_prompt=add_generation_prompt,
          **self.special_tokens,
      )
    except ChatRowError:
      raise
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as e:
      raise ChatRowError(
          f"the chat template fails to render the row ({type(e).__name__}: {e}): fix the row "
          "or the template"
      ) from None

  def to_spec(self) -> dict:
    return {"template": self.source, "special_tokens": self.special_tokens, "where": self.where}


def find_template(*folders) -> ChatTemplate | None:
  """The chat template kept in the first of `folders` (run or model folders) that has one:
  chat_template.jinja, else tokenizer_config.json's chat_template (a list of named templates:
  the one named "default"), in the folder's hf_files/ or the folder itself; None if none has."""
  for folder in folders:
    if not folder:
      continue
    for sub in SEARCHED:
      where = pathlib.Path(folder) / sub
      found = read_template(where)
      if found is not None:
        return found
  return None


def read_template(folder: pathlib.Path) -> ChatTemplate | None:
  """The chat template in `folder` (see find_template), or None."""
  config, special = {}, {}
  if (folder / TOKENIZER_CONFIG).is_file():
    try:
      config = json.loads((folder / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
    except ValueError as e:
      raise DataError(
          f"{folder / TOKENIZER_CONFIG} is not JSON ({e}): re-save the tokenizer"
      ) from None
    config = config if isinstance(config, dict) else {}
    special = {k: _token_text(v) for k, v in config.items() if k.endswith("_token")}
  if (folder / TEMPLATE_FILE).is_file():
    text = (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
    return ChatTemplate(text, special, str(folder / TEMPLATE_FILE))
  source = config.get("chat_template")
  if isinstance(source, list):  # [{"name": ..., "template": ...}]
    named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
    source = named.get("default")
  if isinstance(source, str):
    return ChatTemplate(source, special, str(folder / TOKENIZER_CONFIG))
  return None


def conversation(row) -> list[dict]:
  """The messages of a row: {"messages": [{"role", "content"}, ...]}, or {"prompt",
  "completion"} (texts: a user turn and the assistant's answer; or lists of messages)."""
  if isinstance(row, dict) and "messages" in row:
    messages = row["messages"]
  elif isinstance(row, dict) and "prompt" in row and "completion" in row:
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, str):
      prompt = [{"role": "user", "content": prompt}]
    if isinstance(completion, str):
      completion = [{"role": "assistant", "content": completion}]
    messages = (prompt if isinstance(prompt, list) else [None]) + (
        completion if isinstance(completion, list) else [None]
    )
  else:
    keys = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
    raise ChatRowError(
        f'the row has neither "messages" nor "prompt" and "completion" (it has '
        f'{keys or "nothing"}): write one of those forms'
    )
  if not isinstance(messages, list) or not messages:
    raise ChatRowError('"messages" is not a non-empty list of {"role", "content"} objects: fix it')
  for i, m in enumerate(messages):
    if not (isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m):
      raise ChatRowError(f'message {i} is not a {{"role": ..., "content": ...}} object: fix it')
    if m["role"] not in ROLES:
      raise ChatRowError(
          f"message {i} has the role {m['role']!r}, which chat templates do not know: use "
          f"{', '.join(ROLES)}"
      )
  if not any(m["role"] == "assistant" for m in messages):
    raise ChatRowError(
        "the row has no assistant turn, so nothing of it would be trained on: add the answer "
        "as a message with the role assistant, or remove the row"
    )
  return messages


def assistant_spans(template: ChatTemplate, messages: list[dict]) -> tuple[str, list[tuple]]:
  """(the rendered conversation, [(start, end) character span of each assistant turn])."""
  text = template.render(messages)
  spans = []
  for i, m in enumerate(messages):
    if m["role"] != "assistant":
      continue
    before = template.render(messages[:i], add_generation_prompt=True) if i else ""
    through = template.render(messages[: i + 1])
    if not (through.startswith(before) and text.startswith(through)):
      raise ChatRowError(
          f"the chat template does not render it turn by turn (turn {i} changes what comes "
          "before it), so the assistant's tokens cannot be told apart: use a template whose "
          "rendering of a conversation starts with that of its first turns"
      )
    spans.append((len(before), len(through)))
  return text, spans


def encode_conversation(tok, template: ChatTemplate, messages) -> tuple[list, list]:
  """(token ids, 1 where the token is the assistant's) of a conversation."""
  text, spans = assistant_spans(template, messages)
  hf = getattr(tok, "hf", None)
  if hf is not None:  # a Hugging Face tokenizer: character offsets of the whole text's tokens
    encoding = hf.encode(text, add_special_tokens=False)
    ids = list(encoding.ids)
    starts = np.asarray([a for a, _ in encoding.offsets], np.int64)
    mask = np.zeros(len(ids), bool)
    for a, b in spans:
      mask |= (starts >= a) & (starts < b)
    return ids, mask.astype(int).tolist()
  ids, mask, cut = [], [], 0  # the byte tokenizer: each piece on its own (the same bytes)
  for a, b in spans:
    for piece, flag in ((text[cut:a], 0), (text[a:b], 1)):
      piece_ids = tok.encode(piece)
      ids += piece_ids
      mask += [flag] * len(piece_ids)
    cut = b
  tail = tok.encode(text[cut:])
  return ids + tail, mask + [0] * len(tail)


def decode_ids(encoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(token ids, loss mask) of ChatTokenizer's ids."""
  encoded = np.asarray(encoded)
  return encoded // 2, encoded % 2


def chat_prompt(tok, template: ChatTemplate, text: str) -> list[int]:
  """The ids of a user turn `text` rendered with the generation prompt (generate --chat)."""
  rendered = template.render([{"role": "user", "content": text}], add_generation_prompt=True)
  hf = getattr(tok, "hf", None)
  return list(hf.encode(rendered, add_special_tokens=False).ids) if hf else tok.encode(rendered)
