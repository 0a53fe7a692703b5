"""How every stage's table is shown, in a notebook (HTML) and in the CLI (text): missing values as "—",
each figure to the precision it carries, column headers that wrap so a table fits the page."""
from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

MISSING = "—"
# Column-name words -> decimals. Latencies and token rates carry a tenth; ratios, shares and request rates
# two places; first match wins, so "tok/s" is tried before "/s".
_DECIMALS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("_total",), 0),     # a Prometheus counter
    (("fraction",), 3),   # --mem-fraction-static is set to the thousandth
    ((" %",), 3),         # small errors in percent: 0.004 % is not 0
    (("tok/s", " ms", "_ms", "ms)"), 1),
    (("ratio", "rate", "hit", "usage", "share", "req/s", "/chunk", "per chunk", "accept"), 2),
    (("gib", "gb", "seconds", " s)", "(s)"), 2),
    # counts that pandas stores as floats once one level lacks them
    (("completed", "failed", "retracted", "aborted", "waiting", "running", "requests", "turn", "tokens", "count",
      "samples"), 0),
)
# Headers wrap (they are what makes a table of figures wide); text cells wrap too (a long word where it must),
# figures never do. Alignment is set per column in `style`: a rule on `td` here would outrank it.
_CSS = [{"selector": "thead th", "props": "white-space: normal; max-width: 8em; vertical-align: bottom"},
        {"selector": "tbody th", "props": "max-width: 8em; vertical-align: top"},
        {"selector": "td", "props": "white-space: normal; overflow-wrap: break-word; max-width: 40em; vertical-align: top"},
        {"selector": "", "props": "max-width: 100%; overflow-x: auto; display: block"}]


def decimals(column: Any, values: Any = ()) -> int:
    """Decimals shown for a float column, read from its name; when the name says nothing, none for a column of
    whole numbers (a count or cap stored as float beside a gap), else 2."""
    name = " ".join(str(c) for c in column) if isinstance(column, tuple) else str(column)
    name = name.lower()
    for words, n in _DECIMALS:
        if any(w in name for w in words):
            return n
    figures = [float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool) and not _missing(v)]
    return 0 if figures and all(math.isfinite(f) and f.is_integer() for f in figures) else 2


def _missing(v: Any) -> bool:
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT


def cell(v: Any, places: int) -> str:
    """One value as shown: missing as "—", integers with thousands separators, floats to `places`."""
    if _missing(v):
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    if isinstance(v, numbers.Real):
        f = float(v)
        return f"{f:,.{places}f}"
    return str(v)


def formatters(df: pd.DataFrame) -> dict[Any, Callable[[Any], str]]:
    """One formatter per column, for Styler.format and DataFrame.to_string alike."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    out: dict[Any, Callable[[Any], str]] = {}
    for col in df.columns:
        ser = df[col]
        places = 0 if pd.api.types.is_integer_dtype(ser) else decimals(col, ser.tolist())
        out[col] = functools.partial(cell, places=places)
    return out


def _figures(ser: pd.Series) -> bool:
    """A column of figures (right-aligned): numbers, gaps aside; an object column of numbers and None too."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    if pd.api.types.is_bool_dtype(ser):
        return False
    if pd.api.types.is_numeric_dtype(ser):
        return True
    vals = [v for v in ser.tolist() if not _missing(v)]
    return bool(vals) and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in vals)


def style(df: pd.DataFrame):
    """The frame as a notebook shows it: formatted cells, headers that wrap, figures right-aligned and text left,
    each header as its column."""
    import pandas as pd  # lazy: pandas only when a table is drawn (the CLI's start-up stays light)
    st = df.style.format(formatters(df), na_rep=MISSING).format_index(lambda v: MISSING if _missing(v) else str(v))
    figures = [c for c in df.columns if _figures(df[c])]
    text = [c for c in df.columns if c not in figures]
    st = st.set_table_styles(_CSS)
    multi = isinstance(df.columns, pd.MultiIndex)   # a header cell per level: the innermost names the column
    heads = {c[-1] for c in figures} if multi else set(figures)
    st = st.map_index(lambda c: f"text-align: {'right' if c in heads else 'left'}", axis="columns",
                      level=df.columns.nlevels - 1 if multi else None)
    if figures:
        st = st.set_properties(subset=figures, **{"text-align": "right", "white-space": "nowrap"})
    return st.set_properties(subset=text, **{"text-align": "left"}) if text else st


def text(df: pd.DataFrame) -> str:
    """The frame as the CLI prints it, with the same cell formatting as `style`."""
    # to_string prints None in an object column as "None"; as NaN it is na_rep like any other gap
    return df.astype(object).where(df.notna(), float("nan")).to_string(formatters=formatters(df), na_rep=MISSING)


def split(df: pd.DataFrame, *groups: list[str]) -> list[pd.DataFrame]:
    """A wide frame as narrower ones sharing its index: one per group of columns (absent columns skipped,
    empty groups dropped), so no table scrolls sideways."""
    return [df[cols] for g in groups if (cols := [c for c in g if c in df.columns])]
