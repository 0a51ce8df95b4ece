"""Train any family from a config:

    python -m transformers_jax.train --config experiments/gpt2.py:cpu --workdir runs/x \
        [--config.steps=2000 --config.model.norm_placement=post ...]

Running the same command again resumes from the latest checkpoint in --workdir.
"""

from absl import flags

from transformers_jax import cli

cli.define_config_flag()
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the run's config.")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise cli.UserError(f"unexpected arguments {argv[1:]}: pass options as --flag=value")
  if FLAGS.config is None:
    raise cli.UserError("--config is required, e.g. --config experiments/gpt2.py:cpu")
  if not FLAGS.workdir:
    raise cli.UserError("--workdir is required: where the run's files go (e.g. runs/x)")
  from transformers_jax.train.loop import train
  train(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  cli.run(main)
