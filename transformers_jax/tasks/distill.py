"""Knowledge distillation (Hinton et al. 2015) from a teacher run: the student, a decoder (next
token) or an encoder (masked LM), learns the teacher's softened distribution at each position it
is trained on, mixed with the hard labels:

    loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE

(T^2 keeps the soft term's gradients at the scale of the hard term's as T changes). The
teacher's parameters are frozen (Task.frozen_runs: the training driver loads them) and placed on
the run's mesh with the layout its own run would have there. The batches, tokenizer and sample are the model's own objective's (lm or mlm); the
teacher's tokenizer is the student's. The held-out loss is the student's cross-entropy, as a
student trained alone reports it, and `eval_distill_kl` the KL to the teacher at T = 1.

    --config.task=distill --config.distill.teacher=RUN [--config.distill.temperature=2
    --config.distill.alpha=0.5]
"""

from __future__ import annotations

import math
import pathlib
import shutil

import jax
import jax.numpy as jnp
import ml_collections

from transformers_jax.config import ModelConfig
from transformers_jax.records import asks_for_population, read_config
from transformers_jax.tasks.base import Task, cross_entropy
from transformers_jax.tasks.lm import LanguageModeling
from transformers_jax.tasks.mlm import MaskedLM

STUDENTS = {"decoder": LanguageModeling(), "encoder": MaskedLM()}


def soft_kl(student, teacher, weights, temperature):
  """Weighted sum over positions of KL(softmax(teacher / T) || softmax(student / T))."""
  log_s = jax.nn.log_softmax(student.astype(jnp.float32) / temperature, axis=-1)
  log_t = jax.nn.log_softmax(teacher.astype(jnp.float32) / temperature, axis=-1)
  kl = jnp.sum(jnp.exp(log_t) * (log_t - log_s), axis=-1)
  return jnp.sum(kl * weights.astype(jnp.float32))


