"""Fine-tuning as people do it: models named from the local Hugging Face cache, the checkpoint's
chat template (data/chat.py), supervised fine-tuning on conversations (tasks/sft.py) and
`generate --chat`."""

import json
import os
import shutil

import numpy as np
import pytest

from transformers_jax.config import ModelConfig
from transformers_jax.convert import import_hf
from transformers_jax.data import DataError, load_tokenizer
from transformers_jax.data.chat import (
    ChatRowError,
    ChatTemplate,
    chat_prompt,
    encode_conversation,
    read_template,
)
from transformers_jax.interop import MissingCheckpointFile, hub_cache, load_hf
from transformers_jax.run_folder.runs import Run
from transformers_jax.tasks import TASKS

from conftest import ROOT, run_python

FIXTURES = ROOT / "tests" / "fixtures" / "hf"
ANSWER = "the answer is forty two."
WORDS = "cat dog tree sun moon river stone bird fish apple king road".split()


# ----------------------------------------------------------------------------- the cache
def fake_cache(root, repo="acme/tiny-llama", commit="0123456789abcdef" * 2 + "01234567"):
  """A Hugging Face cache holding the llama fixture as `repo` at `commit` (refs/main), laid out
  as huggingface_hub lays it out: snapshot files are links into blobs/."""
  folder = root / f"models--{repo.replace('/', '--')}"
  (folder / "blobs").mkdir(parents=True)
  (folder / "refs").mkdir()
  (folder / "refs" / "main").write_text(commit)
  snapshot = folder / "snapshots" / commit
  snapshot.mkdir(parents=True)
  names = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
  for i, name in enumerate(names):
    shutil.copy(FIXTURES / "llama" / name, folder / "blobs" / f"blob{i}")
    (snapshot / name).symlink_to(f"../../blobs/blob{i}")
  return snapshot


def test_a_model_in_the_cache_imports_by_name_offline(tmp_path, monkeypatch):
  snapshot = fake_cache(tmp_path / "hub")
  monkeypatch.setattr(hub_cache, "cache_folder", lambda: tmp_path / "hub")
  assert hub_cache.resolve("acme/tiny-llama") == snapshot
  assert hub_cache.resolve("acme/tiny-llama@" + "0123456789abcdef" * 2 + "01234567") == snapshot
  fields = import_hf("acme/tiny-llama", tmp_path / "run")
  assert fields == {**load_hf(FIXTURES / "llama")[0], "scan_layers": False}
  run = Run(tmp_path / "run")  # the tokenizer and its chat template came along
  assert run.tokenizer().vocab_size == 96
  assert read_template(run.hf_files_dir) is not None
  with pytest.raises(MissingCheckpointFile) as missing:
    hub_cache.resolve("acme/tiny-llama@v2")
  assert "holds revisions main, 0123456789ab, not 'v2'" in str(missing.value)
  assert "hf download acme/tiny-llama --revision v2" in str(missing.value)
  assert not (tmp_path / "run2").exists()


def test_a_name_not_cached_is_one_line_saying_where_it_looked(tmp_path):
  (tmp_path / "hub").mkdir()
  env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
  out = run_python(
      ["-m", "transformers_jax.convert", "--from_hf", "acme/missing", "--workdir"]
      + [str(tmp_path / "run")],
      env=env,
  )
  assert out.returncode == 2
  line = out.stderr.strip().splitlines()[-1]
  assert line.startswith(
      "error: acme/missing is no folder here and not in the Hugging Face cache (looked in "
  )
  assert str(tmp_path / "hub") in line and "hf download acme/missing" in line
  assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- templates
def _causal_lm_fixtures() -> list[str]:
  """Every decoder fixture but GPT-2 (converted without a tokenizer) and gpt_oss_mxfp4 (gpt_oss's
  own weights, packed)."""
  out = []
  for folder in sorted(FIXTURES.iterdir()):
    config = folder / "config.json"
    if config.is_file() and folder.name != "gpt_oss_mxfp4":
      if json.loads(config.read_text())["architectures"][0].endswith("ForCausalLM"):
        out.append(folder.name)
  return out


