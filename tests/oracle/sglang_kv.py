"""Oracle: SGLang 0.5.23's own KV-cache sizing, run on CPU for emulated GPUs.

Run in the serving venv (the one with the real sglang wheel)::

    .venv-serving/bin/python tests/oracle/sglang_kv.py < cases.json > results.json

Input: a JSON list of cases ``{"id", "model_dir", "argv", "gpu": {"name", "total_mib" (or "memory_gib": a
decimal GiB figure, the GPU then has int(memory_gib × 2**30) bytes), "sm"}, "weights_bytes_per_gpu"}``.
Output: a JSON list with one object per case (see ``_FIELDS``); nothing else is written to stdout (SGLang's
logging goes to stderr).

How SGLang is driven (everything below is SGLang's own code, called in the order the
launcher / scheduler / model runner call it):

1. ``server_args.prepare_server_args(["--model-path", model_dir, *argv])`` -- SGLang's
   argparse registration and ``ServerArgs.from_cli_args``.
2. ``ServerArgs.resolve_once()`` -- the whole resolution pipeline
   (``arg_groups/pipeline.run_resolution_pipeline``: memory_hook mem_fraction_static /
   chunked_prefill / cuda-graph max bs, model overrides incl. page size and KV dtype,
   attention backend, mamba / linear-attention backends, speculative defaults, validation).
   An exception here is a refusal (``stage: "resolve"``).
3. ``runtime_context.publish(server_args, role="scheduler", ranks=SpawnRanks(...))`` with
   ``spawn_world_rank`` for PP rank r, TP rank 0 -- what ``run_scheduler_process`` does.
4. ``ModelConfig.from_server_args(server_args)`` (scheduler's model config).
5. Quantization config: ``model_loader.loader._get_quantization_config(model_config,
   LoadConfig(...))`` (this also runs SGLang's min-capability check). Model modules do not
   import in this CPU venv (einops/openai missing), so ``loader.get_model_architecture`` is
   replaced by a stand-in returning a class with an empty ``packed_modules_mapping`` and
   ``remap_prefix=None`` (the only attributes read; they affect per-layer skip lists, not
   ``kv_cache_quant_algo``).
6. ``mem_cache.kv_cache_dtype.configure_kv_cache_dtype`` (exactly the arguments
   ``ModelRunner.configure_kv_cache_dtype`` passes), with ``model`` a stand-in (below).
7. ``layer_setup.resolve_layer_indices`` on the stand-in model; ``resolve_sliding_window_size``;
   ``resolve_spec_aux_hidden_state_config``; ``is_post_capture_kv_active``.
8. ``KVCacheConfigurator(...)`` built with the same fields ``ModelRunner.init_kv_cache_configurator``
   passes, then ``KVCacheConfigurator._resolve_memory_pool_config(pre_model_load_memory)``
   (``_profile_available_bytes`` -> ``_handle_max_mamba_cache`` -> ``config_from_budget`` ->
   ``create_memory_pool_configurator(...).calculate_pool_sizes`` -> ``_apply_token_constraints``
   -> ``resolve_max_num_reqs`` -> ``finalize_with_max_running_requests``). An exception here is
   a refusal (``stage: "memory_pool"``), e.g. "Not enough memory".
9. ``--nnodes`` > 1: the ranks SGLang's launcher places on the case's ``--node-rank``
   (``entrypoints.engine._calculate_rank_ranges``, reported as ``node``); steps 3 and 8 then run as that node's first
   TP rank.
10. EAGLE/NEXTN on a hybrid linear-attention target: the draft worker's own pool
   (``draft_pool_bytes_per_token``) -- the draft's ``ModelConfig.from_server_args(..., is_draft_model=True)``,
   ``configure_kv_cache_dtype(is_draft_worker=True)``, ``resolve_layer_indices``, a
   ``KVCacheConfigurator(is_draft_worker=True, memory_pool_config=<the target's>)`` on the CPU and its
   ``_build_token_to_kv_pool`` at 4,096 and 8,192 tokens (the stand-ins: the target's req_to_token pool as an
   object with no mamba pool, the unloaded draft model with no layers, and no Triton warm-up of the KV copy kernel).

Stand-ins (objects SGLang's functions need but that only a loaded model provides):

* ``model``: ``SimpleNamespace(start_layer, end_layer, quant_config, config)`` -- ``start/end_layer``
  from SGLang's ``distributed.utils.get_pp_indices(num_hidden_layers, pp_rank, pp_size)`` (what
  ``make_layers`` uses), ``quant_config`` from step 5. It has no
  ``get_attention_sliding_window_size``, so ``resolve_sliding_window_size`` uses
  ``model_config.sliding_window_size`` (gpt-oss' model class would report window-1 = 127
  instead of 128; this only feeds the SWA-pool admission check, not the token counts).
* FP4 KV recipes (``fp4_kv_cache_quant_method.get_kv_cache_quant_method``) are built with
  ``device="cpu"`` instead of ``"cuda"`` (they allocate one scale float per layer at construction).
* ``layers/quantization/__init__.py`` registers ``mxfp4`` only when ``is_cuda()`` is true at
  import time; the oracle adds that registration after importing (gpt-oss needs it).
* ``gc.freeze()`` after imports, so SGLang's ``gc.collect()`` in ``_profile_available_bytes``
  stays cheap; ``os.environ`` is restored before each case (resolution exports env vars such
  as ``SGLANG_MAMBA_SSM_DTYPE``, which would otherwise leak into later cases).
* The model is not loaded, so the attention layers' load-time split is checked with SGLang's own
  ``QKVParallelLinear`` on a tiny hidden size (``get_group_rank_size`` -> the attention-TP size; a
  refusal there is ``stage: "model_load"``).
* Exceptions: ValueError / AssertionError / RuntimeError / NotImplementedError / SystemExit from
  SGLang are refusals (``refused``, ``refused_stage``); anything else is ``oracle_error``.
  ``ORACLE_TRACE=1`` adds the traceback to refusals.
* process groups: ``get_parallel().override(world_group=..., pp_group=...)`` with
  ``SimpleNamespace`` groups (``cpu_group=None``, ``world_size``, ``rank_in_group``).
* PP: ``_apply_token_constraints`` all-reduces (MIN) the token capacity over PP ranks with
  ``torch.distributed.all_reduce``. The oracle runs every PP rank once with the collective
  emulated as identity to get each rank's capacity, then once more per rank with the
  collective emulated as MIN over those capacities; figures reported are rank 0's
  (``pp_ranks`` lists every rank).

Emulated GPU probes (only these; all read the case's ``gpu``):

* ``runtime_context.override_platform(...)`` (SGLang's own hook): is_cuda, is_hip, is_npu, is_xpu,
  is_musa, is_mps, is_sm90, is_sm100, is_sm100_or_sm110, is_sm110, is_sm120, is_blackwell,
  is_hopper_with_cuda_12_3, has_amx, has_flashinfer, device_sm, device_capability.
* ``sglang.srt.utils.common`` probe functions, replaced on that module and on every already
  imported ``sglang.*`` module that bound them by name (installed *after* the imports so that
  import-time kernel selection stays CPU-safe): is_cuda, get_device, get_device_sm,
  get_device_capability, get_device_memory_capacity (= total MiB), get_nvgpu_memory_capacity,
  is_sm90_supported, is_hopper_with_cuda_12_3, is_sm100_supported, is_sm100_or_sm110_supported,
  is_sm110_supported, is_sm120_supported, is_blackwell_supported / is_blackwell, is_sm120,
  is_sm121, is_flashinfer_available (True), get_nvidia_driver_version_str ("580.95.05"),
  get_available_gpu_memory (SGLang's own, over the torch.cuda probes below).
* ``torch.cuda.get_device_capability`` (read directly by attention_hook / overrides /
  model_hook) -> (sm major, minor); ``torch.version.cuda`` -> "12.9" (read by attention_hook's
  FlashInfer-GDN CUDA-13 check).
* ``sglang.srt.platforms.current_platform`` -> ``platforms.cuda.CudaSRTPlatform()`` (also rebound
  in modules that imported it by name).
* ``torch.cuda.mem_get_info`` (with device_count, current_device, get_device_properties, empty_cache), only
  inside SGLang's own ``get_available_gpu_memory``: free bytes = total before the weights load, total - weights
  after. ``pre_model_load_memory`` is SGLang's ``bootstrap.measure_pre_model_load_memory``; with a world of more
  than one rank both measurements go through SGLang's float32 all-reduce (emulated as identity: every rank alike).
* ``torch.distributed.all_reduce`` for the PP MIN (above).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import pkgutil
import sys
import time
import traceback
import types
from types import SimpleNamespace

_T0 = time.time()
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

# ---------------------------------------------------------------------------------------
# Imports (genuine CPU probes during import)
# ---------------------------------------------------------------------------------------
_real_stdout = sys.stdout
sys.stdout = sys.stderr  # anything SGLang prints goes to stderr
logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

import sglang_env  # noqa: E402

sglang_env.install()

import sglang.srt.arg_groups as _AG  # noqa: E402
import torch  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402

for _m in pkgutil.walk_packages(_AG.__path__, "sglang.srt.arg_groups."):
    try:
        importlib.import_module(_m.name)
    except Exception as _e:  # pragma: no cover - diagnostic only
        print(f"[oracle] import {_m.name} failed: {_e}", file=sys.stderr)

from sglang.srt import runtime_context as _RC  # noqa: E402
from sglang.srt.configs.load_config import LoadConfig  # noqa: E402
from sglang.srt.configs.model_config import AttentionArch, ModelConfig  # noqa: E402
from sglang.srt.distributed import bootstrap as _BOOT  # noqa: E402
from sglang.srt.distributed.utils import get_pp_indices  # noqa: E402
from sglang.srt.mem_cache import kv_cache_configurator as _KVC  # noqa: E402
from sglang.srt.mem_cache import kv_cache_dtype as _KVD  # noqa: E402
from sglang.srt.model_executor import pool_configurator as _PC  # noqa: E402
from sglang.srt.model_executor.model_runner_components import kv_pool_runtime as _KPR  # noqa: E402
from sglang.srt.model_executor.model_runner_components import layer_setup as _LS  # noqa: E402
from sglang.srt.model_executor.model_runner_components import load_model_utils as _LMU  # noqa: E402
from sglang.srt.model_executor.model_runner_components import spec_aux_hidden_state as _SAH  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang.srt.utils import common as _C  # noqa: E402

for _name in (
    "sglang.srt.model_loader.loader",
    "sglang.srt.model_loader.weight_utils",
    "sglang.srt.kernel_plugins.amd.binding",
    "sglang.srt.kernel_plugins.nvidia.binding",
    "sglang.srt.layers.quantization.fp4_kv_cache_quant_method",
    "sglang.srt.layers.cp.utils",
    "sglang.srt.speculative.dflash_utils",
    "sglang.srt.platforms.cuda",
    "sglang.srt.entrypoints.engine",   # the launcher's rank placement for --nnodes cases (_node_placement)
):
    try:
        importlib.import_module(_name)
    except Exception as _e:  # pragma: no cover
        print(f"[oracle] import {_name} failed: {_e}", file=sys.stderr)

_IMPORT_S = time.time() - _T0

# KVCacheConfigurator._profile_available_bytes calls gc.collect() (to free weight-loading
# temporaries on a real GPU); with everything SGLang imported that costs ~0.4 s per call.
# Freezing the import-time objects into the permanent generation keeps SGLang's call but
# makes it cheap. No effect on any figure.
import gc  # noqa: E402

gc.collect()
gc.freeze()

# ---------------------------------------------------------------------------------------
# GPU emulation
# ---------------------------------------------------------------------------------------
_GIB = 1 << 30
_MIB = 1 << 20


class _Gpu:
    sm = 90  # e.g. 90, 100, 120
    total_mib: float = 143771   # what nvidia-smi's memory.total says (SGLang parses it as a float)
    total_bytes = 143771 << 20  # what torch.cuda.mem_get_info says: whole bytes
    weights_bytes = 0
    loaded = False  # weights loaded yet (free memory drops by weights_bytes)


G = _Gpu()


def _cap(*_a, **_k):
    return (G.sm // 10, G.sm % 10)


def _free_bytes() -> int:
    return G.total_bytes - (G.weights_bytes if G.loaded else 0)


_sglang_available_gpu_memory = _C.get_available_gpu_memory


@contextlib.contextmanager
def _cuda_memory_probes():
    """torch.cuda's memory probes as the emulated GPU answers them: mem_get_info gives integer free bytes."""
    cuda = torch.cuda
    saved = {k: getattr(cuda, k) for k in ("device_count", "current_device", "get_device_properties", "mem_get_info",
                                           "empty_cache")}
    cuda.device_count = lambda: 8
    cuda.current_device = lambda: 0
    cuda.get_device_properties = lambda *_a, **_k: SimpleNamespace(is_integrated=False, total_memory=G.total_bytes)
    cuda.mem_get_info = lambda *_a, **_k: (_free_bytes(), G.total_bytes)
    cuda.empty_cache = lambda: None
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(cuda, k, v)


