"""Tables, plots, the README's sizing estimate (STORY) re-done by SGLang's rules, and the interactive panel
for the KV-memory notebook. What the notebook calls with its plan returns None for an empty one (an input error:
`registry.display`)."""
from __future__ import annotations

from typing import Any

from runbook.core.plots import figure, show
from runbook.core.registry import display
from runbook.core.spec import Deployment
from runbook.core.units import GIB
from runbook.kv import memory as kvmem
from runbook.kv import plan as kv_plan
from runbook.kv.plan import Plan
from runbook.model import sglang_names
from runbook.model.arch import Arch

STORY = {"bf16_bytes": 30720, "fp8_bytes": 15360, "tokens": 1_280_000, "req_128k": 10, "req_32k": 39}


def _fmt(n: Any) -> str:
    return "—" if n is None else f"{n:,}"


@display
def candidates_frame(p: Plan):
    """One row per candidate KV dtype: bytes per token, capacity, running-request cap, requests per context."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook kv` loads this module for text_table alone

    rows = []
    for r in p.candidates:
        row = {"KV dtype": r.kv_dtype, "B/token/GPU": r.kv_bytes_per_token_per_gpu, "max_total_num_tokens": r.max_total_num_tokens,
               "max_running_requests": r.max_running_requests}
        row.update({f"requests @ {int(c) // 1024}K": n for c, n in r.requests_at_context.items()})
        rows.append(row)
    return pd.DataFrame(rows).set_index("KV dtype")


AGENT_CONTEXTS = (50_000, 100_000)    # the story's agent: "a single agent might hold a 50K–100K context"


@display
def warm_sessions_frame(p: Plan):
    """Per candidate KV dtype and agent context: the pool in tokens (what the story sized by), the agent sessions whose
    prefixes it holds at once in whole pages (`held_at_context`: what stays warm through think time)."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook kv` loads this module for text_table alone

    rows = []
    for r in p.candidates:
        for c in AGENT_CONTEXTS:
            tokens = r.max_total_num_tokens
            rows.append({"KV dtype": r.kv_dtype, "agent context": f"{c:,}", "pool tokens": tokens,
                         "warm sessions": kvmem.held_at_context(tokens, r.page_size, c) if tokens else None})
    return pd.DataFrame(rows).set_index(["KV dtype", "agent context"])


@display
def scenarios_frame(p: Plan):
    """The deployment beside itself with (or without) MTP and with SGLang's default memory fraction."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook kv` loads this module for text_table alone

    rows = []
    for label, r in p.scenarios:
        row = {"scenario": label, "speculative": r.speculative or "off", "mem fraction": r.mem_fraction_static,
               "B/token/GPU": r.kv_bytes_per_token_per_gpu, "of which draft": r.draft_kv_bytes_per_token_per_gpu,
               "state pool (GiB)": round(r.state_pool_bytes_per_gpu / GIB, 2),
               "draft-token state (GiB)": round(r.spec_state_bytes_per_gpu / GIB, 2),
               "max_total_num_tokens": r.max_total_num_tokens, "max_running_requests": r.max_running_requests}
        row.update({f"requests @ {int(c) // 1024}K": n for c, n in r.requests_at_context.items()})
        rows.append(row)
    return pd.DataFrame(rows).set_index("scenario")


def selected_frame(p: Plan):
    """The chosen configuration in one row: what the panel's controls currently describe."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook kv` loads this module for text_table alone

    r = p.result
    return pd.DataFrame([{"TP": p.inputs.tp, "KV dtype": r.kv_dtype, "mem fraction": r.mem_fraction_static,
                          "B/token/GPU": r.kv_bytes_per_token_per_gpu, "max_total_num_tokens": r.max_total_num_tokens,
                          "max_running_requests": r.max_running_requests,
                          **{f"requests @ {int(c) // 1024}K": n for c, n in r.requests_at_context.items()}}]).set_index("TP")


@display
def memory_frame(p: Plan):
    """One GPU's memory by use (GiB), per candidate dtype."""
    return _memory(p)


