import pytest
import yaml
from conftest import DEFAULT_SPEC

from runbook.core import spec
from runbook.core.errors import SpecError


def _base():
    return yaml.safe_load(DEFAULT_SPEC.read_text())


def _write(tmp_path, data, name="d.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_default_spec_is_the_story_deployment():
    d = spec.load()
    assert d.name == "qwen3.5-397b-a17b-nvfp4"
    # NVML memory.total of an RTX PRO 6000 Blackwell, 97,887 MiB (not the marketing 96 GB)
    assert (d.hardware.gpu_count, d.hardware.gpu_memory_gib * 1024, d.parallelism.tp) == (8, 97887, 8)
    assert d.serving.flags["kv-cache-dtype"] == "bf16"
    assert d.serving.flags["quantization"] == "modelopt_fp4"
    assert d.resolve_path(d.model.card).joinpath("hf_quant_config.json").is_file()
    assert d.systemd.installed_path == "/etc/systemd/system/sglang-qwen.service"


def test_unknown_key_names_file_key_and_allowed_keys(tmp_path):
    data = _base()
    data["hardware"]["gpu_cnt"] = 8
    with pytest.raises(SpecError) as e:
        spec.load(_write(tmp_path, data))
    msg = str(e.value)
    assert "d.yaml" in msg and "hardware.gpu_cnt: unknown key" in msg and "gpu_count" in msg
    assert "\n" not in msg


def test_wrong_type_names_key_and_value(tmp_path):
    data = _base()
    data["parallelism"]["tp"] = "eight"
    with pytest.raises(SpecError, match=r"parallelism.tp: .*integer.*'eight'"):
        spec.load(_write(tmp_path, data))


def test_missing_field_says_what_is_expected(tmp_path):
    data = _base()
    del data["serving"]["python"]
    with pytest.raises(SpecError, match=r"serving.python: missing required key \(absolute path of the python"):
        spec.load(_write(tmp_path, data))


@pytest.mark.parametrize("mutate, pattern", [
    (lambda d: d["serving"]["env"].update({"HF_TOKEN": "hf_x"}), r"HF_TOKEN looks like a secret.*env_file"),
    (lambda d: d["serving"]["env"].update({"1BAD": "x"}), r"not a valid environment variable name"),
    (lambda d: d["serving"]["env"].update({"NCCL_IB_DISABLE": True}), r"quote the value"),
    (lambda d: d["serving"]["flags"].update({"--tp-size": 8}), r"without leading dashes"),
    (lambda d: d["serving"]["flags"].update({"tp-size": 8}), r"tp-size: set it through parallelism.tp"),
    (lambda d: d["parallelism"].update({"tp": 16}), r"parallelism needs 16 GPUs .* hardware.gpu_count is 8"),
    (lambda d: d["parallelism"].update({"attn_dp": 3}), r"attn_dp \(3\) must divide tp \(8\)"),
    (lambda d: d.update({"name": "Bad Name"}), r"name: String should match pattern"),
])
def test_bad_values_give_one_line(tmp_path, mutate, pattern):
    data = _base()
    mutate(data)
    with pytest.raises(SpecError, match=pattern) as e:
        spec.load(_write(tmp_path, data))
    assert "\n" not in str(e.value)


def test_int_env_value_becomes_string(tmp_path):
    data = _base()
    data["serving"]["env"]["NCCL_IB_DISABLE"] = 1
    assert spec.load(_write(tmp_path, data)).serving.env["NCCL_IB_DISABLE"] == "1"


def test_invalid_yaml_and_missing_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad.yaml: line \d+: not valid YAML"):
        spec.load(p)
    with pytest.raises(SpecError, match="deployment spec not found"):
        spec.load(tmp_path / "nope.yaml")
    p.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        spec.load(p)


def test_relative_paths_resolve_against_the_spec_file(tmp_path):
    data = _base()
    data["model"]["card"] = "card"
    (tmp_path / "card").mkdir()
    d = spec.load(_write(tmp_path, data))
    assert d.resolve_path(d.model.card) == (tmp_path / "card").resolve()


def test_local_url_brackets_ipv6_literals():
    from conftest import spec_data

    from runbook.core import spec as spec_mod
    url = {h: spec_mod.from_dict(spec_data(**{"serving.host": h})).serving.local_url for h in ("::1", "0.0.0.0", "::", "10.0.0.5")}
    assert url == {"::1": "http://[::1]:30000", "0.0.0.0": "http://127.0.0.1:30000", "::": "http://127.0.0.1:30000",
                   "10.0.0.5": "http://10.0.0.5:30000"}