def _free_gib(device="cuda", gpu_id=0, distributed=False, empty_cache=True, cpu_group=None):
    """SGLang's own get_available_gpu_memory (utils/common.py) on the emulated probes: a world of more than one
    rank all-reduces the free bytes as a float32 tensor before dividing by 2**30."""
    with _cuda_memory_probes():
        return _sglang_available_gpu_memory("cuda", gpu_id, distributed=distributed, empty_cache=empty_cache,
                                            cpu_group=cpu_group)


_PROBES = {
    "is_cuda": lambda: True,
    "get_device": lambda device_id=None: "cuda" if device_id is None else f"cuda:{device_id}",
    "get_device_sm": lambda: G.sm,
    "get_device_capability": lambda device_id=0: _cap(),
    "get_device_memory_capacity": lambda device=None: G.total_mib,
    "get_nvgpu_memory_capacity": lambda: G.total_mib,
    "is_sm90_supported": lambda: G.sm // 10 == 9,
    "is_hopper_with_cuda_12_3": lambda: G.sm // 10 == 9,
    "is_sm100_supported": lambda: G.sm // 10 == 10,
    "is_sm100_or_sm110_supported": lambda: G.sm // 10 in (10, 11),
    "is_sm110_supported": lambda: G.sm // 10 == 11,
    "is_sm120_supported": lambda: G.sm // 10 == 12,
    "is_blackwell_supported": lambda: G.sm // 10 in (10, 11, 12),
    "is_blackwell": lambda: G.sm // 10 in (10, 11, 12),
    "is_sm120": lambda: G.sm == 120,
    "is_sm121": lambda: G.sm == 121,
    "is_flashinfer_available": lambda: True,
    "get_nvidia_driver_version_str": lambda: "580.95.05",
    "get_available_gpu_memory": _free_gib,
}


