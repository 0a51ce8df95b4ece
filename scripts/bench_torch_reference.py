"""The same decoder written the way nanoGPT writes it, in eager PyTorch, timed for comparison
with scripts/bench_train.py. Optional: needs `pip install torch==2.13.0` (CPU build).

    python scripts/bench_torch_reference.py [--d_model 256 --layers 4 --heads 4 --seq_len 256
                                             --batch_size 16 --vocab 256 --steps 20]
                                            [--profile]

Pre-LN blocks, fused qkv projection, scaled_dot_product_attention (causal), GELU (tanh) MLP,
tied unembedding, AdamW with weight decay on matrices and gradient clipping — the same
computation as experiments/gpt2.py with those sizes. Uses every core (torch's default threads).
Prints one JSON object; with --profile, first torch.profiler's table of where 3 steps' time
goes (matmuls, flash attention, GELU, norms, ...), to set beside scripts/profile_train.py.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)
for _name, _default, _help in [
    ("d_model", 256, "Model width."),
    ("layers", 4, "Blocks."),
    ("heads", 4, "Attention heads."),
    ("seq_len", 256, "Tokens per sequence."),
    ("batch_size", 16, "Sequences per step."),
    ("vocab", 256, "Vocabulary size."),
    ("steps", 20, "Timed steps (the median is reported)."),
]:
  flags.DEFINE_integer(_name, _default, _help, lower_bound=1, flag_values=FLAGS)
flags.DEFINE_bool(
    "profile", False, "Also print PyTorch's profile of three steps.", flag_values=FLAGS
)


def gpt_class():
  """The nanoGPT-style model (torch imported only when the script runs)."""
  import torch
  import torch.nn.functional as F
  from torch import nn

  class Block(nn.Module):

    def __init__(self, d, heads):
      super().__init__()
      self.heads = heads
      self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
      self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
      self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
      B, T, D = x.shape
      q, k, v = self.qkv(self.ln_1(x)).split(D, dim=2)
      q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
      y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
      x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
      return x + self.fc_out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

  class GPT(nn.Module):

    def __init__(self, vocab, seq_len, d, layers, heads):
      super().__init__()
      self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
      self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
      self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
      x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
      for block in self.blocks:
        x = block(x)
      logits = self.ln_f(x) @ self.wte.weight.T
      return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

  return GPT


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  try:
    import torch
  except ImportError:
    raise UserError("this script needs PyTorch: pip install torch==2.13.0 (CPU build)") from None
  a = FLAGS
  torch.manual_seed(0)
  model = gpt_class()(a.vocab, a.seq_len, a.d_model, a.layers, a.heads)
  decay = [q for q in model.parameters() if q.dim() >= 2]
  no_decay = [q for q in model.parameters() if q.dim() < 2]
  opt = torch.optim.AdamW(
      [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
      lr=1e-3,
      betas=(0.9, 0.95),
  )
  x = torch.randint(0, a.vocab, (a.batch_size, a.seq_len + 1))

  def step():
    loss = model(x[:, :-1], x[:, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  for _ in range(2):
    step()
  if a.profile:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
      for _ in range(3):
        step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
  times = []
  for _ in range(a.steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
  step_s = statistics.median(times)  # as scripts/bench_train.py: the median step
  print(
      json.dumps(
          {
              "framework": f"torch {torch.__version__} eager",
              "threads": torch.get_num_threads(),
              "step_s": step_s,
              "step_s_min": min(times),
              "step_s_max": max(times),
              "tokens_per_s": a.batch_size * a.seq_len / step_s,
              "params": sum(q.numel() for q in model.parameters()),
          }
      )
  )


if __name__ == "__main__":
  cli.run_script(main)