@pytest.mark.parametrize("name", _causal_lm_fixtures())
def test_every_open_model_fixture_has_a_tokenizer_and_a_chat_template(name):
  tok, template = load_tokenizer(FIXTURES / name / "tokenizer.json"), read_template(FIXTURES / name)
  vocab = json.loads((FIXTURES / name / "config.json").read_text())["vocab_size"]
  prompt = chat_prompt(tok, template, "What is the answer?")
  assert tok.vocab_size <= vocab and max(prompt) < vocab
  assert tok.decode(prompt) == "user\nwhat is the answer?\nassistant\n"  # markers skipped


def test_only_the_assistants_turns_are_marked_for_the_loss():
  tok, template = load_tokenizer(FIXTURES / "qwen3" / "tokenizer.json"), read_template(
      FIXTURES / "qwen3"
  )
  messages = [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "What is it?"},
      {"role": "assistant", "content": "Forty two."},
      {"role": "user", "content": "Sure?"},
      {"role": "assistant", "content": "Yes!"},
  ]
  ids, mask = encode_conversation(tok, template, messages)
  assert len(ids) == len(mask) and tok.hf.decode(ids, skip_special_tokens=False) == (
      template.render(messages).lower()  # the tokenizer lowercases
  )
  marked = [tok.hf.decode([i], skip_special_tokens=False) for i, m in zip(ids, mask) if m]
  assert "".join(marked) == "forty two.<|im_end|>\nyes!<|im_end|>\n"
  # the byte tokenizer (no offsets): its pieces are encoded alone, which gives the same bytes
  from transformers_jax.data.tokenizers import ByteTokenizer

  ids, mask = encode_conversation(ByteTokenizer(), template, messages)
  assert bytes(ids).decode() == template.render(messages)
  assert bytes(i for i, m in zip(ids, mask) if m).decode() == (
      "Forty two.<|im_end|>\nYes!<|im_end|>\n"
  )
  # prompt/completion is the user turn and the answer
  pair = TASKS["sft"], {"prompt": "What is it?", "completion": "Forty two."}
  from transformers_jax.data.chat import conversation
  from transformers_jax.data.tokenizers import ChatTokenizer

  chat = ChatTokenizer(tok, template)
  assert chat.encode(json.dumps(pair[1])) == chat.encode(
      json.dumps({"messages": conversation(pair[1])})
  )
  # the sandbox: a template cannot reach Python's objects
  escape = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")
  with pytest.raises(ChatRowError, match="fails to render"):
    escape.render(messages)
  marked = ChatTemplate(
      "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
  )
  assert marked.render(messages[:2]) == "Be brief.What is it?"


# ----------------------------------------------------------------------------- sft
def conversations(path, count=300, seed=0, answer=ANSWER):
  rng = np.random.default_rng(seed)
  with open(path, "w") as f:
    for i in range(count):
      question = " ".join(rng.choice(WORDS, rng.integers(2, 6))) + "?"
      if i % 3 == 0:
        row = {"prompt": question, "completion": answer}
      else:
        row = {"messages": [{"role": "user", "content": question}]}
        row["messages"].append({"role": "assistant", "content": answer})
      f.write(json.dumps(row) + "\n")


def sft_config(root, **overrides):
  config = Run(root / "llama").config()
  config.update_from_flattened_dict(
      {
          "task": "sft",
          "data.path": str(root / "chat.jsonl"),
          "data.tokenizer": str(root / "llama" / "tokenizer.json"),
          "init_from": str(root / "llama"),
          "steps": 60,
          "batch_size": 8,
          "learning_rate": 3e-3,
          "warmup_steps": 5,
          "log_every": 20,
          "eval_every": 0,
          "eval_batches": 1,
          "sample.max_new_tokens": 0,
          **overrides,
      }
  )
  return config


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
  """The llama fixture converted, then fine-tuned for 60 steps on 300 conversations that all end
  in the same answer: a population of two learning rates (one program), member 0 the answer's."""
  from transformers_jax.train.entry import train

  root = tmp_path_factory.mktemp("sft")
  import_hf(FIXTURES / "llama", root / "llama")
  conversations(root / "chat.jsonl")
  config = sft_config(root, **{"population.learning_rates": "(3e-3, 1e-5)"})
  train(config, str(root / "run"))
  return root