def _install_probes() -> None:
    orig = {k: getattr(_C, k) for k in _PROBES}
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "sglang" or name.startswith("sglang.")):
            continue
        d = getattr(mod, "__dict__", None)
        if not d:
            continue
        for k, f in _PROBES.items():
            if d.get(k) is orig[k]:
                setattr(mod, k, f)
    for k, f in _PROBES.items():
        setattr(_C, k, f)
    torch.cuda.get_device_capability = _cap
    torch.version.cuda = "12.9"
    try:
        import sglang.srt.platforms as _plat
        from sglang.srt.platforms.cuda import CudaSRTPlatform

        _plat._current_platform = CudaSRTPlatform()
        for name, mod in list(sys.modules.items()):
            if mod is None or not name.startswith("sglang."):
                continue
            d = getattr(mod, "__dict__", None)
            if d and "current_platform" in d and mod is not _plat:
                mod.current_platform = _plat._current_platform
    except Exception as e:  # pragma: no cover
        print(f"[oracle] CudaPlatform emulation failed: {e}", file=sys.stderr)
    # Import-time CUDA registration in layers/quantization/__init__.py:
    # ``if is_cpu() or is_cuda() or ...: BASE_QUANTIZATION_METHODS["mxfp4"] = Mxfp4Config``.
    import sglang.srt.configs.model_config as _MC
    import sglang.srt.layers.quantization as _Q

    for d in {id(x): x for x in (_Q.BASE_QUANTIZATION_METHODS, _Q.QUANTIZATION_METHODS,
                                  getattr(_MC, "QUANTIZATION_METHODS", {}))}.values():
        d.setdefault("mxfp4", _Q.Mxfp4Config)
    # Model classes cannot be imported on this CPU venv (einops/openai missing), so
    # _get_quantization_config gets a stand-in class: it reads only packed_modules_mapping
    # and remap_prefix from it.
    from sglang.srt.model_loader import loader as _L

    def _stand_in_architecture(model_config):
        arch = model_config.hf_config.architectures[0]
        return type(arch, (), {"packed_modules_mapping": {}, "remap_prefix": None}), arch

    _L.get_model_architecture = _stand_in_architecture

    # FP4 KV recipes allocate their per-layer scale tensors on kvc.device ("cuda") when the
    # pool configurator builds them for compute_cell_size; allocate those on the CPU instead.
    from sglang.srt.layers.quantization import fp4_kv_cache_quant_method as _FP4

    _orig_get_qm = _FP4.get_kv_cache_quant_method

    def _get_kv_cache_quant_method_on_cpu(name, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return _orig_get_qm(name, **kwargs)

    _FP4.get_kv_cache_quant_method = _get_kv_cache_quant_method_on_cpu


def _platform_facts():
    return dict(
        is_cuda=True,
        is_hip=False,
        is_npu=False,
        is_xpu=False,
        is_musa=False,
        is_mps=False,
        is_sm90=G.sm // 10 == 9,
        is_sm100=G.sm // 10 == 10,
        is_sm100_or_sm110=G.sm // 10 in (10, 11),
        is_sm110=G.sm // 10 == 11,
        is_sm120=G.sm // 10 == 12,
        is_blackwell=G.sm // 10 in (10, 11, 12),
        is_hopper_with_cuda_12_3=G.sm // 10 == 9,
        has_amx=False,
        has_flashinfer=True,
        device_sm=G.sm,
        device_capability=_cap(),
    )


_install_probes()


# Emulated collective for PP (see module docstring).
class _PPReduce:
    target = None  # None: identity; int: MIN with this value


_PPR = _PPReduce()
_orig_all_reduce = torch.distributed.all_reduce


def _fake_all_reduce(tensor, op=None, group=None, async_op=False):
    # every emulated rank has the same free memory, so only PP's token capacity (an int64) changes
    if _PPR.target is not None and not tensor.is_floating_point():
        tensor.fill_(min(int(tensor.item()), _PPR.target))
    return None


# Recorders around KVCacheConfigurator methods (they still run SGLang's code unchanged).
_REC: dict = {}
_orig_profile = _KVC.KVCacheConfigurator._profile_available_bytes
_orig_mamba = _KVC.KVCacheConfigurator._handle_max_mamba_cache


def _rec_profile(self, pre_model_load_memory):
    out = _orig_profile(self, pre_model_load_memory)
    _REC["kv_budget_bytes"] = out
    return out


def _rec_mamba(self, total_rest_memory):
    _REC["rest_gib_before_state"] = total_rest_memory
    out = _orig_mamba(self, total_rest_memory)
    _REC["rest_gib_after_state"] = out
    return out


_KVC.KVCacheConfigurator._profile_available_bytes = _rec_profile
_KVC.KVCacheConfigurator._handle_max_mamba_cache = _rec_mamba

# ---------------------------------------------------------------------------------------
# Per case
# ---------------------------------------------------------------------------------------
_DTYPE_NAMES = {
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e4m3fnuz: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
}


class Refused(Exception):
    def __init__(self, stage, exc):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.stage = stage
        self.exc = exc


# Exceptions that mean "SGLang refuses to start"; anything else in the oracle is its own bug.
_REFUSAL_TYPES = (ValueError, AssertionError, RuntimeError, NotImplementedError, SystemExit)


def _kv_dtype_name(kv_dtype, kv_str):
    if kv_str in ("mxfp8", "nvfp4", "fp4_mx_block16"):
        return kv_str
    if hasattr(torch, "float4_e2m1fn_x2") and kv_dtype == torch.float4_e2m1fn_x2:
        return kv_str or "nvfp4"
    return _DTYPE_NAMES.get(kv_dtype, str(kv_dtype))


def _quant_config(model_config, server_args):
    if model_config.quantization is None:
        return None, None
    from sglang.srt.model_loader import loader as _L
    load_config = LoadConfig(load_format="auto", download_dir=None)
    return _L._get_quantization_config(model_config, load_config), "loader"


def _sliding_window_method(model_config):
    """The model class's own get_attention_sliding_window_size, when its module imports."""
    # Model modules do not import in this CPU venv (einops/openai missing); the stand-in has no
    # such method, so resolve_sliding_window_size falls back to model_config.sliding_window_size.
    return None, model_config.hf_config.architectures[0]


def _size_one_rank(server_args, model_config, quant_config, pp_rank, pp_size, swa_method, tp_rank=0):
    """Run SGLang's KV sizing for one PP rank (as its TP rank `tp_rank`); returns (result dict)."""
    _RC.publish(
        server_args,
        role="scheduler",
        ranks=_RC.SpawnRanks(
            world_rank=_RC.spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=pp_rank),
            dp_rank=None,
            gpu_id=0,
        ),
    )
    par = _RC.get_parallel()
    start, end = get_pp_indices(model_config.num_hidden_layers, pp_rank, pp_size)
    model = SimpleNamespace(start_layer=start, end_layer=end, quant_config=quant_config,
                            config=model_config.hf_config)
    if swa_method is not None:
        model.get_attention_sliding_window_size = types.MethodType(swa_method, model)
    spec_algorithm = SpeculativeAlgorithm.from_string(_RC.get_spec().speculative_algorithm)

    groups = dict(
        world_group=SimpleNamespace(cpu_group=None, world_size=par.launch_world_size, rank_in_group=0),
        pp_group=SimpleNamespace(cpu_group=None, world_size=pp_size, rank_in_group=pp_rank,
                                 is_first_rank=pp_rank == 0, is_last_rank=pp_rank == pp_size - 1),
    )
    try:
        ctx = par.override(**groups)
    except Exception:
        ctx = contextlib.nullcontext()
    with ctx:
        resolved_kv_str, kv_dtype = _KVD.configure_kv_cache_dtype(
            server_args_kv_cache_dtype=_RC.get_model().kv_cache_dtype,
            model=model,
            model_dtype=model_config.dtype,
            is_draft_worker=False,
            is_dflash=spec_algorithm.is_dflash_family(),
            speculative_draft_attention_backend=None,
            speculative_draft_kv_cache_dtype=_RC.get_spec().speculative_draft_kv_cache_dtype,
        )
        kv_str = resolved_kv_str if resolved_kv_str is not None else _RC.get_model().kv_cache_dtype
        layer_info = _LS.resolve_layer_indices(
            model=model, model_config=model_config, is_draft_worker=False, draft_model_idx=None
        )
        sliding_window_size = _LMU.resolve_sliding_window_size(model, model_config)
        spec_aux = _SAH.resolve_spec_aux_hidden_state_config(
            server_args=server_args, model_config=model_config,
            spec_algorithm=spec_algorithm, is_draft_worker=False,
        )
        post_capture = _KPR.is_post_capture_kv_active(
            server_args=server_args, is_draft_worker=False,
            spec_algorithm=spec_algorithm, token_to_kv_pool_allocator=None,
        )
        kvc = _KVC.KVCacheConfigurator(
            device="cuda",
            gpu_id=0,
            attn_dp_size=par.attn_dp_size,
            pp_size=pp_size,
            pp_group=groups["pp_group"],
            model=model,
            model_config=model_config,
            server_args=server_args,
            kv_cache_dtype=kv_dtype,
            kv_cache_dtype_str=kv_str,
            model_dtype=model_config.dtype,
            page_size=_RC.get_schedule().page_size,
            sliding_window_size=sliding_window_size,
            spec_algorithm=spec_algorithm,
            is_draft_worker=False,
            post_capture_kv_active=post_capture,
            spec_aux_config=spec_aux,
            draft_parallel_layout=None,
            is_hybrid_swa=model_config.is_hybrid_swa,
            is_hybrid_swa_compress=model_config.is_hybrid_swa_compress,
            use_mla_backend=model_config.attention_arch == AttentionArch.MLA,
            layer_info=layer_info,
            forward_stream=None,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
            memory_pool_config=None,
            draft_model_idx=None,
        )
        G.loaded = False   # bootstrap measures free memory before the weights load
        with _patched_all_reduce():
            pre_model_load_memory = _BOOT.measure_pre_model_load_memory(device="cuda", is_draft_worker=False)
        G.loaded = True  # weights are resident when the pool is sized
        _REC.clear()
        with _patched_all_reduce():
            try:
                config = kvc._resolve_memory_pool_config(pre_model_load_memory)
            except _REFUSAL_TYPES as e:
                raise Refused("memory_pool", e) from e
        pc = _PC.create_memory_pool_configurator(kvc)
        out = dict(
            pp_rank=pp_rank,
            start_layer=start,
            end_layer=end,
            kv_cache_dtype=_kv_dtype_name(kv_dtype, kv_str),
            kv_cache_dtype_str=kv_str,
            kv_cache_torch_dtype=str(kv_dtype),
            sliding_window_size=sliding_window_size,
            pool_configurator=type(pc).__name__,
            max_total_num_tokens=config.max_total_num_tokens,
            full_max_total_num_tokens=config.full_max_total_num_tokens,
            swa_max_total_num_tokens=config.swa_max_total_num_tokens,
            max_running_requests=config.max_running_requests,
            kv_budget_bytes=_REC.get("kv_budget_bytes"),
        )
        _cell_figures(out, kvc, pc, spec_algorithm)
        _mamba_figures(out, kvc)
        if pp_rank == 0 and kvc.mambaish_config is not None and (spec_algorithm.is_eagle() or spec_algorithm.is_standalone()):
            out["draft_pool_bytes_per_token"] = _draft_pool_bytes_per_token(server_args, spec_algorithm, config, model)
        return out


