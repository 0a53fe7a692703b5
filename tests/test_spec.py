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


# ---- hostile topologies: each one line naming the field ---------------------------------------------------------

def _r(name, host, port=30000, gpus=None):
    return {"name": name, "host": host, "port": port, **({"gpus": gpus} if gpus is not None else {})}


_GW = {"python": "/opt/smg/bin/python", "host": "gw", "port": 8000}


@pytest.mark.parametrize("changes, pattern", [
    ({"parallelism.tp": 4, "topology": {"replicas": [_r("a", "h", 30000, [0, 1, 2, 3]), _r("b", "h", 30001, [3, 4, 5, 6])]}},
     r"topology.replicas\[1\].gpus: GPU 3 on h is also replicas\[0\]'s"),
    ({"topology": {"replicas": [_r("a", "h"), _r("b", "h")]}},
     r"topology.replicas\[1\].port: h:30000 is also replicas\[0\]'s; give each replica on a host its own port"),
    ({"topology": {"replicas": [_r("a", "h"), _r("a", "h2")]}}, r"topology.replicas\[1\].name: 'a' is also replicas\[0\]'s"),
    ({"topology": {"gateway": _GW}}, r"topology.gateway: a gateway needs replicas to route to"),
    ({"topology": {"replicas": [_r("a", "gw", 8000)], "gateway": _GW}},
     r"topology.gateway.port: gw:8000 is also replicas\[0\]'s port"),
    ({"topology": {"replicas": [_r("a", "h")], "gateway": {**_GW, "prometheus_port": 8000}}},
     r"topology.gateway.prometheus_port: 8000 is also gateway.port"),
    ({"topology": {"replicas": [_r("a", "h")], "gateway": {**_GW, "flags": {"policy": "random"}}}},
     r"topology.gateway.flags.policy: set it through topology.gateway.policy"),
    ({"topology": {"replicas": [_r("a", "h")], "gateway": {**_GW, "flags": {"api-key": "sk-x"}}}},
     r"topology.gateway.flags.api-key: set it through topology.gateway.api_key_env \(never inline a key\)"),
    ({"topology": {"replicas": [_r("a", "h")], "gateway": {**_GW, "api_key_env": "1KEY"}}},
     r"topology.gateway.api_key_env: '1KEY' is not an environment variable name"),
    ({"topology": {"replicas": [_r("a", "h")], "gateway": {**_GW, "policy": "fastest"}}},
     r"topology.gateway.policy: Input should be 'random', 'round_robin'"),
    ({"topology": {"replicas": [_r("A_1", "h")]}}, r"topology.replicas.0.name: String should match pattern"),
    ({"topology": {"replicas": [_r("a", "h", 0)]}}, r"topology.replicas.0.port: Input should be greater than 0"),
    ({"topology": {"replicas": [_r("a", "h", gpus=[0, 0, 1, 2, 3, 4, 5, 6])]}},
     r"topology.replicas.0.gpus: a GPU index is listed twice"),
    ({"topology": {"replicas": [_r("a", "h", gpus=[0, 1, 2, 3])]}},
     r"topology.replicas\[0\].gpus: 4 GPUs listed but one server needs 8 \(parallelism tp × pp\)"),
    ({"parallelism.tp": 4, "topology": {"replicas": [_r("a", "h", gpus=[4, 5, 6, 8])]}},
     r"topology.replicas\[0\].gpus: GPU 8 does not exist on a host of hardware.gpu_count 8"),
    ({"parallelism.tp": 4, "topology": {"replicas": [_r("a", "h", 1, [0, 1, 2, 3]), _r("b", "h", 2, [4, 5, 6, 7]),
                                                      _r("c", "h", 3, [0, 1, 2, 3])]}},
     r"topology.replicas\[2\].gpus: GPU 0 on h is also replicas\[0\]'s"),
    ({"topology": {"replicas": [_r("a", "h", 1), _r("b", "h", 2)]}},
     r"topology.replicas\[0\].gpus: 2 replicas share h; give each its own GPU indexes"),
    ({"parallelism.nodes": [{"name": "n0", "address": "10.0.0.1"}, {"name": "n1", "address": "10.0.0.2"}],
      "topology": {"replicas": [_r("a", "h")]}},
     r"topology.replicas: each replica here is one node; .* declare either replicas or nodes"),
    # one server across nodes: a tp the nodes' GPUs cannot hold, a tp not a multiple of the nodes, a PP placement
    # SGLang's launcher leaves a rank out of
    ({"parallelism.tp": 32, "parallelism.nodes": [{"name": "n0", "address": "a"}, {"name": "n1", "address": "b"}]},
     r"parallelism needs 32 GPUs \(tp 32 × pp 1\) but hardware.gpu_count is 8 × 2 nodes"),
    ({"parallelism.tp": 9, "parallelism.nodes": [{"name": "n0", "address": "a"}, {"name": "n1", "address": "b"}]},
     r"parallelism.tp: tp × pp \(9\) must be a multiple of the 2 nodes"),
    ({"parallelism.tp": 2, "parallelism.pp": 3,
      "parallelism.nodes": [{"name": "n0", "address": "a"}, {"name": "n1", "address": "b"}]},
     r"parallelism.pp: 3 over 2 nodes: PP rank 2, TP rank 0 would run on no node .* make pp a multiple or a divisor"),
    ({"parallelism.nodes": [{"name": "n 0", "address": "a"}, {"name": "n1", "address": "b"}]},
     r"parallelism.nodes.0.name: String should match pattern"),
])
def test_hostile_topologies_give_one_line_naming_the_field(tmp_path, changes, pattern):
    from conftest import spec_data

    with pytest.raises(SpecError, match=pattern) as e:
        spec.load(_write(tmp_path, spec_data(**changes)))
    assert "\n" not in str(e.value) and "d.yaml" in str(e.value)
    assert "sk-x" not in str(e.value)   # a key written inline is never echoed


def test_the_replicas_example_spec_loads_and_lists_each_server():
    from conftest import REPO

    d = spec.load(REPO / "deployments" / "qwen3.5-397b-a17b-nvfp4-replicas.yaml")
    assert d.servers == [("r1", "http://gpu-01.example.com:30000"), ("r2", "http://gpu-02.example.com:30000")]
    assert (d.topology.gateway.binary, d.topology.gateway.policy, d.topology.gateway.url) == (
        "smg", "cache_aware", "http://gw-01.example.com:8000")
    base = spec.load()
    assert d.serving.flags == base.serving.flags and d.parallelism == base.parallelism


@pytest.mark.parametrize("section, values, shown", [
    ("archive", {"url": "s3x//SECRETish"}, False), ("archive", {"url": "s3://k:SECRETish@b/p"}, False),
    ("alerts", {"link_base": "ftp://SECRETish"}, False), ("alerts", {"textfile_dir": "rel/SECRETish"}, True),
])
def test_a_refused_value_shows_once_and_never_for_a_field_marked_echo_false(section, values, shown):
    """The spec's error adds the value itself (its validators never quote it), except for a field that may carry
    credentials: the field says so (`"echo": False`), not the message's words."""
    d = _base()
    with pytest.raises(SpecError) as e:
        spec.from_dict({**d, section: {**(d.get(section) or {}), **values}}, "x.yaml")
    assert str(e.value).count("SECRETish") == (1 if shown else 0), str(e.value)
