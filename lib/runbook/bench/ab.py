"""A/B (`--compare-url`): the same requests against two endpoints in interleaved blocks, and the paired B − A
differences with a sign-flip randomisation interval over block means."""
from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

from runbook.bench import metrics, workloads
from runbook.bench.level_findings import implausible_finding
from runbook.bench.settings import BenchSettings
from runbook.bench.sweep import levels_of, warm_up
from runbook.bench.workloads import BuildContext
from runbook.core.findings import Finding
from runbook.endpoint.client import Client

AB_MIN_BLOCKS = 8


async def ab_compare(o: BenchSettings, model: str | None, api_key: str | None,
                     ctx: BuildContext) -> tuple[dict[str, Any], list[Finding]]:
    """The same prompts against A (--url) and B (--compare-url) at the first level, interleaved: the
    requests are cut into blocks of one level's width (the concurrency), and each block runs on both
    arms back to back in a random order (AB or BA). Blocks, not requests, are the independent units:
    requests that ran together share the server's state. `--duration` bounds the whole comparison."""
    lv = levels_of(o)[0]
    width = lv.concurrency or max(1, int(round(lv.rate or 1)))
    n_req = o.requests if o.requests and not o.duration else max(8, 4 * width)
    n_blocks = max(AB_MIN_BLOCKS, -(-n_req // width))
    planned = n_blocks * width if not o.duration else max(n_blocks * width, 64 * width)
    wl = workloads.resolve(o.workload).build(o, planned, ctx)
    clients = {arm: Client(url, model, bool(o.chat), api_key, o.timeout, ctx.tokenizer, transport=o.transport)
               for arm, url in (("a", o.server), ("b", o.compare_url or ""))}
    order_rng = random.Random(o.seed)
    recs: dict[str, list] = {"a": [], "b": []}
    block_of: dict[int, int] = {}
    orders: list[str] = []
    deadline = time.perf_counter() + o.duration if o.duration else None
    sessions = {k: c.session(limit=width) for k, c in clients.items()}
    try:
        for k, c in clients.items():
            await warm_up(c, sessions[k], wl.requests, o.warmup, width)
        for blk in range(len(wl.requests) // width):
            if deadline is not None and blk >= 2 and time.perf_counter() >= deadline:
                break
            if deadline is None and blk >= n_blocks:
                break
            reqs = [wl.requests[i] for i in range(blk * width, (blk + 1) * width)]
            for r in reqs:
                block_of[r.id] = blk
            order = ["a", "b"] if order_rng.random() < 0.5 else ["b", "a"]
            orders.append("".join(order).upper())
            for arm in order:
                c, s = clients[arm], sessions[arm]
                recs[arm] += await asyncio.gather(*(c.send(s, r, f"ab-{arm}") for r in reqs))
    finally:
        for s in sessions.values():
            await s.close()
    res, findings = paired(recs["a"], recs["b"], o.server, o.compare_url or "", block_of)
    res.update({"level": lv.label, "block_size": width, "order": "".join(orders)})
    return res, findings


AB_EXACT_BLOCKS = 12          # up to 2^12 sign patterns enumerated; beyond, a seeded sample of them
AB_SIGN_FLIPS = 20_000
AB_MIN_INTERVAL_BLOCKS = 6    # 2^5 = 32 orders cannot make a 95% interval: 1 − 2/32 < 0.95


def sign_flip_interval(xs: list[float], seed: int = 0,
                       confidence: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """Mean of the block differences with a randomisation interval for their shift (95% by default).

    Each block's order (AB or BA) is a fair coin, so under "B = A + δ" each block difference is
    symmetric about δ and only its sign is random. Inverting the sign-flip test gives Hartigan's (1969)
    interval: the means of the nonempty subsets of blocks cut the line into 2^K equally likely cells for
    δ, and [k-th smallest, k-th largest] covers δ with probability exactly 1 − 2k/2^K. k is the largest
    with that ≥ 95%, so a self-comparison covers 0 in at least 95% of runs by design, whatever the
    distribution — a t interval assumes normal block means and covers less with few blocks. Over
    AB_EXACT_BLOCKS blocks, subsets are sampled uniformly (Monte-Carlo randomisation test, still valid:
    the observed order counts as one of the draws; an empty draw ties at every δ and costs a cell)."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    if not xs:
        return None, None, None
    a = np.asarray(xs, dtype=float)
    m = float(a.mean())
    n = a.size
    if n <= AB_EXACT_BLOCKS:
        masks = (np.arange(1, 2 ** n)[:, None] >> np.arange(n)) & 1
        sub, empty = np.sort(masks @ a / masks.sum(axis=1)), 0
    else:
        rng, parts, empty = np.random.default_rng(seed), [], 0
        rows = max(1, 2_000_000 // n)                  # a long c1 run has thousands of blocks: bound memory
        for start in range(0, AB_SIGN_FLIPS, rows):
            drawn = rng.integers(0, 2, size=(min(rows, AB_SIGN_FLIPS - start), n), dtype=np.uint8)
            size = drawn.sum(axis=1)
            parts.append((drawn[size > 0] @ a) / size[size > 0])
            empty += int((size == 0).sum())
        sub = np.sort(np.concatenate(parts))
    k = math.floor((1 - confidence) / 2 * (len(sub) + empty + 1)) - empty
    if k < 1:
        return m, None, None
    return m, float(sub[k - 1]), float(sub[len(sub) - k])


def paired(a_recs: list, b_recs: list, a_url: str, b_url: str,
           block_of: dict[int, int] | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """Paired B − A differences. With `block_of` (request id → block) the interval is over block means
    (a sign-flip randomisation interval with blocks as the units); without, each request is its own
    block (sequential, c1)."""
    import numpy as np  # lazy: numpy only when figures are computed (the CLI's start-up stays light)
    findings: list[Finding] = []
    for name, url, rs in (("A", a_url, a_recs), ("B", b_url, b_recs)):
        if rs and not any(r.ok for r in rs):
            findings.append(Finding(f"bench.ab.failed.{name.lower()}", "fail", f"A/B: arm {name} failed every request ({len(rs)})",
                                    detail=f"{url}: " + ", ".join(sorted({r.error_kind for r in rs if r.error_kind})),
                                    remedy="Check that endpoint is up and serves the same model; no comparison is possible."))
    # each arm is judged as a level of its own (one server, one load) and what it names is in no pair
    named = {arm: [{"id": i, "kind": k, "why": w} for i, (k, w) in sorted(metrics.judge(rs).items())]
             for arm, rs in (("a", a_recs), ("b", b_recs))}
    for arm, bad in named.items():
        if bad:
            findings.append(implausible_finding(f"bench.ab.implausible.{arm}", f"A/B arm {arm.upper()}", bad))
    a = {r.id: r for r in metrics.sound(a_recs, named["a"]) if r.ok}
    b = {r.id: r for r in metrics.sound(b_recs, named["b"]) if r.ok}
    ids = sorted(set(a) & set(b))
    mismatched = [i for i in ids if a[i].output_tokens != b[i].output_tokens]
    res: dict[str, Any] = {"a": a_url, "b": b_url, "pairs": len(ids), "output_length_mismatches": len(mismatched),
                           "failed": {"a": sum(not r.ok for r in a_recs), "b": sum(not r.ok for r in b_recs)},
                           "implausible": named}
    if mismatched:
        findings.append(Finding("bench.ab.lengths", "warn", f"A/B: {len(mismatched)} of {len(ids)} pairs generated different lengths",
                                detail="A paired comparison needs equal output lengths (ignore_eos); those pairs are excluded.",
                                remedy="Check that both servers honour ignore_eos / min_tokens."))
    keep = [i for i in ids if i not in mismatched]
    blocks = block_of or {i: i for i in keep}
    for name, fn in (("tpot_ms", metrics.tpot_s), ("ttft_ms", metrics.ttft_s), ("e2e_ms", metrics.e2e_s)):
        per_block: dict[int, list[float]] = {}
        diffs = []
        for i in keep:
            fa, fb = fn(a[i]), fn(b[i])
            if fa is None or fb is None:
                continue
            d = (fb - fa) * 1000
            diffs.append(d)
            per_block.setdefault(blocks.get(i, i), []).append(d)
        means = [float(np.mean(v)) for _, v in sorted(per_block.items())]
        _, lo, hi = sign_flip_interval(means)
        mean = float(np.mean(diffs)) if diffs else None
        res[name] = {"mean_diff_b_minus_a": mean, "ci95": [lo, hi], "n": len(diffs), "blocks": len(means)}
        if diffs and lo is not None and hi is not None:
            sig = lo > 0 or hi < 0
            findings.append(Finding(f"bench.ab.{name}", "info", f"A/B {name}: B − A = {mean:+.2f} ms (95% CI {lo:+.2f} … {hi:+.2f})",
                                    detail=("significant" if sig else "not distinguishable from zero at 95%")
                                    + f" ({len(means)} blocks of interleaved requests)"))
    few = max((res[k]["blocks"] for k in ("tpot_ms", "ttft_ms", "e2e_ms") if res[k]["n"]), default=0)
    if 0 < few < AB_MIN_INTERVAL_BLOCKS:
        findings.append(Finding("bench.ab.blocks", "warn", f"A/B: {few} blocks are too few for a 95% interval",
                                detail=f"{2 ** few} possible block orders cannot exclude 5%; the interval is null",
                                remedy=f"Run at least {AB_MIN_INTERVAL_BLOCKS} blocks: more --requests or a longer --duration."))
    return res, findings

