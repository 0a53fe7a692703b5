"""What a notebook's first and last cells call, so notebooks hold no logic of their own."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runbook.core import registry
from runbook.core import spec as spec_mod
from runbook.core.errors import RunbookError
from runbook.core.findings import Finding, format_text, sort, styled, verdict
from runbook.core.options import from_params
from runbook.runner import results


def load_spec(deployment: str) -> spec_mod.Deployment:
    """Load the deployment spec named by the notebook's `deployment` parameter."""
    return spec_mod.load(deployment or None)


def options(stage: str, **params: Any) -> Any:
    """The notebook's parameters as its stage's options, validated by the same model the CLI's flags
    come from. None means "the spec's value" (papermill injects None as None), so it is dropped, exactly
    as an absent flag; 0, False, "" and [] are values. The runner's own parameters are options fields of the same
    name (`artifact_dir`, whose CLI flag is --out)."""
    return from_params(registry.get(stage).options, params)


def show(findings: Iterable[Finding]):
    """Display the verdict as a colour-coded table: what needs action in full, then one line each for what passed,
    skipped or informs (findings.verdict); a plain listing of every finding outside Jupyter."""
    findings = sort(findings)
    if _ipython():
        from IPython.display import display  # lazy: IPython only inside a kernel

        display(styled(verdict(findings)))
        return None
    print(format_text(findings))
    return None


def findings(report: Any, prefix: str) -> None:
    """A section's own findings in full (e.g. the KV study's `accuracy.kvquant` rows), where the verdict gave them
    one line; nothing when the report is empty (an input error) or has none."""
    mine = [f for f in getattr(report, "findings", None) or [] if f.id == prefix or f.id.startswith(prefix + ".")]
    if not mine:
        return
    if _ipython():
        from IPython.display import display  # lazy: IPython only inside a kernel

        display(styled(mine))
        return
    print(format_text(mine))


def table(*frames: Any) -> None:
    """Display each frame formatted for a reader ("—" for missing, figures to their precision, headers that
    wrap); printed as text outside Jupyter. A list stands for its frames; None (a display function's answer for an
    empty report), empty frames and frames with no value at all are skipped."""
    from runbook.core import tables  # lazy: pandas (~0.35 s); notebooks import this module before any table

    for df in _flat(frames):
        if df is None or df.empty or df.isna().all().all():   # a table of gaps says nothing its heading does not
            continue
        if _ipython():
            from IPython.display import display  # lazy: IPython only inside a kernel

            display(tables.style(df))
        else:
            print(tables.text(df))


def text(*texts: str | None) -> None:
    """Print each text; None (a display function's answer for an empty report) and "" print nothing."""
    for t in texts:
        if t:
            print(t)


def _flat(items: Iterable[Any]) -> list[Any]:
    return [x for it in items for x in (it if isinstance(it, (list, tuple)) else [it])]


def _ipython() -> bool:
    try:
        from IPython import get_ipython  # lazy: IPython only inside a kernel
    except ImportError:  # pragma: no cover
        return False
    return get_ipython() is not None


def finish(notebook: str, findings: Iterable[Finding], results_path: str = "", deployment: str | None = None,
           data: dict[str, Any] | None = None) -> list[Finding]:
    """Show the findings and, when the runner gave a results path, record them with the data."""
    findings = list(findings)
    show(findings)
    if results_path:
        data = {k: v for k, v in (data or {}).items() if k != "findings"}
        results.save(Path(results_path), notebook, findings, deployment=deployment, **data)
    return findings


def evaluate(stage: str, spec: spec_mod.Deployment, results_path: str = "", **params: Any) -> Any:
    """A notebook's one call: the stage's entry point on its parameters (`options`), the findings shown first and
    recorded with the report's data. An input the stage cannot use (a missing file, a bad value) is the stage's one
    input finding (`<verb>.input`, a fail), shown and recorded the same way for every stage; an `Empty` report is
    returned then, for which every display function returns None, so the later cells show nothing without a guard,
    the notebook completes and the run counts a failed check, not a broken notebook."""
    st = registry.get(stage)
    try:
        report = st.evaluate(spec, options(stage, **params))
    except RunbookError as err:
        empty = registry.Empty([st.input_finding(err)])
        finish(st.notebook, empty.findings, results_path, deployment=spec.name)
        return empty
    finish(st.notebook, report.findings, results_path, deployment=spec.name, data=report.data())
    return report