def _draft_pool_bytes_per_token(server_args, spec_algorithm, target_config, target_model):
    """The EAGLE/MTP draft worker's own KV pool on a hybrid linear-attention target, built by SGLang's code as
    TpModelWorker(is_draft_worker=True) and ModelRunner build it: the draft's ModelConfig, its KV dtype, its layer
    info, a KVCacheConfigurator(is_draft_worker=True) reusing the target's MemoryPoolConfig, and
    ``_build_token_to_kv_pool`` -- on the CPU, at two small token counts (the real count would allocate gigabytes):
    the difference of the pool's own ``get_kv_size_bytes`` over the difference of sizes is its bytes per token."""
    spec = _RC.get_spec()
    dcfg = ModelConfig.from_server_args(server_args, model_path=spec.speculative_draft_model_path,
                                        model_revision=spec.speculative_draft_model_revision, is_draft_model=True)
    # the draft model is not loaded: no layers, so an NVFP4 recipe keeps its per-layer scales at 1.0 (no memory effect)
    dmodel = SimpleNamespace(quant_config=target_model.quant_config, config=dcfg.hf_config, layers=[])
    kv_str, kv_dtype = _KVD.configure_kv_cache_dtype(
        server_args_kv_cache_dtype=_RC.get_model().kv_cache_dtype, model=dmodel, model_dtype=dcfg.dtype,
        is_draft_worker=True, is_dflash=False, speculative_draft_attention_backend=None,
        speculative_draft_kv_cache_dtype=spec.speculative_draft_kv_cache_dtype)
    layer_info = _LS.resolve_layer_indices(model=dmodel, model_config=dcfg, is_draft_worker=True, draft_model_idx=0)
    # enable_kv_cache_copy (any speculative run) warms a Triton copy kernel up on the GPU: no memory of its own
    from sglang.srt.mem_cache import memory_pool as _MP

    saved = _MP.MHATokenToKVPool._init_kv_copy_and_warmup
    _MP.MHATokenToKVPool._init_kv_copy_and_warmup = lambda self: setattr(self, "_kv_copy_config", None)
    try:
        return _draft_pool_sizes(server_args, spec_algorithm, target_config, dmodel, dcfg, kv_str, kv_dtype, layer_info)
    finally:
        _MP.MHATokenToKVPool._init_kv_copy_and_warmup = saved


