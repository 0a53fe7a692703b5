"""Writes a request dump with SGLang's own code (run with .venv-serving's python):
TokenizerManager._dump_data_to_file pickles real GenerateReqInput objects and output dicts, exactly as
a server started with --dump-requests-folder does.

    python sglang_dump.py OUT.pkl SPEC.json

SPEC.json: [{"created": s, "finished": s, "input_ids": [...] | null, "text": str | null,
             "max_new_tokens": n, "prompt_tokens": n | null, "completion_tokens": n | null}, ...]
"""
import asyncio
import json
import os
import sys
import types

sys.path.insert(0, os.path.dirname(__file__))
import sglang_env

sglang_env.install()

from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: E402
from sglang.srt.managers.tokenizer_manager import TokenizerManager  # noqa: E402


async def main(out: str, spec: list) -> None:
    reqs = []
    for i, r in enumerate(spec):
        obj = GenerateReqInput(text=r.get("text"), input_ids=r.get("input_ids"), rid=f"req-{i}",
                               sampling_params={"max_new_tokens": r["max_new_tokens"], "temperature": 0.0}, stream=True)
        meta = {"id": f"req-{i}", "finish_reason": {"type": "length"}}
        for k in ("prompt_tokens", "completion_tokens"):
            if r.get(k) is not None:
                meta[k] = r[k]
        meta["cached_tokens"] = 0
        reqs.append((obj, {"text": "x", "meta_info": meta}, r["created"], r["finished"]))
    fake = types.SimpleNamespace(_server_args_for_dump=lambda: None, _dump_config_snapshot=lambda: None)
    TokenizerManager._dump_data_to_file(fake, reqs, out, "dump")
    for _ in range(500):
        await asyncio.sleep(0.01)
        if os.path.exists(out) and os.path.getsize(out) > 0:
            await asyncio.sleep(0.2)
            return
    raise SystemExit("no dump written")


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        job = json.load(f)
    asyncio.run(main(sys.argv[1], job))
