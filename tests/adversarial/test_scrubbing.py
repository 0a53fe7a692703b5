"""Secrets scrubbed in every form (raw, JSON-, HTML-, URL-encoded) and everywhere the runner writes:
the archive and its own stdout/stderr (cron's log). Issue 13."""
import html
import json
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import markupsafe
import pytest
from conftest import DEFAULT_SPEC, REPO, RUNNER_PARAMS, make_notebook

from runbook.core import secrets

SECRET = 'Pl4nted&<"se\'k/ret+=x y>Z9'   # & < > " ' / + = and a space: every encoder changes it


def spellings(s: str) -> dict[str, str]:
    """The forms a value takes in output, computed independently of the scrubber."""
    forms = {
        "raw": s,
        "json": json.dumps(s)[1:-1],
        "html": html.escape(s),
        "html-noquote": html.escape(s, quote=False),
        "html-markupsafe": str(markupsafe.escape(s)),
        "url": urllib.parse.quote(s, safe=""),
        "url-path": urllib.parse.quote(s),
        "url-plus": urllib.parse.quote_plus(s),
    }
    forms["json-of-html"] = json.dumps(forms["html"])[1:-1]
    forms["json-of-markupsafe"] = json.dumps(forms["html-markupsafe"])[1:-1]
    return forms


@pytest.mark.parametrize("form", sorted(spellings(SECRET)))
def test_redact_text_scrubs_each_form(form):
    spelled = spellings(SECRET)[form]
    text = f"before {spelled} after"
    out = secrets.redact_text(text, {SECRET})
    assert spelled not in out and out == f"before {secrets.MASK} after"


@pytest.mark.parametrize("form", sorted(spellings(SECRET)))
def test_redact_tree_scrubs_each_form(tmp_path, form):
    spelled = spellings(SECRET)[form]
    f = tmp_path / "sub" / "out.html"
    f.parent.mkdir()
    f.write_text(f"<pre>{spelled}</pre>")
    f.chmod(0o640)
    assert secrets.redact_tree(tmp_path, {SECRET}) == [f]
    assert f.read_text() == f"<pre>{secrets.MASK}</pre>" and f.stat().st_mode & 0o777 == 0o640


def test_short_values_are_not_scrubbed_and_minimum_is_documented():
    assert secrets.MIN_LEN == 6 and "Minimum secret length scrubbed: 6" in (secrets.__doc__ or "")
    assert secrets.redact_text("a 12345 b", {"12345"}) == "a 12345 b"
    assert secrets.redact_text("a 123456 b", {"123456"}) == f"a {secrets.MASK} b"


def test_read_env_file_quotes_and_export(tmp_path):
    p = tmp_path / "s.env"
    p.write_text("# c\nexport HF_TOKEN='hf_abcdef123'\nSGLANG_API_KEY=\"k&<\\\"x12\"\n\n")
    assert secrets.read_env_file(p) == {"HF_TOKEN": "hf_abcdef123", "SGLANG_API_KEY": 'k&<\\"x12'}


def _spec(tmp: Path, env_file: str, api_key_env: str) -> Path:
    text = DEFAULT_SPEC.read_text()
    text = re.sub(r"^(\s*)env_file: .*$", rf"\1env_file: {env_file}", text, count=1, flags=re.M)
    text = re.sub(r"^(\s*)api_key_env: .*$", rf"\1api_key_env: {api_key_env}", text, count=1, flags=re.M)
    (tmp / "specs").mkdir()
    p = tmp / "specs" / "dep.yaml"
    p.write_text(text)
    return p


def _leaky_notebook(d: Path, var: str, file_secret: str) -> None:
    """Prints the API key (from the variable the spec names) in every form, and the env_file's
    value, shows them as HTML, then raises with the key in the message."""
    make_notebook(
        d / "00_leak.ipynb", RUNNER_PARAMS,
        "import html, json, os, urllib.parse\n"
        f"k = os.environ[{var!r}]\n"
        f"f = {file_secret!r}\n"
        "print(k, json.dumps(k), html.escape(k), urllib.parse.quote(k, safe=''), urllib.parse.quote_plus(k), f)\n"
        "from IPython.display import HTML, display\n"
        "display(HTML('<b>' + html.escape(k) + '</b>'))\n"
        "k",
        "raise ValueError('bad key ' + k + ' in ' + f)",
    )


@pytest.mark.notebook
def test_end_to_end_secret_is_nowhere_in_archive_or_runner_output(tmp_path):
    var = "RB_PLANTED_CLIENT"  # a name that does not itself look secret: only the spec says it holds one
    assert not secrets.is_secret_key(var)
    file_secret = "fileSecret-0123456789&<q"
    spec = _spec(tmp_path, "secrets.env", var)                      # relative: next to the spec, not in the CWD
    (tmp_path / "specs" / "secrets.env").write_text(f"OTHER_VALUE={file_secret}\n")
    nbs = tmp_path / "nbs"
    _leaky_notebook(nbs, var, file_secret)
    out = tmp_path / "out"
    env = dict(__import__("os").environ, **{var: SECRET})
    cp = subprocess.run([sys.executable, "-m", "runbook", "run", "--deployment", str(spec), "--out", str(out),
                         "--notebooks", str(nbs)], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert cp.returncode == 2, cp.stderr                            # the notebook raised
    assert "ValueError: bad key" in cp.stderr and secrets.MASK in cp.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.suffix == ".html" for p in files) and any(p.suffix == ".ipynb" for p in files)
    for value in (SECRET, file_secret):
        for form, spelled in spellings(value).items():
            assert spelled not in cp.stdout and spelled not in cp.stderr, (form, "runner output")
            for p in files:
                assert spelled.encode() not in p.read_bytes(), (form, p)
    summary = json.loads((out / "latest" / "summary.json").read_text())
    assert secrets.MASK in summary["notebooks"][0]["error"]