def _memory(p: Plan):
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook kv` loads this module for text_table alone

    rows = {}
    for r in p.candidates:
        if r.kv_pool_bytes_per_gpu is None:
            continue
        rows[r.kv_dtype] = {"weights": (r.weights_bytes_per_gpu or 0) / GIB, "KV cache": r.kv_pool_bytes_per_gpu / GIB,
                            "linear-attention state": r.state_pool_bytes_per_gpu / GIB,
                            "reserved (activations, graphs)": (r.reserved_bytes_per_gpu or 0) / GIB}
    return pd.DataFrame(rows).T.round(2).rename(columns=lambda c: f"{c} (GiB)")


@display
def text_table(p: Plan) -> str:
    r = p.result
    lines = [f"{p.arch.architecture}: {r.layout}",
             f"KV dtype {r.kv_dtype}: {r.kv_bytes_per_token_per_gpu:,} B/token/GPU over {r.kv_layers} KV layers; "
             f"state {r.state_bytes_per_request_per_gpu:,} B/request/GPU",
             f"max_total_num_tokens {_fmt(r.max_total_num_tokens)}, max_running_requests {_fmt(r.max_running_requests)}"]
    if r.requests_at_context:
        lines.append("requests that fit: " + ", ".join(f"{int(c):,}: {n}" for c, n in r.requests_at_context.items()))
    lines.append("candidates: " + "; ".join(f"{c.kv_dtype} {c.kv_bytes_per_token_per_gpu:,} B → {_fmt(c.max_total_num_tokens)} tokens"
                                            for c in p.candidates))
    for label, s in p.scenarios[1:]:
        lines.append(f"{label}: {s.kv_bytes_per_token_per_gpu:,} B/token/GPU, mem fraction {_fmt3(s.mem_fraction_static)}, "
                     f"max_total_num_tokens {_fmt(s.max_total_num_tokens)}, max_running_requests {_fmt(s.max_running_requests)}")
    return "\n".join(lines + _topology_lines(p))


def _at(requests: dict[str, int | None]) -> str:
    return ", ".join(f"{int(c):,}: {_fmt(n)}" for c, n in requests.items())


def _topology_lines(p: Plan) -> list[str]:
    """The plan per replica and for the whole, or per node rank, under the one server's lines."""
    out = []
    if p.topology:
        t, g = p.topology, p.topology["gateway"]
        out.append(f"replicas ({len(t['replicas'])})" + (f" behind {g['binary']} {g['policy']} at {g['url']}" if g else "") + ":")
        for r in t["replicas"]:
            gpus = ",".join(map(str, r["gpus"])) if r["gpus"] else f"first {r['gpu_count']}"
            out.append(f"  {r['name']} {r['url']} GPUs {gpus}: max_total_num_tokens {_fmt(r['max_total_num_tokens'])}, "
                       f"max_running_requests {_fmt(r['max_running_requests'])}; requests that fit: {_at(r['requests_at_context'])}")
        tot = t["total"]
        out.append(f"  total {tot['replicas']} replicas, {tot['gpus']} GPUs: {_fmt(tot['kv_tokens'])} KV tokens, "
                   f"{_fmt(tot['running_requests'])} running requests; requests that fit: {_at(tot['requests_at_context'])}")
    if p.ranks and p.ranks_total:
        rt = p.ranks_total
        out.append(f"node ranks: one server across {rt['nodes']} nodes, {rt['gpus']} GPUs (TP {p.inputs.tp} × PP {p.inputs.pp}), "
                   f"one pool of {_fmt(rt['max_total_num_tokens'])} tokens:")
        for r in p.ranks:
            out.append(f"  rank {r['rank']} {r['node']} ({r['address']}): {r['gpus']} GPUs, TP ranks {r['tp_ranks'][0]}–"
                       f"{r['tp_ranks'][1]}, PP ranks {r['pp_ranks'][0]}–{r['pp_ranks'][1]}, layers {r['layers'][0]}–"
                       f"{r['layers'][1]}: max_total_num_tokens {_fmt(r['max_total_num_tokens'])}, "
                       f"max_running_requests {_fmt(r['max_running_requests'])}")
    return out


@display
def topology_frame(p: Plan):
    """One row per replica and one for the deployment's total (None without replicas)."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook kv` loads this module for text_table alone

    if not p.topology:
        return None
    rows = []
    for r in p.topology["replicas"]:
        rows.append({"replica": r["name"], "host:port": f"{r['host']}:{r['port']}",
                     "GPUs": ",".join(map(str, r["gpus"])) if r["gpus"] else f"first {r['gpu_count']}",
                     "KV tokens": (r["max_total_num_tokens"] or 0) * r["pools"] if r["max_total_num_tokens"] is not None else None,
                     "running requests": r["max_running_requests"] * r["pools"] if r["max_running_requests"] is not None else None,
                     **{f"requests @ {int(c) // 1024}K": n for c, n in r["requests_at_context"].items()}})
    t = p.topology["total"]
    rows.append({"replica": "total", "host:port": None, "GPUs": str(t["gpus"]), "KV tokens": t["kv_tokens"],
                 "running requests": t["running_requests"],
                 **{f"requests @ {int(c) // 1024}K": n for c, n in t["requests_at_context"].items()}})
    return pd.DataFrame(rows).set_index("replica")


