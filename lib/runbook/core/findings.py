"""The one result shape every check produces, and how it is shown and scored."""
from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal

Status = Literal["pass", "warn", "fail", "skip", "info"]
STATUSES: tuple[str, ...] = ("fail", "warn", "skip", "pass", "info")  # display order: worst first
_COLOURS = {"pass": "#d4edda", "warn": "#fff3cd", "fail": "#f8d7da", "skip": "#e2e3e5", "info": "#d1ecf1"}
_ANSI = {"pass": "32", "warn": "33", "fail": "31", "skip": "90", "info": "36"}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One check's outcome. `remedy` says what to do when status is warn or fail."""

    id: str
    status: Status
    title: str
    detail: str = ""
    evidence: str = ""
    remedy: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"finding {self.id}: status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {k: str(v) for k, v in d.items() if k in fields}  # status is checked in __post_init__
        return cls(**kwargs)


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    """Number of findings per status, every status present (zeros included)."""
    c: Counter[str] = Counter(f.status for f in findings)
    return {s: c.get(s, 0) for s in STATUSES}


def exit_code(findings: Iterable[Finding], strict: bool = False) -> int:
    """0 when nothing failed; 1 when a finding failed (or, with strict, warned or skipped)."""
    return exit_code_for(counts(findings), strict)


def exit_code_for(tally: dict[str, int], strict: bool = False) -> int:
    """exit_code() from per-status counts."""
    bad = ("fail", "warn", "skip") if strict else ("fail",)
    return 1 if any(tally.get(s, 0) for s in bad) else 0