def _draft_pool_sizes(server_args, spec_algorithm, target_config, dmodel, dcfg, kv_str, kv_dtype, layer_info):
    import copy

    sizes_bytes = []
    for n in (4096, 8192):
        cfg = copy.copy(target_config)
        cfg.max_total_num_tokens = n
        kvc = _KVC.KVCacheConfigurator(
            device="cpu", gpu_id=0, attn_dp_size=_RC.get_parallel().attn_dp_size, pp_size=1, pp_group=None,
            model=dmodel, model_config=dcfg, server_args=server_args, kv_cache_dtype=kv_dtype,
            kv_cache_dtype_str=kv_str if kv_str is not None else _RC.get_model().kv_cache_dtype, model_dtype=dcfg.dtype,
            page_size=_RC.get_schedule().page_size, sliding_window_size=None, spec_algorithm=spec_algorithm,
            is_draft_worker=True, post_capture_kv_active=False, spec_aux_config=_SAH.SpecAuxHiddenStateConfig(),
            draft_parallel_layout=None, is_hybrid_swa=dcfg.is_hybrid_swa, is_hybrid_swa_compress=dcfg.is_hybrid_swa_compress,
            use_mla_backend=dcfg.attention_arch == AttentionArch.MLA, layer_info=layer_info, forward_stream=None,
            req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=cfg, draft_model_idx=0)
        sizes = kvc._derive_pool_sizes(config=cfg)
        # the target's req_to_token pool is shared; the KV pool reads only its mamba pool and row count
        shared = SimpleNamespace(mamba_pool=None, req_to_token=torch.zeros((1, 1), dtype=torch.int32))
        pool = kvc._build_token_to_kv_pool(sizes=sizes, is_dsa_model=False, is_dsv4_model=False, req_to_token_pool=shared)
        kv = pool.get_kv_size_bytes()
        sizes_bytes.append(sum(kv) if isinstance(kv, tuple) else kv)
        del pool
    return (sizes_bytes[1] - sizes_bytes[0]) / 4096