@display
def ranks_frame(p: Plan):
    """One row per node rank of a server across nodes (None on one node)."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook kv` loads this module for text_table alone

    if not p.ranks:
        return None
    return pd.DataFrame([{"rank": r["rank"], "node": r["node"], "address": r["address"], "GPUs": r["gpus"],
                          "TP ranks": f"{r['tp_ranks'][0]}–{r['tp_ranks'][1]}", "PP ranks": f"{r['pp_ranks'][0]}–{r['pp_ranks'][1]}",
                          "layers": f"{r['layers'][0]}–{r['layers'][1]}", "B/token/GPU": r["kv_bytes_per_token_per_gpu"],
                          "max_total_num_tokens": r["max_total_num_tokens"], "max_running_requests": r["max_running_requests"]}
                         for r in p.ranks]).set_index("rank")


def _fmt3(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


@display
def plot_capacity(p: Plan):
    fig, ax = figure((6, 3.2))
    names = [c.kv_dtype for c in p.candidates]
    vals = [(c.max_total_num_tokens or 0) / 1e6 for c in p.candidates]
    bars = ax.bar(names, vals, color=["#4c72b0", "#dd8452", "#55a868"][: len(names)])
    ax.bar_label(bars, labels=[f"{v:.2f}M" for v in vals])
    ax.set_title(f"KV capacity per pool, TP {p.inputs.tp}")
    ax.set_xlabel("KV cache dtype")
    ax.set_ylabel("max_total_num_tokens (millions)")
    fig.tight_layout()
    return fig


@display
def plot_concurrency(p: Plan):
    fig, ax = figure((6, 3.5))
    for c in p.candidates:
        if not c.requests_at_context:
            continue
        xs = [int(k) for k in c.requests_at_context]
        ax.plot(xs, list(c.requests_at_context.values()), marker="o", label=f"{c.kv_dtype}")
        ax.plot(xs, list(c.kv_limited_requests_at_context.values()), ls=":", alpha=0.6, label=f"{c.kv_dtype}, KV only")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title("Concurrent requests that fit, by context length")
    ax.set_xlabel("context length per request (tokens)")
    ax.set_ylabel("requests (all at that length)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


@display
def plot_memory(p: Plan):
    df = _memory(p).rename(columns=lambda c: c.removesuffix(" (GiB)"))
    fig, ax = figure((6, 3.8))
    if not df.empty:
        df.plot.barh(stacked=True, ax=ax, color=["#8c8c8c", "#4c72b0", "#dd8452", "#c7c7c7"])
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, frameon=False)
    ax.set_title(f"One GPU's memory ({p.inputs.gpu_mem_gib or '?'} GiB), TP {p.inputs.tp}, selected {p.result.kv_dtype}")
    ax.set_xlabel("GiB")
    ax.set_ylabel("KV cache dtype")
    fig.tight_layout()
    return fig


def story_frame(a: Arch, tp: int = 8):
    """The story's numbers beside SGLang's, with the story's own budget so only the rules differ."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook kv` loads this module for text_table alone

    bf16_tp1 = kvmem.compute(a, kvmem.Inputs(kv_dtype="bfloat16", tp=1))
    fp8_tp1 = kvmem.compute(a, kvmem.Inputs(kv_dtype="fp8_e4m3", tp=1))
    budget_gib = STORY["tokens"] * STORY["bf16_bytes"] / GIB   # what 1.28M tokens at 30,720 B cost
    sc = kvmem.compute(a, kvmem.Inputs(kv_dtype="bfloat16", tp=tp, kv_budget_gib=budget_gib,
                                       contexts=[32768, 131072], context_len=262144))
    cap = (sc.max_state_slots or 0) // max(sc.state_slots_per_request, 1)
    rows = [
        ("KV bytes/token, whole model, BF16", STORY["bf16_bytes"], bf16_tp1.kv_bytes_per_token_per_gpu,
         "agrees: 15 full-attention layers × 2 heads × (256+256) × 2 B"),
        ("KV bytes/token, whole model, FP8", STORY["fp8_bytes"], fp8_tp1.kv_bytes_per_token_per_gpu, "agrees: half of BF16"),
        (f"KV bytes/token on each GPU at TP {tp}, BF16", STORY["bf16_bytes"] // tp, sc.kv_bytes_per_token_per_gpu,
         f"{sc.layout}: each GPU pays {sc.kv_head_replication:g}× a naive 1/{tp} share"),
        (f"tokens from {budget_gib:.1f} GiB per GPU", STORY["tokens"], sc.max_total_num_tokens,
         f"SGLang first gives {sc.state_pool_bytes_per_gpu / GIB:.1f} GiB (r/(1+r), r=0.9) to the linear-attention state pool"),
        ("concurrent 128K requests", STORY["req_128k"], sc.requests_at_context.get("131072"),
         "tokens ÷ 131,072, then the running-request cap"),
        ("concurrent 32K requests", STORY["req_32k"], sc.requests_at_context.get("32768"), "tokens ÷ 32,768, then the running-request cap"),
        ("running-request cap from state slots", "—", cap,
         f"{sc.max_state_slots} slots ÷ {sc.state_slots_per_request} per request: not in the story"),
    ]
    df = pd.DataFrame(rows, columns=["quantity", "story", "SGLang's rules", "why"]).set_index("quantity")
    return df.astype({"story": object, "SGLang's rules": object})


