"""The lm-eval adapter: lm_eval's language-model interface (TemplateLM, a subclass of lm_eval's
LM) answered by this project's decoder-only model. Imported only once lm-eval is known to be
installed (harness.py says which extra brings it).

- loglikelihood: lm-eval splits each (context, continuation) into tokens (TemplateLM: the
  context's trailing spaces go to the continuation; an empty context is the prefix token); the
  Scorer sums the continuation's log-probabilities over context + continuation, the oldest
  tokens dropped to fit model.max_len + 1.
- loglikelihood_rolling: lm-eval's rolling windows of model.max_len tokens (each token scored
  once, with as much context as fits), summed per document.
- generate_until: greedy decoding with the KV cache (decode.generate), batched, stopped at the
  tokenizer's eos and cut at the first of the request's `until` strings.

The prefix token (what an empty context conditions on) is the tokenizer's bos, else its eos,
else a newline: the byte tokenizer of the bundled corpus has neither.
"""

from __future__ import annotations

import collections

from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM

from transformers_jax import decode
from transformers_jax.evaluate.scoring import Scorer


class JaxLM(TemplateLM):
  """lm-eval's view of a decoder-only model: `scorer` (its parameters, mesh and batch size)
  and the run's `tokenizer`; `max_gen_toks` for generation requests that do not say."""

  backend = "causal"

  def __init__(self, scorer: Scorer, tokenizer, max_gen_toks: int = 256):
    super().__init__()
    self.scorer, self.tok, self.max_gen_toks = scorer, tokenizer, max_gen_toks
    self.cfg = scorer.cfg
    newline = tokenizer.encode("\n")
    self._prefix = next(
        t
        for t in (tokenizer.bos_id, tokenizer.eos_id, newline[-1] if newline else 0)
        if t is not None
    )

  @property
  def eot_token_id(self) -> int:
    return self.tok.eos_id if self.tok.eos_id is not None else self._prefix

  @property
  def prefix_token_id(self) -> int:
    return self._prefix

  @property
  def max_length(self) -> int:
    return self.cfg.max_len

  def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
    return list(self.tok.encode(string))

  def tok_decode(self, tokens) -> str:
    return self.tok.decode(tokens)

  # ------------------------------------------------------------------ log-likelihoods
  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
    """(log-likelihood, greedy) of each ((context, continuation), context ids, continuation
    ids) request."""
    rows = [self._row(context, continuation) for _, context, continuation in requests]
    results = self.scorer.score(rows)
    for (key, _, _), result in zip(requests, results):
      if key is not None:  # rolling windows have no (context, continuation) to cache
        self.cache_hook.add_partial("loglikelihood", key, result)
    return results

  def _row(self, context: list[int], continuation: list[int]) -> tuple[list[int], int]:
    whole = (list(context) + list(continuation))[-(self.max_length + 1) :]
    return whole, min(len(continuation), len(whole) - 1)

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    windows, owner = [], []
    for i, (text,) in enumerate(request.args for request in requests):
      for context, predicted in map(
          lm_utils.make_disjoint_window,
          lm_utils.get_rolling_token_windows(
              token_list=self.tok_encode(text),
              prefix_token=self.prefix_token_id,
              max_seq_len=self.max_length,
              context_len=1,
          ),
      ):
        windows.append((None, context, predicted))
        owner.append(i)
    totals = [0.0] * len(requests)
    for i, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows)):
      totals[i] += logprob
    for request, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
    return totals

  # ------------------------------------------------------------------ generation
  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Greedy continuations, batched by generation settings and sorted by prompt length."""
    groups = collections.defaultdict(list)
    for i, (_, gen_kwargs) in enumerate(request.args for request in requests):
      until, new_tokens = self._settings(gen_kwargs)
      groups[(until, new_tokens)].append(i)
    out = [""] * len(requests)
    for (until, new_tokens), members in groups.items():
      keep = max(1, self.max_length - new_tokens)  # the prompt's newest tokens that fit
      prompts = {i: self.tok_encode(requests[i].args[0])[-keep:] or [self._prefix] for i in members}
      order = sorted(members, key=lambda i: len(prompts[i]))
      for start in range(0, len(order), self.scorer.batch_size):
        chosen = order[start : start + self.scorer.batch_size]
        generated = decode.generate(
            self.cfg,
            self.scorer.params,
            [prompts[i] for i in chosen],
            new_tokens,
            stop_tokens=[self.tok.eos_id] if self.tok.eos_id is not None else [],
            mesh=self.scorer.mesh,
        )
        for i, ids in zip(chosen, generated.ids()):
          text = self.tok_decode(ids)
          for stop in until:
            text = text.split(stop)[0] if stop else text
          out[i] = text
          self.cache_hook.add_partial("generate_until", requests[i].args, text)
    return out

  def _settings(self, gen_kwargs) -> tuple[tuple[str, ...], int]:
    """(stop strings, most new tokens) of a request's generation settings; sampling settings
    are refused (the harness decodes greedily)."""
    kwargs = dict(gen_kwargs or {})
    if kwargs.get("do_sample") and kwargs.get("temperature", 1.0) > 0:
      raise ValueError(
          "a task asks for sampled generation (do_sample with temperature > 0): the harness "
          "decodes greedily; set the task's generation_kwargs to do_sample: false"
      )
    until = kwargs.get("until") or []
    until = (until,) if isinstance(until, str) else tuple(until)
    return until, int(kwargs.get("max_gen_toks", self.max_gen_toks))