@contextlib.contextmanager
def _patched_all_reduce():
    torch.distributed.all_reduce = _fake_all_reduce
    try:
        yield
    finally:
        torch.distributed.all_reduce = _orig_all_reduce


def _num_kv_layers(kvc):
    mamba = _KVC.mambaish_config(kvc.model_config)
    if mamba:
        return len([i for i in mamba.full_attention_layer_ids
                    if kvc.layer_info.start_layer <= i < kvc.layer_info.end_layer])
    return kvc.layer_info.num_effective_layers


def _cell_figures(out, kvc, pc, spec_algorithm):
    total = getattr(pc, "_cell_size", None)
    out["total_cell_size"] = total
    has_draft = (spec_algorithm.is_eagle() or spec_algorithm.is_standalone()) and not spec_algorithm.is_none()
    if isinstance(pc, _PC.DefaultPoolConfigurator):
        target = pc._compute_cell_size(kvc, _num_kv_layers(kvc))
        out["cell_size"] = target
        out["draft_cell_size"] = (total - target) if has_draft and total is not None else None
    else:
        # Hybrid SWA: per *full* token, target layers; the draft part is reported separately.
        for k in ("_full_per_token", "_swa_per_token", "_full_layers_num", "_swa_layers_num",
                  "_swa_full_tokens_ratio", "_draft_cell_size", "_draft_full_layers_num",
                  "_draft_swa_layers_num"):
            if hasattr(pc, k):
                out[k.lstrip("_")] = getattr(pc, k)
        draft = getattr(pc, "_draft_cell_size", None)
        out["draft_cell_size"] = draft if has_draft else None
        if total is not None:
            out["cell_size"] = total - (draft or 0) if has_draft else total
        else:
            out["cell_size"] = None