@display
def story(p: Plan):
    """The story's numbers beside SGLang's for a hybrid (linear-attention) model like the story's; else one row saying so."""
    import pandas as pd  # lazy: pandas (~0.35 s); `runbook kv` loads this module for text_table alone

    if p.arch.linear:
        return story_frame(p.arch)
    return pd.DataFrame([{"note": "the story comparison applies to the Qwen3.5 hybrid model"}])


@display
def what_if(p: Plan, spec: Deployment | None, model_dir: str | None = None, interactive: bool = True):
    """The what-if panel (`panel`) below a plan, when a person is watching (`interactive`; the runner sets False)."""
    return panel(spec, model_dir) if interactive else None


def panel(spec: Deployment | None, model_dir: str | None = None):
    """An ipywidgets panel (TP, KV dtype, memory fraction, context length) that recomputes live."""
    import ipywidgets as w  # lazy: JupyterLab only (~0.1 s)
    from IPython.display import display  # lazy: JupyterLab only (IPython, ~60 ms)

    base = kv_plan.assess(spec, model_dir or None)
    tp = w.Dropdown(options=[1, 2, 4, 8], value=base.inputs.tp, description="TP")
    choices = [c for c in sglang_names.KV_CACHE_DTYPE_CHOICES if c != "bfloat16"]   # bf16 is the same choice
    current = str(spec.serving.flags.get("kv-cache-dtype", "auto")) if spec is not None else "auto"
    dtype = w.Dropdown(options=choices, value=current if current in choices else "auto", description="KV dtype")
    frac = w.FloatSlider(value=base.inputs.mem_fraction_static or base.result.mem_fraction_static or 0.85, min=0.5, max=0.95,
                         step=0.01, description="mem frac")
    ctx = w.Dropdown(options=[8192, 32768, 65536, 131072, 262144], value=min(base.result.context_len or 262144, 262144),
                     description="context")
    out = w.Output()
    shown: tuple = ()

    def redraw(*_: Any) -> None:
        # The slider echoes 0.88 back as 0.8799999…: redraw only when a rounded input really changed.
        nonlocal shown
        key = (tp.value, dtype.value, round(frac.value, 2), ctx.value)
        if key == shown:
            return
        shown = key
        p = kv_plan.assess(spec, model_dir or None, tp=key[0], kv_dtype=key[1], mem_fraction_static=key[2],
                 context_len=key[3], contexts=(key[3],))
        out.clear_output(wait=True)
        with out:
            display(selected_frame(p))
            display(candidates_frame(p))
            show(plot_memory(p))

    for c in (tp, dtype, frac, ctx):
        c.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([tp, dtype]), w.HBox([frac, ctx]), out])
