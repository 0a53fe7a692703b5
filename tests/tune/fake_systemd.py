"""A stand-in for systemd where none runs (containers, CI without systemd as PID 1): `systemd-run` and
`systemctl` that really start, watch and stop processes, with the unit state in a directory.

    fake_systemd.py systemd-run [--user] --unit=NAME [--property=StandardOutput=file:PATH] [--setenv=K[=V]] ... -- CMD...
    fake_systemd.py systemctl [--user] (--version | show UNIT [--property=..] | is-active UNIT | start UNIT | stop UNIT
                                        | kill --signal=SIG UNIT)

A unit's process runs under a small supervisor (as systemd would be its parent): the supervisor records
the main pid and, when it exits, its exit status, so `show` answers ExecMainStatus. The command runs in a
process group of its own, which stands for the unit's cgroup (stop: SIGTERM to the group, SIGKILL after
TimeoutStopSec). Like a service under systemd it gets a clean environment: PATH plus the --setenv names.
`start UNIT` starts the command stored in STATE/UNIT.cmd.json ({"argv": [...], "log": PATH}), which is how a
test declares a "production" unit. Every call is appended to STATE/calls.jsonl; FAKE_SYSTEMD_FAIL lists
"verb:unit" pairs that fail (exit 1), FAKE_SYSTEMD_VERSION the version --version reports.
"""
import fnmatch
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_SYSTEMD_STATE", "/nonexistent"))


def _files(unit):
    return STATE / f"{unit}.pid", STATE / f"{unit}.status"


def _running_pid(unit):
    pid_file, _ = _files(unit)
    try:
        pid = int(pid_file.read_text())
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state in (b"Z", b"X") else pid


def _fails(verb, unit):
    return f"{verb}:{unit}" in os.environ.get("FAKE_SYSTEMD_FAIL", "").split(",")


def supervise(unit, log, env_json, argv):
    """The unit's parent: start the command in its own group, record its pid, then its exit status."""
    pid_file, status_file = _files(unit)
    status_file.unlink(missing_ok=True)
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd="/",
                                env=json.loads(env_json), start_new_session=True)
    except OSError as e:
        status_file.write_text(json.dumps({"code": 203, "error": e.strerror}))
        return 0
    tmp = pid_file.with_suffix(".tmp")
    tmp.write_text(str(proc.pid))
    os.replace(tmp, pid_file)
    rc = proc.wait()
    # SIGTERM is a clean end for a service (systemd's default SuccessExitStatus): inactive, not failed
    status_file.write_text(json.dumps({"code": 0 if rc == -signal.SIGTERM else rc if rc >= 0 else 128 - rc}))
    pid_file.unlink(missing_ok=True)
    return 0


def _start(unit, argv, log, env):
    if _running_pid(unit) is not None:
        return 0
    _, status_file = _files(unit)
    status_file.unlink(missing_ok=True)
    subprocess.Popen([sys.executable, __file__, "--supervise", unit, log or "", json.dumps(env), *argv],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _running_pid(unit) is not None:
            return 0
        if status_file.exists():
            err = json.loads(status_file.read_text()).get("error")
            if err:
                print(f"Job for {unit} failed: {err}", file=sys.stderr)
                return 1
            return 0
        time.sleep(0.02)
    print(f"Job for {unit} timed out", file=sys.stderr)
    return 1


def systemd_run(args):
    unit, log, env = None, None, {"PATH": os.defpath}
    i = 0
    while i < len(args) and args[i] != "--":
        a = args[i]
        if a.startswith("--unit="):
            unit = a.split("=", 1)[1]
        elif a.startswith("--property=StandardOutput=file:"):
            log = a.split("file:", 1)[1]
        elif a.startswith("--setenv="):
            kv = a.split("=", 1)[1]
            k, _, v = kv.partition("=")
            env[k] = v if "=" in kv else os.environ.get(k, "")
        i += 1
    argv = [a.replace("$$", "$") for a in args[i + 1:]]
    if unit is None or not argv:
        print("fake systemd-run: --unit= and a command are required", file=sys.stderr)
        return 1
    if _running_pid(unit) is not None:
        print(f"Failed to start transient service unit: Unit {unit} was already loaded or has a fragment file.", file=sys.stderr)
        return 1
    if _fails("systemd-run", unit):
        print(f"Job for {unit} failed.", file=sys.stderr)
        return 1
    return _start(unit, argv, log, env)


def _stop(unit, sig=signal.SIGTERM, timeout=15):
    pid = _running_pid(unit)
    if pid is None:
        return
    os.killpg(pid, sig)
    deadline = time.monotonic() + timeout
    while _running_pid(unit) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    if _running_pid(unit) is not None:
        os.killpg(pid, signal.SIGKILL)
    pid_file = _files(unit)[0]
    while pid_file.exists():       # the supervisor has recorded the exit (as systemd has once stop returns)
        time.sleep(0.02)


def _show(unit):
    pid = _running_pid(unit)
    _, status_file = _files(unit)
    if pid is not None:
        return {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "MainPID": str(pid), "ExecMainStatus": "0"}
    if status_file.exists():
        code = json.loads(status_file.read_text())["code"]
        state = "inactive" if code == 0 else "failed"
        return {"LoadState": "loaded", "ActiveState": state, "SubState": "dead" if code == 0 else "failed", "MainPID": "0",
                "ExecMainStatus": str(code)}
    return {"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead", "MainPID": "0", "ExecMainStatus": "0"}


def systemctl(args):
    args = [a for a in args if a != "--user"]
    if args == ["--version"]:
        print(f"systemd {os.environ.get('FAKE_SYSTEMD_VERSION', '252')} (fake)")
        return 0
    verb, rest = args[0], args[1:]
    unit = next((a for a in rest if not a.startswith("-")), "")
    if _fails(verb, unit):
        print(f"Job for {unit} failed.", file=sys.stderr)
        return 1
    if verb == "show":
        print("\n".join(f"{k}={v}" for k, v in _show(unit).items()))
        return 0
    if verb == "is-active":
        state = _show(unit)["ActiveState"]
        print(state)
        return 0 if state == "active" else 3
    if verb == "stop":   # a pattern stops every loaded unit it matches, as systemctl does
        units = [p.name[:-4] for p in STATE.glob("*.pid") if fnmatch.fnmatch(p.name[:-4], unit)] if "*" in unit else [unit]
        for u in units:
            _stop(u)
            _files(u)[1].unlink(missing_ok=True)     # --collect: the unit is gone
        return 0
    if verb == "kill":
        sig = next((a.split("=", 1)[1] for a in rest if a.startswith("--signal=")), "SIGTERM")
        pid = _running_pid(unit)
        if pid is not None:
            os.killpg(pid, getattr(signal, sig))
        return 0
    if verb == "start":
        cmd = json.loads((STATE / f"{unit}.cmd.json").read_text())
        return _start(unit, cmd["argv"], cmd.get("log"), {"PATH": os.defpath, **cmd.get("env", {})})
    print(f"fake systemctl: unsupported {verb}", file=sys.stderr)
    return 1


def main(argv):
    if argv[0] == "--supervise":
        return supervise(argv[1], argv[2], argv[3], argv[4:])
    with open(STATE / "calls.jsonl", "a") as fh:
        fh.write(json.dumps(argv) + "\n")
    tool, args = argv[0], argv[1:]
    return systemd_run(args) if tool == "systemd-run" else systemctl(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
