"""Score a training run on lm-eval tasks (decoder-only models; the `eval` extra):

    python -m transformers_jax.evaluate --workdir runs/x --tasks pysyntax_choice,pysyntax_ppl \
        --include_path experiments/eval_tasks [--limit 100 --num_fewshot 0 --batch_size 16]

Tasks are lm-eval's (its own, or YAMLs in lm-eval's format under --include_path); results go
to WORKDIR/eval_harness/step_<S>.json and a table is printed. A population's run scores every
member (step_<S>_member_<K>.json), or the one --member names. Settings not given come from the
run's config.eval_harness. The model runs on the run's mesh (config.json's mesh), or on every
device along the data axis when this host's devices cannot make that mesh.
"""

from __future__ import annotations


from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

flags.DEFINE_string("workdir", None, "A training run's directory (config.json, checkpoints/).")
flags.DEFINE_string(
    "tasks", None, "Comma-separated lm-eval task or group names (default: the run's config)."
)
flags.DEFINE_string(
    "include_path",
    None,
    "A folder of task YAMLs in lm-eval's format (e.g. experiments/eval_tasks), searched before "
    "lm-eval's own tasks.",
)
flags.DEFINE_integer("limit", None, "Examples per task (0: all).")
flags.DEFINE_integer("num_fewshot", None, "Few-shot examples per prompt (-1: each task's own).")
flags.DEFINE_integer("batch_size", None, "Sequences per forward pass.")
flags.DEFINE_integer("max_gen_toks", None, "generate_until: most new tokens when a task says none.")
flags.DEFINE_integer(
    "bootstrap_iters", None, "Resamples for bootstrapped standard errors (0: no standard errors)."
)
flags.DEFINE_integer("step", None, "Checkpoint step to score (default: the latest).")
flags.DEFINE_integer(
    "member",
    None,
    "A population's run: score only this member (0-based, as `member` in metrics.jsonl); "
    "default: every member. Refused for a single run.",
)
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}: pass options as --flag=value")
  if not FLAGS.workdir:
    raise UserError("--workdir is required: the directory of a training run")
  from transformers_jax.evaluate.runs import evaluate_run

  settings = {
      name: FLAGS[name].value
      for name in (
          "tasks",
          "include_path",
          "limit",
          "num_fewshot",
          "batch_size",
          "max_gen_toks",
          "bootstrap_iters",
      )
  }
  for member, path, table in evaluate_run(FLAGS.workdir, settings, FLAGS.step, FLAGS.member):
    who = "" if member is None else f"member {member}: "
    print(f"{who}{path}\n{table}", flush=True)


if __name__ == "__main__":
  cli.run(main)
