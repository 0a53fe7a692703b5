"""The running server against the unit: /server_info (redacted) compared flag by flag."""
from __future__ import annotations

import os
import re
import urllib.error
from collections.abc import Callable
from typing import Any

from runbook.core.findings import Finding
from runbook.core.secrets import MASK, is_secret_key
from runbook.core.spec import Deployment
from runbook.endpoint.reach import BadResponse, failure_finding, fetch_json, served_models
from runbook.model import sglang_names
from runbook.service import unitfile
from runbook.service.render import Build, Rendered, build


def get_json(url: str, api_key: str | None, timeout: float = 10.0) -> Any:
    """Bounded in size and time (reach.fetch_json): a body that never ends or is gigabytes long is a BadResponse."""
    return fetch_json(url, api_key, timeout=timeout, expect=None)


_SECRET_OPT = re.compile(r"(--[a-z0-9-]*(?:api-key|token|password|secret)[a-z0-9-]*)(\s+|=)(\S+)", re.I)


def _redact_words(words: list[Any], api_key: str | None) -> list[Any]:
    """An argv list: the word after a secret option (or its =value) is masked."""
    out, mask_next = [], False
    for w in words:
        if not isinstance(w, str):
            out.append(_redact_value(w, api_key))
            continue
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        opt, eq, _ = w.partition("=")
        if opt.startswith("--") and is_secret_key(opt.lstrip("-")):
            out.append(f"{opt}={MASK}" if eq else w)
            mask_next = not eq
            continue
        out.append(_redact_value(w, api_key))
    return out


def _redact_value(v: Any, api_key: str | None) -> Any:
    if isinstance(v, str):
        v = _SECRET_OPT.sub(lambda m: m.group(1) + m.group(2) + MASK, v)
        return v.replace(api_key, MASK) if api_key else v
    if isinstance(v, dict):
        return redact_server_info(v, api_key)
    if isinstance(v, (list, tuple)):
        return _redact_words(list(v), api_key)
    return v


def redact_server_info(info: dict[str, Any], api_key: str | None = None) -> dict[str, Any]:
    """/server_info returns api_key, admin_api_key, ssl_keyfile_password and launch_command in clear.

    Secret-named keys are masked; every string anywhere (launch_command as a string with any
    whitespace, or as an argv list) has secret options' values and the API key itself masked."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        # a number is no secret: SGLang's memory_usage.token_capacity is named like one
        if (is_secret_key(k) or "password" in k) and not isinstance(v, (int, float)):
            out[k] = MASK if v else v
        else:
            out[k] = _redact_value(v, api_key)
    return out


def _same(a: Any, b: Any) -> bool:
    sa, sb = str(a).lower(), str(b).lower()
    sa, sb = sglang_names.kv_dtype_name(sa) or sa, sglang_names.kv_dtype_name(sb) or sb   # bf16 is bfloat16
    if sa == sb:
        return True
    try:
        return float(sa) == float(sb)
    except ValueError:
        return False


# Runtime state /server_info reports (resolved server arguments and the scheduler's info), and the
# SGLang flag that sets each: compared with the unit as built even when the spec leaves the flag unset.
RUNTIME_KEYS = {"kv_cache_dtype": "kv-cache-dtype", "context_length": "context-length",
                "max_total_num_tokens": "max-total-tokens", "max_running_requests": "max-running-requests",
                "mem_fraction_static": "mem-fraction-static", "page_size": "page-size"}


def server_state(info: dict[str, Any]) -> dict[str, Any]:
    """The runtime values in a /server_info answer: top level first, else the first DP rank's internal state."""
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    out: dict[str, Any] = {}
    for key in RUNTIME_KEYS:
        v = info.get(key)
        if v is None:
            v = first.get(key)
        if v is not None:
            out[key] = v
    return out


