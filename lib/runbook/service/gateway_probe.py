"""Validate a gateway argv with the gateway's own argument parser. Run by the gateway's interpreter (smg's wheel):

    python gateway_probe.py MODULE '<json [argv, ...]>'  ->  one JSON line: a list of {ok, version, error, errors[],
                                                             known_flags[], parsed{}}, one per argv

MODULE is the wheel's launcher (smg.launch_router); its parse_router_args(argv) is what `smg launch` runs. When an
argv fails, each flag is parsed on its own (beside --worker-urls) so every refused flag is named.
"""
import argparse
import contextlib
import importlib
import io
import json
import sys


def _parse(parse, argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parse(argv), None
    except SystemExit:
        lines = [ln for ln in err.getvalue().strip().splitlines() if ln.strip()]
        return None, lines[-1].split("error: ", 1)[-1] if lines else "argument error"
    except Exception as e:  # RouterArgs.from_cli_args's own checks
        return None, f"{type(e).__name__}: {e}"


def _chunks(argv):
    out, cur = [], None
    for a in argv:
        if a.startswith("--"):
            cur = (a.split("=", 1)[0], [a])
            out.append(cur)
        elif cur is not None:
            cur[1].append(a)
    return out


def _known(module):
    p = argparse.ArgumentParser()
    module.RouterArgs.add_cli_args(p, use_router_prefix=False)
    return sorted({o for a in p._actions for o in a.option_strings if o.startswith("--")})


def check(parse, argv, version, known):
    out = {"ok": False, "version": version, "errors": [], "known_flags": known, "parsed": {}}
    args, err = _parse(parse, argv)
    if args is not None:
        out["ok"] = True
        out["parsed"] = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, list)) or v is None}
        return out
    out["error"] = err
    base = [w for f, ws in _chunks(argv) if f == "--worker-urls" for w in ws]
    for flag, words in _chunks(argv):
        if flag == "--worker-urls":
            continue
        _, e = _parse(parse, base + words)
        if e:
            out["errors"].append({"flag": flag, "error": e})
    return out


def main():
    module_name, job = sys.argv[1], json.loads(sys.argv[2])
    from importlib import metadata  # lazy: as below, only in the gateway's interpreter

    module = importlib.import_module(module_name)
    dist = module_name.split(".")[0].replace("_", "-")
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = None
    known = _known(module)
    print(json.dumps([check(module.parse_router_args, a, version, known) for a in job], default=str))


if __name__ == "__main__":
    main()