TOKEN = "hf_PlantedTok3n/+=9xQ"        # / + = : base64 and URL encoders both change it


def _leaked(files: list[Path], value: str) -> list[str]:
    """Files holding the value raw, JSON-escaped, base64 (standard or URL-safe) or URL-encoded."""
    import base64

    forms = {value, json.dumps(value)[1:-1], base64.b64encode(value.encode()).decode(), base64.urlsafe_b64encode(value.encode()).decode(),
             urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)}
    return [f"{p} ({f!r})" for p in files for f in forms if f.encode() in p.read_bytes()]


@pytest.mark.notebook
@pytest.mark.parametrize("param, secret, env, spec_changes", [
    # the HF token (a secret-named variable) in a URL's query
    (f"url=http://127.0.0.1:9/v1?token={urllib.parse.quote(TOKEN, safe='')}", TOKEN, {"HF_TOKEN": TOKEN}, {}),
    # the API key (the spec names its variable, whose name looks harmless) as an --arg what-if
    (f'args=["api-key={TOKEN}"]', TOKEN, {"RB_CLIENT_KEY": TOKEN}, {"serving.api_key_env": "RB_CLIENT_KEY"}),
    # a secret by its name only: the runner does not know the value, the name says it
    ('args=["hf-token=hf_OnlyTheNameTellsIt"]', "hf_OnlyTheNameTellsIt", {}, {}),
], ids=["hf-token-in-url", "api-key-as-arg", "secret-named-arg"])
def test_a_sigkilled_run_leaves_no_secret_from_its_parameters(tmp_path, param, secret, env, spec_changes):
    """A secret given as a notebook parameter used to be written into the in-progress notebook (and papermill's
    command line) and stay there, unscrubbed, after a SIGKILL. Now it never reaches a parameter: kill -9 the run
    while its notebook runs (if it runs at all) and no file anywhere under the test's folder holds it."""
    import os
    import signal
    import time

    import yaml
    from conftest import spec_data

    nbs, started, out = tmp_path / "nbs", tmp_path / "started", tmp_path / "out"
    make_notebook(nbs / "00_params.ipynb", RUNNER_PARAMS + 'url: str = ""\nargs: list = []\n',
                  f"import time\nopen({str(started)!r}, 'w').write('1')\ntime.sleep(300)")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_data(**spec_changes)))
    proc = subprocess.Popen([sys.executable, "-m", "runbook", "run", "--deployment", str(spec), "--out", str(out),
                             "--notebooks", str(nbs), "--param", param],
                            cwd=REPO, env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not started.exists():
            assert time.monotonic() < deadline, "the run neither refused nor started its notebook"
            time.sleep(0.2)
        if proc.poll() is None:
            time.sleep(1.0)                 # papermill has saved the notebook with its parameters cell
            proc.send_signal(signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    left = [p for p in tmp_path.rglob("*") if p.is_file() and p != spec]
    assert not _leaked(left, secret), _leaked(left, secret)
    assert proc.returncode == 2 and not started.exists(), (proc.returncode, stderr[-2000:])
    assert len(stderr.strip().splitlines()) == 1 and "--param" in stderr and "secret" in stderr, stderr
    assert secret not in stderr + stdout and not out.exists()


def test_an_error_quoting_what_was_typed_never_shows_a_secret(cli, tmp_path):
    """A one-line input error quotes the input (here a MODEL_DIR that is the token, pasted in the wrong place):
    the environment's secrets are masked in it."""
    cp = cli("kv", tmp_path / TOKEN, env={"HF_TOKEN": TOKEN}, timeout=60)
    assert cp.returncode == 2 and "no such directory" in cp.stderr and secrets.MASK in cp.stderr, cp.stderr
    assert not [f for f in spellings(TOKEN).values() if f in cp.stderr + cp.stdout], cp.stderr


def test_a_stage_flag_holding_an_environment_secret_is_not_echoed_in_its_error(monkeypatch, capsys):
    """A key pasted where a URL goes: the stage's one-line error names the flag, never the secret's value."""
    from runbook import cli

    key = "sk-live-0123456789abcdef"
    monkeypatch.setenv("SGLANG_API_KEY", key)
    assert cli.main(["bench", "--deployment", str(DEFAULT_SPEC), "--url", key]) == 2
    err = capsys.readouterr().err
    assert err.startswith("runbook bench: error: --url ") and key not in err and secrets.MASK in err
