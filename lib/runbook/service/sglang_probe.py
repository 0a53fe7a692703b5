"""Validate an SGLang argv with SGLang's own parser. Run by the serving interpreter:

    python sglang_probe.py '<json argv>'   ->  one JSON line: {ok, version, error, errors[], known_flags[], resolved{}}
    python sglang_probe.py '<json [argv, ...]>'   ->  one JSON line: a list of those, one per argv (one import of
                                                      SGLang for many command lines: tune's candidates)

When the whole argv fails, each flag is parsed on its own so every problem is named.
"""
import argparse
import contextlib
import io
import json
import sys
from typing import Any


def _parse(prepare, argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return prepare(argv), None, None
    except SystemExit:
        lines = [ln for ln in err.getvalue().strip().splitlines() if ln.strip()]
        return None, (lines[-1] if lines else "argument error"), "argparse"
    except Exception as e:  # semantic checks in ServerArgs.__post_init__
        return None, f"{type(e).__name__}: {e}", "semantic"


def _flag_chunks(argv):
    """[(flag, [values])] from an argv of --flag [value ...] items (after --model-path)."""
    out, cur = [], None
    for a in argv:
        if a.startswith("--"):
            cur = (a.split("=", 1)[0], [a] if "=" in a else [a])
            out.append(cur)
        elif cur is not None:
            cur[1].append(a)
    return out


def check(prepare_server_args, argv, version, known):
    out: dict[str, Any] = {"ok": False, "version": version, "errors": [], "known_flags": known, "resolved": {}}
    args, err, kind = _parse(prepare_server_args, argv)
    if args is not None:
        out["ok"] = True
        for k, v in vars(args).items():
            if isinstance(v, (str, int, float, bool)) or v is None:
                out["resolved"][k] = v
    else:
        out["error"], out["kind"] = err, kind
        model = argv[argv.index("--model-path"):argv.index("--model-path") + 2] if "--model-path" in argv else []
        for flag, words in _flag_chunks(argv):
            if flag == "--model-path":
                continue
            _, e, k = _parse(prepare_server_args, model + words)
            if e and k == "argparse":  # a flag alone can fail semantic checks that the full argv passes
                out["errors"].append({"flag": flag, "error": e})
    return out


def main():
    job = json.loads(sys.argv[1])
    import sglang  # lazy: only the serving interpreter, which runs this script, has SGLang; importing the module elsewhere must work
    from sglang.srt.server_args import ServerArgs, prepare_server_args  # lazy: as sglang above

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    known = sorted({o for a in p._actions for o in a.option_strings if o.startswith("--")})
    version = getattr(sglang, "__version__", None)
    many = bool(job) and isinstance(job[0], list)
    res = [check(prepare_server_args, a, version, known) for a in job] if many else check(prepare_server_args, job, version, known)
    print(json.dumps(res, default=str))


if __name__ == "__main__":
    main()