def _mamba_figures(out, kvc):
    mamba = kvc.mambaish_config
    out["state_bytes_per_request"] = None
    out["mamba_slots_per_request"] = None
    out["max_mamba_cache_size"] = None
    out["intermediate_state_bytes"] = None
    before = _REC.get("rest_gib_before_state")
    out["rest_bytes"] = int(before * _GIB) if before is not None else out.get("kv_budget_bytes")
    if mamba is None:
        return
    params = mamba.mamba2_cache_params
    per_req = params.mamba_cache_per_req
    out["state_bytes_per_request"] = per_req
    out["mamba_layers"] = len(params.layers)
    out["mamba_slots_per_request"] = kvc._calculate_mamba_ratio()
    size = _RC.get_schedule().max_mamba_cache_size
    out["max_mamba_cache_size"] = size
    after = _REC.get("rest_gib_after_state")
    if before is not None and after is not None and size is not None:
        # the pool's per-rank state bytes as _handle_max_mamba_cache charges them
        pp = kvc.pp_size
        all_layers = params.layers
        if pp > 1 and all_layers:
            stage = max(
                sum(1 for i in all_layers if s <= i < e)
                for s, e in (get_pp_indices(kvc.model_config.num_hidden_layers, r, pp) for r in range(pp))
            )
            stage_per_req = int(per_req * (stage / len(all_layers)))   # SGLang's pp_layer_scale, same float order
        else:
            stage_per_req = per_req
        state_bytes = (size + 1) * stage_per_req
        out["state_pool_bytes"] = state_bytes
        out["state_bytes_per_slot"], out["state_pool_allocated_bytes"] = _mamba_pool_bytes(kvc, params, size)
        inter = int(round((before - after) * _GIB - state_bytes))
        out["intermediate_state_bytes"] = inter if inter > 0 else 0


def _mamba_pool_bytes(kvc, params, size):
    """What this rank's state pool holds: SGLang's MambaPool built on the meta device (no memory) for the layers
    KVCacheConfigurator gives this rank: (one slot's conv + SSM bytes, the pool's at max_mamba_cache_size)."""
    from sglang.srt.mem_cache.memory_pool import MambaPool, get_tensor_size_bytes

    layer_ids = kvc._get_mamba_layer_ids_for_req_pool()
    if not layer_ids:
        return 0, 0
    total = {}
    for n in (1, 2, size):
        pool = MambaPool(size=n, spec_state_size=0, cache_params=params, mamba_layer_ids=layer_ids, device="meta")
        total[n] = int(get_tensor_size_bytes(pool.mamba_cache.conv) + get_tensor_size_bytes(pool.mamba_cache.temporal))
    return total[2] - total[1], total[size]


def _common_figures(server_args, model_config):
    sch = _RC.get_schedule()
    spec = _RC.get_spec()
    graph = _RC.get_exec().graph.cuda_graph_config
    return dict(
        mem_fraction_static=sch.mem_fraction_static,
        chunked_prefill_size=sch.chunked_prefill_size,
        cuda_graph_max_bs=graph.decode.max_bs,
        context_len=model_config.context_len,
        page_size=sch.page_size,
        attention_arch=getattr(model_config.attention_arch, "name", str(model_config.attention_arch)),
        is_hybrid_swa=bool(model_config.is_hybrid_swa),
        speculative_algorithm=spec.speculative_algorithm,
        speculative_num_draft_tokens=spec.speculative_num_draft_tokens,
        speculative_num_steps=spec.speculative_num_steps,
        requested_max_running_requests=sch.max_running_requests,
        attention_backend=_safe(lambda: _RC.get_exec().kernel.attention_backend),
        prefill_attention_backend=_safe(lambda: _RC.get_exec().kernel.prefill_attention_backend),
        decode_attention_backend=_safe(lambda: _RC.get_exec().kernel.decode_attention_backend),
        disable_radix_cache=_safe(lambda: _RC.get_memory().disable_radix_cache),
        disable_overlap_schedule=sch.disable_overlap_schedule,
        mamba_ssm_dtype=_safe(lambda: server_args.resolved_dict().get("mamba_ssm_dtype")),
        enable_mamba_extra_buffer=_safe(lambda: _RC.get_exec().mamba.enable_mamba_extra_buffer),
        mamba_full_memory_ratio=_safe(lambda: sch.mamba_full_memory_ratio),
        swa_full_tokens_ratio=_safe(lambda: sch.swa_full_tokens_ratio),
        tp_size=_RC.get_parallel().tp_size,
        pp_size=_RC.get_parallel().pp_size,
        attn_tp_size=_RC.get_parallel().attn_tp_size,
        attn_dp_size=_RC.get_parallel().attn_dp_size,
        model_dtype=str(model_config.dtype).replace("torch.", ""),
        quantization=model_config.quantization,
    )


def _safe(fn):
    try:
        v = fn()
        json.dumps(v)
        return v
    except Exception:
        return None