def drift(spec: Deployment, url: str | None = None, args: dict[str, Any] | None = None,
          fetch: Callable[[str, str | None], Any] = get_json,
          built: Build | None = None, unit: Rendered | None = None) -> tuple[list[dict[str, str]], list[Finding], dict[str, Any]]:
    """Compare the running server's effective arguments with the unit `install` writes (recommendations included);
    `unit`: one of the built units (a replica's), default the first."""
    base = (url or spec.serving.local_url).rstrip("/")
    api_key = os.environ.get(spec.serving.api_key_env) if spec.serving.api_key_env else None
    raw, problems = _server_info(spec, base, api_key, fetch)
    if raw is None:
        return [], problems, {}
    info = redact_server_info(raw, api_key)
    b = built or build(spec, args)
    expected = unitfile.flags_of((unit or b.unit).argv[3:])
    expected.pop("api-key", None)
    state = server_state(info)
    rows = _flag_rows(expected, info) + _runtime_rows(expected, info, state, b)
    try:
        served = served_models(fetch(base + "/v1/models", api_key), base + "/v1/models")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):   # BadResponse is a ValueError
        served = []
    findings = [Finding(f"service.drift.{row['flag']}", "fail",
                        f"server runs --{row['flag']} {row['server']}, the spec says {row['spec']}",
                        remedy="Restart the service from the rendered unit (`service install --yes`), "
                               "or update the spec if the server is right.")
                for row in rows]
    if not rows:
        n = len({f for f in expected if f.replace('-', '_') in info} | {f for k, f in RUNTIME_KEYS.items() if k in state})
        findings.append(Finding("service.drift", "pass", f"running server matches the unit on {n} flags and runtime values",
                                detail=f"KV cache dtype in use: {info.get('kv_cache_dtype')}; "
                                       f"serving {', '.join(map(str, served)) or '?'}"))
    subset: dict[str, Any] = {k: info.get(k) for k in ("model_path", "kv_cache_dtype", "tp_size", "context_length",
                                                       "max_total_num_tokens", "max_running_requests", "version",
                                                       "launch_command") if k in info}
    subset.update({k: v for k, v in state.items() if subset.get(k) is None})
    states = info.get("internal_states")
    mem = states[0].get("memory_usage") if isinstance(states, list) and states and isinstance(states[0], dict) else None
    if isinstance(mem, dict):
        subset["memory_usage"] = mem     # SGLang's own account: weight, kvcache, token_capacity, startup_available (GiB)
    subset["served_models"] = served
    return rows, findings, subset


def _server_info(spec: Deployment, base: str, api_key: str | None,
                 fetch: Callable[[str, str | None], Any]) -> tuple[dict[str, Any] | None, list[Finding]]:
    """The server's /server_info (or the older /get_server_info), or None and the finding that says why not."""
    info = None
    for path in ("/server_info", "/get_server_info"):
        try:
            info = fetch(base + path, api_key)
            break
        except urllib.error.HTTPError as e:
            if e.code == 401:
                return None, [Finding("service.drift", "fail", f"{base} refused the API key (401)",
                                      remedy=f"Export {spec.serving.api_key_env or 'the API key variable'} for this run.")]
            continue
        except BadResponse as e:   # it answered, with HTML, garbage, too much or too slowly: not "no server"
            return None, [failure_finding("service.drift", base + path, e)]
        except (urllib.error.URLError, OSError, ValueError) as e:
            return None, [Finding("service.drift", "skip", f"no server reachable at {base}", evidence=str(getattr(e, "reason", e)),
                                  remedy="Start the service, or give the server's URL.")]
    if info is None:
        return None, [Finding("service.drift", "skip", f"{base} has no /server_info", remedy="Is this an SGLang server?")]
    if not isinstance(info, dict):
        return None, [failure_finding("service.drift", base + "/server_info",
                                      BadResponse(base + "/server_info", f"expected an object, got {type(info).__name__}"))]
    return info, []


def _flag_rows(expected: dict[str, str], info: dict[str, Any]) -> list[dict[str, str]]:
    """The unit's flags the server reports differently."""
    rows = []
    want: str | bool
    for flag, want in expected.items():
        key = flag.replace("-", "_")
        if key not in info or info[key] is None:
            continue
        have = info[key]
        if want == "true":
            want = True
        if not _same(have, want):
            rows.append({"flag": flag, "spec": str(want), "server": str(have)})
    return rows


def _runtime_rows(expected: dict[str, str], info: dict[str, Any], state: dict[str, Any], b: Build) -> list[dict[str, str]]:
    """Runtime values the unit leaves to SGLang's default, or that only the scheduler reports, that differ."""
    rows = []
    for key, flag in RUNTIME_KEYS.items():
        if key == flag.replace("-", "_") and flag in expected and info.get(key) is not None:
            continue   # compared with the flags
        want_rt = expected.get(flag)
        if key not in state:
            continue
        if want_rt is None and flag == "kv-cache-dtype":
            # unset in the unit: SGLang's `auto`, which the server may report resolved (the checkpoint's KV dtype)
            auto = getattr(getattr(b.quant, "kv_cache", None), "auto_resolves_to", None)
            if not (_same(state[key], "auto") or (auto and _same(state[key], auto))) and auto:
                rows.append({"flag": flag, "spec": f"auto (→ {auto})", "server": str(state[key])})
            continue
        if want_rt is None:
            continue
        if flag == "max-total-tokens":
            if int(state[key]) > int(want_rt):   # SGLang caps the pool at --max-total-tokens; fewer is memory
                rows.append({"flag": flag, "spec": f"at most {want_rt}", "server": str(state[key])})
            continue
        if not _same(state[key], want_rt):
            rows.append({"flag": flag, "spec": str(want_rt), "server": str(state[key])})
    return rows