class Distillation(Task):
  name = "distill"
  summary = "knowledge distillation from a teacher run, distill.teacher (decoder or encoder mlm)"
  families = tuple(STUDENTS)
  language_model = True
  packs = "documents"

  def config_defaults(self):
    c = ml_collections.ConfigDict()
    c.teacher = ""  # distill: the teacher's run folder (a run of the same family and vocabulary)
    c.temperature = 2.0  # distill: softmax temperature of teacher and student in the soft term
    c.alpha = 0.5  # distill: weight of the soft (KL) term; 1 - alpha weighs the hard labels
    return c

  def own(self, model_cfg) -> Task:
    """The objective whose batches the student trains on: its model's own."""
    return STUDENTS.get(model_cfg.family, STUDENTS["decoder"])

  # The batches, data and sample are the student's own objective's.
  def batch_shapes(self, model_cfg, config):
    return self.own(model_cfg).batch_shapes(model_cfg, config)

  def synthetic_batch(self, model_cfg, config, seed: int = 0):
    return self.own(model_cfg).synthetic_batch(model_cfg, config, seed)

  def sample(self, data, model_cfg, params, config):
    return self.own(model_cfg).sample(data, model_cfg, params, config)

  def attends_causally(self, model_cfg):
    return self.own(model_cfg).causal

  def teacher_config(self, config, model_cfg) -> ModelConfig:
    """The teacher run's model config, checked against the student's."""
    teacher = config.distill.teacher
    if not teacher:
      raise ValueError("distill.teacher='': give the teacher's run: --config.distill.teacher=RUN")
    saved = read_config(pathlib.Path(teacher) / "config.json")
    if saved is None:
      raise ValueError(
          f"distill.teacher={teacher!r}: no run there (no config.json): give a run folder "
          "trained by transformers_jax.train"
      )
    if asks_for_population(saved.get("population")):
      raise ValueError(
          f"distill.teacher={teacher!r}: a population's run, and a teacher is one model "
          "(distillation takes no member): make the member I you want a run of its own, e.g. "
          f"python -m transformers_jax.convert --workdir {teacher} --member I --to_hf DIR, then "
          "convert --from_hf DIR --workdir TEACHER, and give --config.distill.teacher=TEACHER"
      )
    t = ModelConfig.from_dict(saved["model"])
    if (t.family, t.head_kind, t.vocab_size) != (
        model_cfg.family,
        model_cfg.head_kind,
        model_cfg.vocab_size,
    ):
      raise ValueError(
          f"distill.teacher={teacher!r}: a {t.family} model (head {t.head_kind}, vocabulary "
          f"{t.vocab_size}) cannot teach this {model_cfg.family} model (head "
          f"{model_cfg.head_kind}, vocabulary {model_cfg.vocab_size}): give a teacher of the "
          "same family, head and vocabulary"
      )
    return t

  def check(self, config, model_cfg):
    super().check(config, model_cfg)
    student = self.own(model_cfg)
    if student.heads and model_cfg.head_kind not in student.heads:
      raise ValueError(
          f"task='distill': an {model_cfg.family} student learns masked LM (head mlm), and this "
          f"model's head is {model_cfg.head_kind}: use --config.model.head=mlm"
      )
    student.check(config, model_cfg)
    own = config.distill
    if not (math.isfinite(own.temperature) and own.temperature > 0):  # inf: a NaN loss later
      raise ValueError(
          f"distill.temperature={own.temperature!r}: must be a positive finite number (1 = the "
          "logits as they are, 2 = softer)"
      )
    if not (math.isfinite(own.alpha) and 0 <= own.alpha <= 1):
      raise ValueError(f"distill.alpha={own.alpha!r}: the soft term's weight lies in [0, 1]")
    self.teacher_config(config, model_cfg)

  def data(self, config, model_cfg, workdir):
    """The student's own objective's data, tokenized with the teacher's tokenizer."""
    workdir = pathlib.Path(workdir)
    theirs = pathlib.Path(config.distill.teacher) / "tokenizer.json"
    if theirs.is_file() and not (workdir / "tokenizer.json").exists():
      workdir.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(theirs, workdir / "tokenizer.json")
    return self.own(model_cfg).data(config, model_cfg, workdir)

  def frozen_runs(self, config):
    """The teacher, whose model config `outputs` builds its forward pass from."""
    self.teacher_model_cfg = ModelConfig.from_dict(
        read_config(pathlib.Path(config.distill.teacher) / "config.json")["model"]
    )
    return {"teacher": config.distill.teacher}

  def synthetic_frozen(self, model_cfg, config, seed=0):
    """A teacher of the student's own model, freshly initialised."""
    from flax import linen as nn

    from transformers_jax.models import initializer

    self.teacher_model_cfg = model_cfg
    return {"teacher": nn.unbox(initializer(model_cfg)(jax.random.PRNGKey(seed)))}

  def outputs(self, model, variables, batch, rngs, mutable):
    from transformers_jax.models import build_model

    own = self.own(model.cfg)
    student = {"params": variables["params"]}
    (logits, targets, weights, *_), state = own.outputs(model, student, batch, rngs, mutable)
    teacher_model = build_model(self.teacher_model_cfg)
    (teacher_logits, *_), _ = own.outputs(
        teacher_model, {"params": variables["frozen"]["teacher"]}, batch, {}, ["intermediates"]
    )
    return (logits, targets, weights, jax.lax.stop_gradient(teacher_logits)), state

  def loss_options(self, config):
    return {
        "label_smoothing": config.label_smoothing,
        "temperature": config.distill.temperature,
        "alpha": config.distill.alpha,
    }

  def loss(self, outputs, batch, model_cfg, options, z_loss=0.0, train=True):
    logits, targets, weights, teacher_logits = outputs
    V = model_cfg.vocab_size
    if not train:  # the student's cross-entropy, and the KL to the teacher at T = 1
      sums = super().loss((logits, targets, weights), batch, model_cfg, None, train=False)
      sums["distill_kl"] = soft_kl(logits[..., :V], teacher_logits[..., :V], weights, 1.0)
      return sums
    T, alpha = options["temperature"], options["alpha"]
    padded = logits.shape[-1] != V
    hard = cross_entropy(
        logits, targets, weights, options["label_smoothing"], V if padded else None, z_loss
    )
    z_term = z_loss * hard["z_loss"]
    kl = soft_kl(logits[..., :V], teacher_logits[..., :V], weights, T)
    sums = dict(hard, distill_kl=kl)
    sums["loss"] = alpha * T * T * kl + (1 - alpha) * (hard["loss"] - z_term) + z_term
    if isinstance(z_loss, (int, float)) and z_loss == 0:
      del sums["z_loss"]
    return sums

  def metrics(self, sums, weight):
    return {**super().metrics(sums, weight), "distill_kl": sums["distill_kl"] / weight}

  def eval_summary(self, data, totals):
    out = super().eval_summary(data, totals)
    out["eval_distill_kl"] = float(totals["distill_kl"]) / max(float(totals["weight"]), 1.0)
    return out
