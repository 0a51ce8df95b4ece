"""What the test suite spends its CPU on, by file and by test, from a recorded run.

    TEST_CPU_RECORD=/tmp/cost.jsonl python -m pytest
    python scripts/test_cost_report.py /tmp/cost.jsonl [--top 40] [--json]

tests/conftest.py appends one line per test when TEST_CPU_RECORD names a file: wall seconds,
the CPU seconds of the pytest process that ran it (`own`: tracing, compiling and running) and of
the subprocesses it waited for (`children`), how many processes it started, and how many XLA
compilations the pytest process ran (with their compile and trace seconds). This prints a
markdown table of files, costliest first, and the costliest tests (or the same as JSON with
--json). CPU seconds compare across runs on a busy machine better than wall seconds do, though a
machine with more runnable processes than cores still inflates them.
"""

import collections
import json
import pathlib

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)
# what each line of the record holds besides the test's name (records made before the compile
# counts were added lack the last three: they count 0)
KEYS = ("wall_s", "own_cpu_s", "children_cpu_s", "processes", "compiles", "compile_s", "trace_s")
flags.DEFINE_integer("top", 40, "How many single tests to list.", flag_values=FLAGS)
flags.DEFINE_bool("json", False, "Print JSON, not markdown.", flag_values=FLAGS)


def main(argv=None) -> int:
  positional = cli.parse_script_flags(FLAGS, argv)
  if len(positional) != 1:
    raise UserError("give the TEST_CPU_RECORD file: python scripts/test_cost_report.py FILE")
  record = pathlib.Path(positional[0])
  if not record.is_file():
    raise UserError(f"{record}: no such file; run the suite with TEST_CPU_RECORD={record} first")
  rows = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
  by_file = collections.defaultdict(lambda: collections.Counter())
  for r in rows:
    f = by_file[r["test"].split("::")[0]]
    f["tests"] += 1
    for key in KEYS:
      f[key] += r.get(key, 0)
  cpu = lambda r: r["own_cpu_s"] + r["children_cpu_s"]  # noqa: E731
  files = sorted(by_file.items(), key=lambda kv: -cpu(kv[1]))
  tests = sorted(rows, key=lambda r: -cpu(r))[: FLAGS.top]
  total = {k: sum(f[k] for _, f in files) for k in KEYS}
  if FLAGS.json:
    print(
        json.dumps(
            {
                "tests": len(rows),
                "total": total,
                "files": {name: dict(f) for name, f in files},
                "costliest_tests": tests,
            },
            indent=1,
        )
    )
    return 0
  print(
      f"{len(rows)} tests: {total['own_cpu_s'] + total['children_cpu_s']:.0f} CPU-s "
      f"({total['own_cpu_s']:.0f} in pytest, {total['children_cpu_s']:.0f} in "
      f"{total['processes']} subprocesses); {total['compiles']} XLA compilations in pytest "
      f"({total['compile_s']:.0f} s compiling, {total['trace_s']:.0f} s tracing)\n"
  )
  head = "| CPU-s | in pytest | in subprocesses | processes | compilations in pytest |"
  print("| file | tests " + head)
  print("|---" * 7 + "|")
  for name, f in files:
    print(
        f"| {name} | {f['tests']} | {cpu(f):.1f} | {f['own_cpu_s']:.1f} | "
        f"{f['children_cpu_s']:.1f} | {f['processes']} | {f['compiles']} |"
    )
  print("\n| test " + head)
  print("|---" * 6 + "|")
  for r in tests:
    print(
        f"| {r['test']} | {cpu(r):.1f} | {r['own_cpu_s']:.1f} | {r['children_cpu_s']:.1f} | "
        f"{r['processes']} | {r.get('compiles', 0)} |"
    )

  return 0


if __name__ == "__main__":
  cli.run_script(main)
