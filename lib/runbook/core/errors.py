"""Exception tree. Expected problems are Findings; exceptions mean "could not check".

    RunbookError          base
     ├── SpecError        deployment spec or parameter invalid (CLI exit 2)
     ├── InputError       a model dir, config or file unreadable or unrecognised
     ├── LockHeld         another run holds the deployment's lock (CLI exit 75)
     └── SafetyStop       a change to what serves production that the operator has not allowed (CLI exit 77)
"""
import re

# A setting a message names as `{field}` (core/options.py `located`: the flag on the command line, the parameter in
# a notebook); not a shell's or a unit's `${VAR}`.
FIELD_REF = re.compile(r"(?<!\$)\{([a-z][a-z0-9_]*)\}")


class RunbookError(Exception):
    """Base of every error the runbook raises on purpose. Its text names each setting by its Python name (what a
    library caller passes); `template` keeps the `{field}` marks for Stage.input_finding to locate."""

    @property
    def template(self) -> str:
        return super().__str__()

    def __str__(self) -> str:
        return FIELD_REF.sub(r"\1", self.template)


class SpecError(RunbookError):
    """The deployment spec or a parameter is invalid."""


class InputError(RunbookError):
    """An input file or directory is missing, unreadable or not understood."""


class LockHeld(RunbookError):
    """Another run of the same deployment holds the lock."""


EXIT_LOCKED = 75          # sysexits' EX_TEMPFAIL: another run holds the lock; cron tries again later
EXIT_SAFETY_STOP = 77     # sysexits' EX_NOPERM: not allowed without the operator's consent


class SafetyStop(RunbookError):
    """Stopped before changing what serves production, because the operator has not allowed it (e.g. without
    `--yes`): not an error in the input, a stop on purpose."""
