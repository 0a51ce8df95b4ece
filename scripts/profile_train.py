"""Where a training step's time goes, from XLA's own profiler: every operation the compiled step
runs, attributed to a part of the model by the name stack XLA keeps in its metadata.

    python scripts/profile_train.py [--config experiments/gpt2.py:tiny --config.x=y ...] [--json]

Without `--config.*` overrides it profiles the reference model: d_model 256, 4 layers,
4 heads, sequence 256, batch 16, byte vocabulary. Traces `--steps` compiled steps with
`jax.profiler`, reads the trace, and sums each operation's time into parts (attention core,
attention projections, feed-forward, norms, embeddings + unembedding + cross-entropy, optimizer
and clipping) and kinds (matmuls, i.e. operations containing a dot, versus everything else:
elementwise, reductions, copies, transposes). XLA may run independent operations at once, so
summed times can add up to more than the step's wall time (with several devices,
`--cpu_devices`, they add every device's); "busy" is the time at least one of a part's
operations was running. It reads XLA:CPU's per-operation trace events (a GPU trace names
kernels instead, and the script says so). Also prints the step's FLOPs and bytes from XLA's
cost analysis and the floor they imply: the matmul FLOPs at the measured peak, which no
schedule can beat. Prints markdown, or JSON with --json.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile
import time

import numpy as np
from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)
cli.define_config_flag("experiments/gpt2.py:tiny", flag_values=FLAGS)
flags.DEFINE_integer(
    "steps",
    5,
    "Steps traced (after compiling and two warm-up steps).",
    lower_bound=1,
    flag_values=FLAGS,
)
flags.DEFINE_bool("json", False, "Print JSON instead of markdown.", flag_values=FLAGS)

REFERENCE = dict(d_model=256, num_layers=4, num_heads=4, max_len=256)
PARTS = (  # (part, pattern in the operation's name stack), first match wins
    ("attention core", r"attention_core"),
    ("attention projections", r"_attn/"),
    ("norms", r"norm"),
    ("feed-forward", r"/ffn|/moe"),
    ("embeddings, unembedding, cross-entropy", r"embed|log_softmax|take_along_axis|jvp\(\)"),
    ("optimizer, clipping, other", r""),
)


def computations(hlo: str) -> dict[str, str]:
  """Name -> body of every computation in an HLO module's text."""
  out = {}
  for m in re.finditer(r"^%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S | re.M):
    out[m.group(1)] = m.group(2)
  return out


def instructions(hlo: str) -> dict[str, str]:
  """Instruction name -> the rest of its line, for every instruction in the module."""
  out = {}
  for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$", hlo, re.M):
    out.setdefault(m.group(1), m.group(2))
  return out


def covered(spans: list[tuple[float, float]]) -> float:
  """Length of the union of time intervals: how long at least one of them was running."""
  total, end = 0.0, float("-inf")
  for a, b in sorted(spans):
    if b > end:
      total += b - max(a, end)
      end = b
  return total


def classify(line: str, bodies: dict[str, str]) -> tuple[str, str]:
  """(part, kind) of one operation of the compiled step, from its HLO line."""
  name = re.search(r'op_name="([^"]*)"', line)
  stack = name.group(1) if name else ""
  part = next(p for p, pattern in PARTS if re.search(pattern, stack))
  called = re.search(r"calls=%([\w.\-]+)", line)
  body = bodies.get(called.group(1), "") if called else ""
  is_dot = re.search(r"\bdot\(", line.split("metadata=")[0] + body) is not None
  return part, "matmul" if is_dot else "other"


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  import jax

  from transformers_jax.machine import parallel
  from transformers_jax.models import flops
  from transformers_jax.train import metrics as metrics_lib
  from transformers_jax.train.compile import build_step

  config = FLAGS.config
  overridden = any(arg.startswith("--config.") for arg in argv or [])
  if FLAGS["config"].config_filename == "experiments/gpt2.py:tiny" and not overridden:
    config.model.update(REFERENCE)
    config.seq_len, config.batch_size = 256, 16
  setup = build_step(config)
  step, c, mesh, task = setup.train_step(), setup.model_cfg, setup.mesh, setup.task
  state = setup.init_state()
  batch = parallel.put_batch(task.synthetic_batch(c, config), mesh)
  compiled = step.lower(state, batch).compile()  # run below: the trace names its operations
  hlo = compiled.as_text()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  for _ in range(2):
    state, m = compiled(state, batch)
  jax.block_until_ready(m)

  times = []
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(FLAGS.steps):
        t = time.perf_counter()
        state, m = compiled(state, batch)
        jax.block_until_ready((state, m))
        times.append(time.perf_counter() - t)
    trace_file = glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True)[0]
    with gzip.open(trace_file) as f:
      events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]

  lines, bodies = instructions(hlo), computations(hlo)
  label = {}  # operation -> (part, kind)
  by_op, parts, kinds, counts = (collections.Counter() for _ in range(4))
  spans = collections.defaultdict(list)  # part or kind -> [(start, end)] of its operations
  for e in events:
    if e["name"] not in lines:  # not an operation (thunk) of the compiled step
      continue
    if e["name"] not in label:
      label[e["name"]] = classify(lines[e["name"]], bodies)
    part, kind = label[e["name"]]
    seconds = e["dur"] * 1e-6 / FLAGS.steps
    by_op[e["name"]] += seconds
    parts[part] += seconds
    kinds[kind] += seconds
    counts[part] += 1 / FLAGS.steps
    for key in (part, kind, "all"):
      spans[key].append((e["ts"], e["ts"] + e["dur"]))
  busy = {key: covered(v) * 1e-6 / FLAGS.steps for key, v in spans.items()}
  total = sum(by_op.values())
  if not total:
    raise UserError(
        "no operation of the compiled step was found in the profiler's trace: "
        "this script reads XLA:CPU's per-operation events (run it on a CPU)"
    )
  tokens_per_example = task.tokens_per_example(c, config)
  tokens = config.batch_size * tokens_per_example
  peak, peak_source = metrics_lib.device_peak()
  step_s = float(np.median(times))
  result = {
      "model": {
          "family": c.family,
          "d_model": c.d_model,
          "layers": c.num_layers,
          "heads": c.num_heads,
          "seq_len": tokens_per_example,
          "batch_size": config.batch_size,
          "vocab": c.vocab_size,
          "attention_impl": c.attention_impl,
      },
      "step_s": step_s,
      "tokens_per_s": tokens / step_s,
      "operations_s": total,
      "busy_s": busy["all"],
      "idle_s": step_s - busy["all"],
      "operations_per_step": round(sum(counts.values())),
      "parts_s": dict(parts.most_common()),
      "parts_operations_per_step": {p: round(n) for p, n in counts.items()},
      "parts_busy_s": {p: busy[p] for p in parts},
      "kinds_s": dict(kinds.most_common()),
      "kinds_busy_s": {k: busy[k] for k in kinds},
      "xla_flops": cost.get("flops"),
      "model_flops": flops.flops_per_token(c, tokens_per_example) * tokens,
      "xla_bytes_accessed": cost.get("bytes accessed"),
      "peak_flops_per_s": peak,
      "peak_source": peak_source,
      "matmul_floor_s": cost.get("flops") / peak if peak and cost.get("flops") else None,
      "top_operations": [
          {
              "op": op,
              "s": s,
              "part": label[op][0],
              "hlo": re.sub(r",? ?metadata=.*", "", lines[op])[:120],
          }
          for op, s in by_op.most_common(12)
      ],
  }
  if FLAGS.json:
    print(json.dumps(result, indent=1))
    return
  print(
      f"step {step_s:.3f} s (median of {FLAGS.steps}), {tokens / step_s:,.0f} tokens/s; "
      f"{result['operations_per_step']:,} operations, {total:.3f} s summed; some operation "
      f"running {busy['all']:.3f} s, a matmul {busy.get('matmul', 0.0):.3f} s, nothing "
      f"{result['idle_s']:.3f} s"
  )
  if result["matmul_floor_s"] is not None:
    print(
        f"XLA cost analysis: {result['xla_flops'] / 1e9:.1f} GFLOP (model count "
        f"{result['model_flops'] / 1e9:.1f}), {result['xla_bytes_accessed'] / 1e9:.2f} GB "
        f"accessed; matmul floor at the peak ({peak / 1e9:.0f} GFLOP/s) "
        f"{result['matmul_floor_s']:.3f} s"
    )
  print()
  print(
      "| part | operations | summed s | busy s | share of summed |\n"
      "| --- | ---: | ---: | ---: | ---: |"
  )
  for part, s in parts.most_common():
    print(f"| {part} | {counts[part]:.0f} | {s:.3f} | {busy[part]:.3f} | {s / total:.0%} |")
  for kind, s in kinds.most_common():
    print(f"| all {kind} operations | | {s:.3f} | {busy[kind]:.3f} | {s / total:.0%} |")
  print("\n| operation | seconds | part | HLO |\n| --- | ---: | --- | --- |")
  for row in result["top_operations"]:
    print(f"| {row['op']} | {row['s']:.4f} | {row['part']} | `{row['hlo']}` |")


if __name__ == "__main__":
  cli.run_script(main)