def test_sft_trains_on_the_assistants_tokens_of_packed_conversations(sft_run):
  config = sft_config(sft_run)
  model_cfg = ModelConfig.from_dict(config.model)
  data = TASKS["sft"].data(config, model_cfg, sft_run / "run")
  answer = set(data.tokenizer.encode(ANSWER)) | {data.tokenizer.hf.token_to_id("<|im_end|>")}
  answer.add(data.tokenizer.hf.token_to_id("\n"))
  batch = data.train_batch(3)
  targets, weights, segments = batch["tokens"][:, 1:], batch["weights"], batch["segment_ids"]
  assert set(targets[weights > 0].tolist()) <= answer  # the answer and its end, nothing else
  assert segments.min() == 0 and not weights[segments == 0].any()  # padding is not trained
  # a weighted target is the next token of the same conversation
  following = np.concatenate([segments[:, 1:], segments[:, -1:]], axis=1)
  assert np.all(following[weights > 0] == segments[weights > 0])
  records = [json.loads(line) for line in (sft_run / "run" / "metrics.jsonl").open()]
  held = [r for r in records if "eval_loss" in r]
  share = (
      float(data.eval_batches[0]["weights"].sum()) / (data.eval_batches[0]["segment_ids"] > 0).sum()
  )
  for record in held:
    assert record["eval_loss_fraction"] == pytest.approx(share, rel=1e-6)
  trained = [r for r in records if "loss_fraction" in r]
  assert trained and all(0.2 < r["loss_fraction"] < 0.6 for r in trained)
  final = {r["member"]: r["eval_loss"] for r in held if r["step"] == 60}
  assert final[0] < 0.5 < final[1]  # the rate of 1e-5 barely moved


def test_generate_chat_gives_the_answer_it_was_fine_tuned_on(sft_run):
  out = run_python(
      ["-m", "transformers_jax.generate", "--workdir", str(sft_run / "run"), "--member=0"]
      + ["--chat", "Bird king river?", "--temperature=0", "--max_new_tokens=30"]
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == ANSWER


def test_bad_conversations_are_refused_naming_their_line(sft_run, tmp_path):
  config = sft_config(sft_run, **{"data.path": str(tmp_path / "chat.jsonl")})
  model_cfg = ModelConfig.from_dict(config.model)
  good = (sft_run / "chat.jsonl").read_text().splitlines()[:5]
  cases = {
      '{"messages": [{"role": "user", "content": "hi"}]}': "line 6: the row has no assistant",
      '{"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "x"}]}': (
          "line 6: message 0 has the role 'robot'"
      ),
      '{"messages": [{"role": "tool", "content": "hi"}, {"role": "assistant", "content": "x"}]}': (
          r"line 6: the chat template refuses the row \(unknown role tool\)"
      ),
      '{"text": "hello"}': 'line 6: the row has neither "messages"',
  }
  for row, message in cases.items():
    (tmp_path / "chat.jsonl").write_text("\n".join([*good, row]) + "\n")
    with pytest.raises(DataError, match=message):
      TASKS["sft"].data(config, model_cfg, tmp_path / "run")
  (tmp_path / "chat.jsonl").write_text("\n".join(good) + "\n")
  (tmp_path / "fails.jinja").write_text("{{ messages[0].content + 1 }}")
  config.sft.chat_template = str(tmp_path / "fails.jinja")
  with pytest.raises(DataError, match="line 1: the chat template fails to render the row"):
    TASKS["sft"].data(config, model_cfg, tmp_path / "run2")
  config.sft.chat_template = ""
  config.data.tokenizer = str(tmp_path / "tokenizer.json")
  shutil.copy(sft_run / "llama" / "tokenizer.json", tmp_path / "tokenizer.json")
  config.init_from = ""
  with pytest.raises(DataError, match="task=sft needs a chat template"):
    TASKS["sft"].data(config, model_cfg, tmp_path / "run3")
