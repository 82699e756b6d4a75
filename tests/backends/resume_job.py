"""A tiny LLM job run as a subprocess by test_resume (so it can be SIGKILLed midway).

Usage: resume_job.py BASE_URL CACHE_PATH OUT_PATH N
"""

from __future__ import annotations

import asyncio
import json
import sys

from backends import LLMConfig, make_llm


def prompt(i: int) -> str:
    return f"item {i}"


async def main(base_url: str, cache: str, out: str, n: int) -> None:
    cfg = LLMConfig(
        backend="openai", model="fake-model", base_url=base_url, api_key_env=None,
        max_concurrency=8, cache_path=cache, backoff_base_s=0.01,
    )
    async with make_llm(cfg) as llm:
        answers = await asyncio.gather(*(llm.chat([{"role": "user", "content": prompt(i)}]) for i in range(n)))
    with open(out, "w") as f:
        json.dump({prompt(i): a[0].text for i, a in enumerate(answers)}, f)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
