"""Issue 15 item 1: agentic prompt lengths as the server counts them — the messages through the
model's chat template. Checked against transformers' own apply_chat_template (in .venv-serving, the
version SGLang 0.5.23 pins) on the same tokenizer directory."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from runbook.bench.sessions import SessionPlan
from runbook.bench.settings import BenchSettings
from runbook.demo import llama as demo
from runbook.model.tokenizer import chat_counter, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
SERVING_PY = Path(os.environ.get("RUNBOOK_SERVING_PYTHON") or REPO / ".venv-serving" / "bin" / "python")

# Written for these tests in the two common shapes: ChatML (Qwen-style, default system prompt) and a
# Llama-3-style header format with a BOS token and a role check through raise_exception.
CHATML = ("{%- if messages[0].role != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{%- endif %}"
          "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
          "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HEADERS = ("{{ bos_token }}{% for m in messages %}"
           "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
           "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
           "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def model_dir(tmp_path: Path, template, name: str, as_file: bool = False) -> Path:
    d = tmp_path / name
    d.mkdir()
    tok = demo.train_tokenizer(vocab_size=2048)
    # a real model's tokenizer.json lists its special tokens, so they are one token each on both sides
    tok.add_special_tokens(["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>",
                            "<|eot_id|>"])
    tok.save(str(d / "tokenizer.json"))
    bos = {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": "</s>"}
    if as_file:
        (d / "chat_template.jinja").write_text(template)
    else:
        cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


CONVERSATIONS = [
    [{"role": "user", "content": "def f(x):\n    return x + 1\nWhat does f do?"}],
    [{"role": "system", "content": "Repository context:\nimport os\n"}, {"role": "user", "content": "  Fix the bug.  "},
     {"role": "assistant", "content": "Change line 2."}, {"role": "user", "content": "Tool result (run_tests):\n2 passed"}],
]


def transformers_counts(d: Path) -> list[int]:
    if not SERVING_PY.is_file():
        pytest.skip("no .venv-serving (make serving-env): transformers is the oracle")
    code = ("import json, sys; from transformers import AutoTokenizer\n"
            "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
            "out = []\n"
            "for m in json.loads(sys.argv[2]):\n"
            "    ids = t.apply_chat_template(m, add_generation_prompt=True, tokenize=True)\n"
            "    ids = ids['input_ids'] if hasattr(ids, 'keys') else ids\n"
            "    out.append(len(ids))\n"
            "print(json.dumps(out))")
    cp = subprocess.run([str(SERVING_PY), "-c", code, str(d), json.dumps(CONVERSATIONS)], capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert cp.returncode == 0, cp.stderr[-2000:]
    return json.loads(cp.stdout.strip().splitlines()[-1])


@pytest.mark.serving
@pytest.mark.parametrize("template, as_file", [(CHATML, False), (HEADERS, False), (HEADERS, True)])
def test_counts_equal_transformers_apply_chat_template(tmp_path, template, as_file):
    d = model_dir(tmp_path, template, "m", as_file)
    c = chat_counter(d, load_tokenizer(d))
    assert c is not None
    ours = [c.count(m) for m in CONVERSATIONS]
    assert ours == transformers_counts(d)
    tok = load_tokenizer(d)
    content_only = [sum(len(tok.encode(x["content"], add_special_tokens=False).ids) for x in m) for m in CONVERSATIONS]
    assert all(a > b for a, b in zip(ours, content_only, strict=True))   # the template's own tokens are counted


def test_sessions_use_the_template_and_fall_back_without_one(tmp_path):
    d = model_dir(tmp_path, HEADERS, "m")
    tok = load_tokenizer(d)
    o = BenchSettings(turns=2, input_len=64, output_len=4, tool_result_len=16)
    with_t = SessionPlan(1, o, tokenizer=tok, chat=chat_counter(d, tok))
    plain = SessionPlan(1, o, tokenizer=tok)
    msgs = with_t.opening(0)
    assert with_t.prompt_tokens(msgs) == chat_counter(d, tok).count(msgs) > plain.prompt_tokens(msgs)
    # a role the template refuses: the content count, not a crash
    odd = msgs + [{"role": "tool", "content": "x"}]
    assert with_t.prompt_tokens(odd) == plain.prompt_tokens(odd)
    bare = tmp_path / "bare"
    bare.mkdir()
    tok.save(str(bare / "tokenizer.json"))
    assert chat_counter(bare, tok) is None                         # no template here
    (bare / "tokenizer_config.json").write_text('{"chat_template": "{% for %}"}')
    assert chat_counter(bare, tok) is None                         # one Jinja cannot compile
    (bare / "tokenizer_config.json").write_text("[1, 2")
    assert chat_counter(bare, tok) is None                         # broken JSON
    (bare / "tokenizer_config.json").write_bytes(b'{"chat_template": "\xff\xfe"}')
    (bare / "chat_template.jinja").write_bytes(b"{{ bos_token }}\xff")
    assert chat_counter(bare, tok) is None                         # neither file is UTF-8


def test_a_template_cannot_reach_python_internals(tmp_path):
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    d = model_dir(tmp_path, evil, "m")
    c = chat_counter(d, load_tokenizer(d))
    assert c is not None and c.count(CONVERSATIONS[0]) is None     # the sandbox refuses; no count