def run_case(case: dict) -> dict:
    G.sm = int(round(float(case["gpu"]["sm"]) * 10))
    gib = case["gpu"].get("memory_gib")   # a GPU given by a decimal GiB figure: whole bytes below it
    G.total_mib = gib * 1024 if gib is not None else int(case["gpu"]["total_mib"])
    G.total_bytes = int(gib * _GIB) if gib is not None else int(case["gpu"]["total_mib"]) * _MIB
    G.weights_bytes = int(case["weights_bytes_per_gpu"])
    G.loaded = False
    _RC.reset_context()
    argv = ["--model-path", case["model_dir"], *case.get("argv", [])]
    with _RC.override_platform(**_platform_facts()):
        try:
            server_args = prepare_server_args(argv)
            # prepare_server_args re-configures root logging onto stdout-less basicConfig;
            # keep SGLang's logs on stderr and quiet.
            _quiet_logging()
            server_args.resolve_once()
        except _REFUSAL_TYPES as e:
            raise Refused("resolve", e) from e
        _RC.publish(server_args, role="scheduler",
                    ranks=_RC.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
        try:
            model_config = ModelConfig.from_server_args(server_args)
        except _REFUSAL_TYPES as e:
            raise Refused("model_config", e) from e
        try:
            _attention_shards(model_config)
        except _REFUSAL_TYPES as e:
            raise Refused("model_load", e) from e
        common = _common_figures(server_args, model_config)
        try:
            quant_config, quant_path = _quant_config(model_config, server_args)
        except _REFUSAL_TYPES as e:
            raise Refused("quant_config", e) from e
        swa_method, model_class = _sliding_window_method(model_config)
        pp_size = _RC.get_parallel().pp_size
        node = _node_placement()
        tp_rank = node["tp_ranks"][0] if node else 0
        # pass 1: each PP rank alone (collective = identity)
        _PPR.target = None
        ranks = [_size_one_rank(server_args, model_config, quant_config, r, pp_size, swa_method, tp_rank)
                 for r in range(pp_size)]
        if pp_size > 1:
            _PPR.target = min(r["max_total_num_tokens"] for r in ranks)
            try:
                ranks = [_size_one_rank(server_args, model_config, quant_config, r, pp_size, swa_method, tp_rank)
                         for r in range(pp_size)]
            finally:
                _PPR.target = None
    res = dict(common)
    res.update({k: v for k, v in ranks[0].items() if k != "pp_rank"})
    res["model_class"] = model_class
    res["quant_config"] = type(quant_config).__name__ if quant_config is not None else None
    res["quant_config_path"] = quant_path
    res["kv_cache_quant_algo"] = getattr(quant_config, "kv_cache_quant_algo", None)
    if pp_size > 1:
        res["pp_ranks"] = ranks
    if node:
        res["node"] = node
    return res


def _node_placement():
    """With --nnodes > 1: the PP and TP ranks SGLang's launcher runs on this --node-rank (its own
    entrypoints/engine.py _calculate_rank_ranges, from the published parallel context), each [first, last]; the
    case is then sized as that node's first TP rank. None on one node."""
    par = _RC.get_parallel()
    if par.nnodes <= 1:
        return None
    from sglang.srt.entrypoints.engine import _calculate_rank_ranges  # imported with the others, before the emulation

    pp_r, tp_r, _, _ = _calculate_rank_ranges(par.node_rank)
    return {"node_rank": par.node_rank, "nnodes": par.nnodes, "pp_ranks": [pp_r.start, pp_r.stop - 1],
            "tp_ranks": [tp_r.start, tp_r.stop - 1]}


def _attention_shards(model_config):
    """The attention-TP split the model's layers assert while loading (the oracle loads no model): SGLang's own
    QKVParallelLinear with the attention-TP group's size. MLA models divide their query heads the same way
    (deepseek_v2.py asserts num_heads % attn_tp_size == 0), so they are checked with heads for KV heads."""
    from sglang.srt.layers import linear as _LIN

    attn_tp = _RC.get_parallel().attn_tp_size
    heads = model_config.num_attention_heads
    kv = heads if model_config.attention_arch == AttentionArch.MLA else model_config.get_total_num_kv_heads()
    saved = _LIN.get_group_rank_size, _LIN._resolve_linear_group
    _LIN.get_group_rank_size, _LIN._resolve_linear_group = (lambda g: (0, attn_tp)), (lambda g: g)
    try:
        _LIN.QKVParallelLinear(hidden_size=8, head_size=1, total_num_heads=heads, total_num_kv_heads=kv, bias=False,
                               quant_config=None)
    finally:
        _LIN.get_group_rank_size, _LIN._resolve_linear_group = saved


def _quiet_logging():
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("[sglang] %(levelname)s %(name)s: %(message)s"))
    root.addHandler(h)
    root.setLevel(logging.ERROR if not os.environ.get("ORACLE_VERBOSE") else logging.INFO)


_FIELDS = (
    "id", "refused", "mem_fraction_static", "chunked_prefill_size", "cuda_graph_max_bs",
    "context_len", "page_size", "kv_cache_dtype", "attention_arch", "is_hybrid_swa",
    "cell_size", "draft_cell_size", "state_bytes_per_request", "mamba_slots_per_request",
    "max_mamba_cache_size", "intermediate_state_bytes", "rest_bytes", "max_total_num_tokens",
    "swa_max_total_num_tokens", "max_running_requests", "speculative_num_draft_tokens", "draft_pool_bytes_per_token",
)


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def main() -> int:
    cases = json.load(sys.stdin)
    results = []
    env0 = dict(os.environ)
    for case in cases:
        t = time.time()
        cid = case.get("id")
        # SGLang's resolution exports env vars (e.g. SGLANG_MAMBA_SSM_DTYPE from
        # --mamba-ssm-dtype, serving_hook.handle_environment_variables): start every case
        # from the same environment.
        os.environ.clear()
        os.environ.update(env0)
        try:
            r = run_case(case)
            out = {"id": cid, "refused": None}
            out.update(r)
        except Refused as e:
            out = {"id": cid, "refused": str(e).split("\n")[0][:500], "refused_stage": e.stage}
            if os.environ.get("ORACLE_TRACE"):
                out["traceback"] = "".join(traceback.format_exception(e.exc))[-3000:]
            for k in _FIELDS:
                out.setdefault(k, None)
        except Exception as e:
            out = {"id": cid, "oracle_error": f"{type(e).__name__}: {e}"[:1000],
                   "traceback": traceback.format_exc()[-3000:]}
        finally:
            G.loaded = False
            _PPR.target = None
            torch.distributed.all_reduce = _orig_all_reduce
        out["oracle_seconds"] = round(time.time() - t, 3)
        results.append(_jsonable(out))
    print(f"[oracle] {len(results)} cases, import {_IMPORT_S:.1f}s, total {time.time() - _T0:.1f}s",
          file=sys.stderr)
    _real_stdout.write(json.dumps(results, indent=1))
    _real_stdout.write("\n")
    _real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