def sort(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first, stable within a status."""
    return sorted(findings, key=lambda f: STATUSES.index(f.status))


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _per_item(f: Finding) -> tuple[str, str] | None:
    """(family, item) for a per-level or per-item finding: its title opens with `ITEM: ` and its id either ends
    with `.ITEM` (bench's `bench.token_count.c8`, "c8: ...": the family is the id without it) or is shared by
    the items (tune's `tune.ran`, "np4: ..."). Items may hold dots (a rate level `r0.5`)."""
    item, sep, _ = f.title.partition(": ")
    if not sep or not item or " " in item:
        return None
    if f.id.endswith("." + item) and len(f.id) > len(item) + 1:
        return f.id[: -len(item) - 1], item
    return f.id, item


def _ranges(texts: list[str]) -> str:
    """Texts that differ only in their figures as one text with each figure as its range (min–max)."""
    slots = [_NUMBER.findall(t) for t in texts]
    out = _NUMBER.split(texts[0])
    merged = []
    for col in zip(*slots, strict=True):
        lo, hi = (min(col, key=lambda x: float(x.replace(",", ""))), max(col, key=lambda x: float(x.replace(",", ""))))
        merged.append(lo if float(lo.replace(",", "")) == float(hi.replace(",", "")) else f"{lo}–{hi}")
    return "".join(p + (merged[i] if i < len(merged) else "") for i, p in enumerate(out))


def _joined(items: list[str], texts: list[str]) -> str:
    """One text when every item has it; else each distinct text once, prefixed with the items that have it."""
    if len(set(texts)) <= 1:
        return texts[0]
    by: dict[str, list[str]] = {}
    for i, t in zip(items, texts, strict=True):
        by.setdefault(t, []).append(i)
    return "; ".join(f"{', '.join(its)}: {t}" for t, its in by.items() if t)


def _row(family: str, subgroups: list[list[tuple[str, Finding]]]) -> Finding:
    """One row for a family's findings of one status: each subgroup (same words) names its items when there are
    several, one line each."""
    members = [m for sub in subgroups for m in sub]
    if len(members) == 1:
        return members[0][1]
    items = [i for i, _ in members]
    fs = [f for _, f in members]

    def rest(i: str, f: Finding) -> str:
        return f.title[len(i) + 2:]

    if len(subgroups) == 1:
        title = _ranges([rest(i, f) for i, f in members])
    else:
        title = "\n".join(f"{', '.join(i for i, _ in sub)}: {_ranges([rest(i, f) for i, f in sub])}" for sub in subgroups)
    worst = min((f.status for f in fs), key=STATUSES.index)
    return Finding(f"{family} ({', '.join(items)})", worst, title, detail=_joined(items, [f.detail for f in fs]),
                   evidence=_joined(items, [f.evidence for f in fs]), remedy=_joined(items, [f.remedy for f in fs]))


def grouped(findings: Iterable[Finding]) -> list[Finding]:
    """For display only: one row per kind of per-item finding and status. Its items' findings that say the same
    thing (figures aside) become one line naming the items, the worst status, each figure as its range; those
    that say different things with the same status become one line each in that row. The JSON keeps every
    finding; a finding with no siblings is shown as it is."""
    findings = list(findings)
    families: dict[str, dict[str, list[tuple[str, Finding]]]] = {}   # family -> words -> (item, finding)
    order: list[str | Finding] = []
    for f in findings:
        fam = _per_item(f)
        if fam is None:
            order.append(f)
            continue
        if fam[0] not in families:
            families[fam[0]] = {}
            order.append(fam[0])
        families[fam[0]].setdefault(_NUMBER.sub("#", f.title[len(fam[1]) + 2:]), []).append((fam[1], f))
    out: list[Finding] = []
    for k in order:
        if isinstance(k, Finding):
            out.append(k)
            continue
        by_status: dict[str, list[list[tuple[str, Finding]]]] = {}
        for sub in families[k].values():
            by_status.setdefault(min((f.status for _, f in sub), key=STATUSES.index), []).append(sub)
        out.extend(_row(k, subs) for subs in by_status.values())
    return out


ACTION = ("fail", "warn")     # what a verdict shows in full: what needs the operator
EVIDENCE_CHARS = 160          # a verdict's evidence: one line; the whole text is in the run's JSON


def _one_line(text: str, limit: int = EVIDENCE_CHARS) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    cut = first if len(first) <= limit else first[: limit - 1].rstrip() + "…"
    return cut + (" … (the whole text: the run's JSON)" if cut != text.strip() else "")


def verdict(findings: Iterable[Finding]) -> list[Finding]:
    """What a notebook's verdict shows: fail and warn rows (grouped, evidence cut to one line), then one line each
    for the checks that passed, could not run, or only inform, naming them. Every finding stays in the JSON and in
    the section that explains it."""
    rows = sort(grouped(findings))
    out = [dataclasses.replace(f, evidence=_one_line(f.evidence)) for f in rows if f.status in ACTION]
    for status in ("skip", "pass", "info"):
        these = [f for f in rows if f.status == status]
        if these:
            names = ", ".join(f.id for f in these)
            out.append(Finding(f"{len(these)} {status}", status, _one_line(names, 240).removesuffix(
                " … (the whole text: the run's JSON)")))
    return out


def to_frame(findings: Iterable[Finding]):
    import pandas as pd  # lazy: pandas (~0.35 s); every CLI verb imports this module

    rows = [f.to_dict() for f in findings]
    return pd.DataFrame(rows, columns=[f.name for f in dataclasses.fields(Finding)])


def styled(findings: Iterable[Finding]):
    """A pandas Styler: status cells coloured, long text wrapped, remedies visible."""
    df = to_frame(sort(grouped(findings)))
    return (
        df.style.hide(axis="index")
        .map(lambda s: f"background-color: {_COLOURS.get(s, '')}; font-weight: bold", subset=["status"])
        .set_properties(**{"text-align": "left", "white-space": "pre-wrap", "vertical-align": "top"})
        # a log tail or a path is one long word: break it rather than widen the table past the page
        .set_properties(subset=["detail", "evidence", "remedy"], **{"overflow-wrap": "anywhere"})
        .set_table_styles([{"selector": "th", "props": "text-align: left"}])
    )


def format_text(findings: Iterable[Finding], colour: bool = False) -> str:
    """Plain-text listing for the CLI: one line per finding, remedy indented below."""
    findings = list(findings)
    lines = []
    for f in sort(grouped(findings)):
        tag = f"[{f.status.upper():4}]"
        if colour:
            tag = f"\033[{_ANSI[f.status]}m{tag}\033[0m"
        line = f"{tag} {f.id}: " + f.title.replace("\n", "\n" + " " * 9)   # a folded row's lines, indented
        if f.detail:
            line += f" — {f.detail}"
        lines.append(line)
        if f.remedy and f.status in ("warn", "fail"):
            lines.append(f"         fix: {f.remedy}")
    c = counts(findings)
    lines.append(", ".join(f"{n} {s}" for s, n in c.items() if n) or "no findings")
    return "\n".join(lines)


def to_json(findings: Iterable[Finding]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=2)
