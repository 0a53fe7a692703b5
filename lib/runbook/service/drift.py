"""The running server against the unit: /server_info (redacted) compared flag by flag."""
from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

from runbook.core.findings import Finding
from runbook.core.secrets import MASK, is_secret_key
from runbook.core.spec import Deployment
from runbook.service import unitfile
from runbook.service.render import Build, build


def _get(url: str, api_key: Optional[str], timeout: float = 10.0) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


_SECRET_OPT = re.compile(r"(--[a-z0-9-]*(?:api-key|token|password|secret)[a-z0-9-]*)(\s+|=)(\S+)", re.I)


def _redact_words(words: list[Any], api_key: Optional[str]) -> list[Any]:
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


def _redact_value(v: Any, api_key: Optional[str]) -> Any:
    if isinstance(v, str):
        v = _SECRET_OPT.sub(lambda m: m.group(1) + m.group(2) + MASK, v)
        return v.replace(api_key, MASK) if api_key else v
    if isinstance(v, dict):
        return redact_server_info(v, api_key)
    if isinstance(v, (list, tuple)):
        return _redact_words(list(v), api_key)
    return v


def redact_server_info(info: dict[str, Any], api_key: Optional[str] = None) -> dict[str, Any]:
    """/server_info returns api_key, admin_api_key, ssl_keyfile_password and launch_command in clear.

    Secret-named keys are masked; every string anywhere (launch_command as a string with any
    whitespace, or as an argv list) has secret options' values and the API key itself masked."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        if is_secret_key(k) or "password" in k:
            out[k] = MASK if v else v
        else:
            out[k] = _redact_value(v, api_key)
    return out


def _same(a: Any, b: Any) -> bool:
    norm = {"bf16": "bfloat16"}
    sa, sb = str(a).lower(), str(b).lower()
    sa, sb = norm.get(sa, sa), norm.get(sb, sb)
    if sa == sb:
        return True
    try:
        return float(sa) == float(sb)
    except ValueError:
        return False


def drift(spec: Deployment, url: Optional[str] = None, args: Optional[dict[str, Any]] = None,
          fetch: Callable[[str, Optional[str]], Any] = _get,
          built: Optional[Build] = None) -> tuple[list[dict[str, str]], list[Finding], dict[str, Any]]:
    """Compare the running server's effective arguments with the unit `install` writes (recommendations included)."""
    base = (url or spec.serving.local_url).rstrip("/")
    api_key = os.environ.get(spec.serving.api_key_env) if spec.serving.api_key_env else None
    info = None
    for path in ("/server_info", "/get_server_info"):
        try:
            info = fetch(base + path, api_key)
            break
        except urllib.error.HTTPError as e:
            if e.code == 401:
                return [], [Finding("service.drift", "fail", f"{base} refused the API key (401)",
                                    remedy=f"Export {spec.serving.api_key_env or 'the API key variable'} for this run.")], {}
            continue
        except (urllib.error.URLError, OSError, ValueError) as e:
            return [], [Finding("service.drift", "skip", f"no server reachable at {base}", evidence=str(getattr(e, "reason", e)),
                                remedy="Start the service, or give the server's URL.")], {}
    if not isinstance(info, dict):
        return [], [Finding("service.drift", "skip", f"{base} has no /server_info", remedy="Is this an SGLang server?")], {}
    info = redact_server_info(info, api_key)
    r = (built or build(spec, args)).unit
    expected = unitfile.flags_of(r.argv[3:])
    expected.pop("api-key", None)
    rows, findings = [], []
    want: str | bool
    for flag, want in expected.items():
        key = flag.replace("-", "_")
        if key not in info:
            continue
        have = info[key]
        if want == "true":
            want = True
        if not _same(have, want):
            rows.append({"flag": flag, "spec": str(want), "server": str(have)})
    try:
        models = fetch(base + "/v1/models", api_key)
        served = [m.get("id") for m in models.get("data", [])]
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        served = []
    for row in rows:
        findings.append(Finding(f"service.drift.{row['flag']}", "fail", f"server runs --{row['flag']} {row['server']}, the spec says {row['spec']}",
                                remedy="Restart the service from the rendered unit (`service install --yes`), or update the spec if the server is right."))
    kv_in_use = info.get("kv_cache_dtype")
    if not rows:
        findings.append(Finding("service.drift", "pass", f"running server matches the spec on {sum(1 for f in expected if f.replace('-', '_') in info)} flags",
                                detail=f"KV cache dtype in use: {kv_in_use}; serving {', '.join(map(str, served)) or '?'}"))
    subset: dict[str, Any] = {k: info.get(k) for k in ("model_path", "kv_cache_dtype", "tp_size", "context_length", "max_total_num_tokens",
                                       "max_running_requests", "version", "launch_command") if k in info}
    subset["served_models"] = served
    return rows, findings, subset
