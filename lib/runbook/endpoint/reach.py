"""Is an OpenAI-compatible server there, which model does it serve, and running async code from notebooks."""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import aiohttp


async def probe(base: str, timeout: float = 5.0) -> Optional[str]:
    """None when the server answers /v1/models, else why not."""
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                return None if r.status < 500 else f"HTTP {r.status}"
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return str(e) or type(e).__name__


async def model_name(url: str, api_key: Optional[str]) -> Optional[str]:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url.rstrip("/") + "/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
                             timeout=aiohttp.ClientTimeout(total=10)) as r:
                data = await r.json(content_type=None)
                return (data.get("data") or [{}])[0].get("id")
    except Exception:
        return None


def run_sync(coro: Any) -> Any:
    """asyncio.run, also from inside Jupyter (whose kernel already runs a loop): then in a thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()
