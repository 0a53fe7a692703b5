"""SGLang 0.5.23's server-argument defaults that move the memory arithmetic.

Speculative decoding parameters and its running-request default, the CUDA-graph batch sizes and
the `mem_fraction_static` heuristic (with the multimodal scaling), page-size and KV-dtype
overrides. Each function names the SGLang file and function it follows; the differential test
(tests/test_kv_vs_sglang.py) checks the figures against SGLang's own resolution.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from runbook.model.arch import Arch

# arg_groups/speculative_hook.py _auto_choose_speculative_params: (steps, topk, draft tokens).
_AUTO_SPEC = {"LlamaForCausalLM": (5, 4, 8), "Grok1ForCausalLM": (5, 4, 8), "Grok1VForCausalLM": (5, 4, 8)}
SPEC_RUNNING_REQUESTS = 48          # speculative_hook.py: every algorithm resets an unset --max-running-requests
_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE", "FROZEN_KV_MTP")
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")


@dataclass(frozen=True)
class Speculative:
    algorithm: str                  # resolved: NEXTN is EAGLE
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    draft_kv_layers: int            # layers the draft adds to the target's pool (0: a draft pool not sized here)
    source: str

    @property
    def words(self) -> str:
        return f"{self.algorithm} ({self.num_steps} steps, topk {self.eagle_topk}, {self.num_draft_tokens} draft tokens)"


def speculative(arch: Arch, algorithm: Optional[str], steps: Optional[int], topk: Optional[int],
                draft_tokens: Optional[int], draft_model: bool = False) -> Optional[Speculative]:
    """speculative_hook.py _handle_eagle_family + _auto_choose_speculative_params; the draft KV layers
    follow model_runner_components/spec_aux_hidden_state.py (a path-less NEXTN/MTP draft is the
    checkpoint's own num_nextn_predict_layers)."""
    if not algorithm:
        return None
    alg = str(algorithm).upper()
    alg = "EAGLE" if alg == "NEXTN" else alg
    if steps is None:
        s, k, d = (3, 1, 4) if alg == "STANDALONE" else _AUTO_SPEC.get(arch.architecture, (3, 1, 4))
        src = "SGLang's automatic choice for " + arch.architecture
    else:
        s, k = steps, topk if topk is not None else 1
        d = draft_tokens if draft_tokens is not None else (s + 1 if k == 1 else s * k + 1)
        src = "given"
    draft_layers = arch.mtp_layers if (alg in _EAGLE_FAMILY and not draft_model) else 0
    return Speculative(alg, s, k, d, draft_layers, src)


# ---- mem_fraction_static (arg_groups/memory_hook.py handle_gpu_memory_settings) --------------

def capacity_defaults(gpu_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max_bs) by GPU size."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def prefill_capture_sizes(max_bs: int) -> list[int]:
    """arg_groups/cuda_graph_hook.py generate_prefill_cuda_graph_batch_sizes."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


@dataclass
class MemFraction:
    value: float
    chunked_prefill_size: int
    decode_max_bs: int
    prefill_graph: bool
    reserved_mib: float
    vlm_factor: float
    words: str


def prefill_graph_enabled(arch: Arch, pp: int, attention_backend: Optional[str], disable_cuda_graph: bool,
                          disable_prefill_graph: bool) -> bool:
    """cuda_graph_config.default_prefill_backend (breakable on CUDA) and cuda_graph_hook.py's
    compatibility rules: off under PP, for VLMs outside SGLang's allowlist, for DeepSeek-V3 on trtllm_mla."""
    if disable_cuda_graph or disable_prefill_graph or pp > 1:
        return False
    if arch.multimodal and not arch.multimodal_prefill_graph:
        return False
    if arch.architecture == "DeepseekV3ForCausalLM" and attention_backend == "trtllm_mla":
        return False
    return True


def vlm_factor(arch: Arch) -> float:
    """memory_hook.py adjust_mem_fraction_for_vlm: 0.95 × a factor from the vision tower's size
    (num_hidden_layers × hidden_size², 24 and 1024 when the config does not say)."""
    layers = arch.vit_layers or 24
    hidden = arch.vit_hidden or 1024
    ratio = layers * hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def mem_fraction_static(arch: Arch, gpu_mem_gib: float, tp: int, pp: int, attn_dp: int = 1,
                        chunked_prefill_size: Optional[int] = None, max_running_requests: Optional[int] = None,
                        cuda_graph_max_bs: Optional[int] = None, max_total_tokens: Optional[int] = None,
                        attention_backend: Optional[str] = None, disable_cuda_graph: bool = False,
                        disable_prefill_graph: bool = False, language_only: bool = False) -> MemFraction:
    """memory_hook.py handle_gpu_memory_settings + reserve_for_graph_mb (no post-capture sizing, no DeepEP)."""
    mib = gpu_mem_gib * 1024
    cps_default, bs_default = capacity_defaults(mib, tp)
    cps = chunked_prefill_size or cps_default
    bs = cuda_graph_max_bs or bs_default
    if cuda_graph_max_bs is None and max_running_requests is not None and bs > max_running_requests:
        bs = max_running_requests   # a smaller running-request limit caps the default decode graph
    prefill = prefill_graph_enabled(arch, pp, attention_backend, disable_cuda_graph, disable_prefill_graph)
    graph: float = 0 if disable_cuda_graph else 2 * bs
    if attn_dp > 1:
        graph += bs * attn_dp * 3 + (bs * attn_dp * 1.5 if bs > 300 else 0)
    if prefill:
        if arch.mla:
            graph += 1536
        else:
            pmax = min(cps, max_total_tokens) if max_total_tokens else cps
            graph += 8 * len(prefill_capture_sizes(pmax))
    reserved = 512 + max(cps, 2048) * 1.5 + tp * pp / 8 * 1024 + graph
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    frac = round((mib - reserved) / mib, 3)
    factor = 1.0
    if arch.multimodal and not language_only:
        factor = vlm_factor(arch)
        frac = frac * factor
    words = (f"SGLang default for {gpu_mem_gib:g} GiB, TP {tp}, PP {pp}, chunked prefill {cps}, decode graph up to {bs}"
             f"{', prefill graph' if prefill else ''}: reserve {reserved:.0f} MiB → {round((mib - reserved) / mib, 3)}"
             + (f" × {factor:.4f} for the vision tower = {frac:.4f}" if factor != 1.0 else ""))
    return MemFraction(frac, cps, bs, prefill, reserved, factor, words)
