"""Benchmark (GPU): generated tokens/s through trajforge's `vllm` backend vs raw `vllm.LLM.chat`.

`python -m benchmarks.vllm_backend [--model MODEL_OR_PATH] [--prompts 500] [--max-tokens 128]`

Both sides load the same model with the same engine arguments, send the same chat prompts with
greedy sampling and time only the generation (after one warm-up call). Each side runs in its own
child process so each gets the whole GPU. The raw side hands vLLM every prompt in one call: the
best batching there is. The trajforge side sends every prompt as its own concurrent
`LLM.chat` request, as a generator does, and the backend gathers them into batches.
Target: trajforge / raw >= 0.9. Without vLLM or a CUDA device it prints `cannot run: ...`,
writes that into `results/vllm_backend.json` and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import print_rows, row, write_results

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.9
DEFAULT_MODEL = os.environ.get("TRAJFORGE_VLLM_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")


def prompts(n: int) -> list[str]:
    topics = ("a refund policy", "a flight change", "a lost package", "a password reset", "a late order")
    return [f"Customer {i} asks about {topics[i % len(topics)]}. Write the agent's reply." for i in range(n)]


def unavailable() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vllm not installed (pip install -e '.[vllm]' in a GPU venv)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


RAW = r"""
import json, sys, time
from vllm import LLM, SamplingParams
model, n, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from benchmarks.vllm_backend import prompts
convs = [[{"role": "user", "content": p}] for p in prompts(n)]
engine = LLM(model=model, seed=0)  # the engine arguments VLLMLLM uses
params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
engine.chat(convs[:1], sampling_params=params, use_tqdm=False)  # warm-up
t = time.perf_counter()
outs = engine.chat(convs, sampling_params=params, use_tqdm=False)
seconds = time.perf_counter() - t
print("RESULT", json.dumps({"seconds": seconds, "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                            "answered": sum(1 for o in outs if o.outputs[0].text)}))
"""

OURS = r"""
import asyncio, json, sys, time
from backends.config import LLMConfig
from backends.registry import make_llm
from benchmarks.vllm_backend import prompts
model, n, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# Every prompt in flight at once, as a generator with a large concurrency budget would send them.
llm = make_llm(LLMConfig(backend="vllm", model=model, seed=0, max_concurrency=n, min_concurrency=n,
                         request_timeout_s=3600, max_retries=0))

async def main():
    ask = lambda p: llm.chat([{"role": "user", "content": p}], temperature=0.0, max_tokens=max_tokens)
    await ask("warm-up")
    t = time.perf_counter()
    results = await asyncio.gather(*(ask(p) for p in prompts(n)))
    seconds = time.perf_counter() - t
    await llm.aclose()
    return {"seconds": seconds, "tokens": sum(r[0].usage.completion_tokens for r in results),
            "answered": sum(1 for r in results if r[0].text)}

print("RESULT", json.dumps(asyncio.run(main())))
"""


def _child(code: str, model: str, n: int, max_tokens: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", code, model, str(n), str(max_tokens)], cwd=ROOT,
                          capture_output=True, text=True)
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"child exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="HF model id or local path ($TRAJFORGE_VLLM_MODEL)")
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    why = unavailable()
    if why:
        write_results("vllm_backend", [], cannot_run=why)
        print(f"cannot run: {why}")
        return 2
    raw = _child(RAW, args.model, args.prompts, args.max_tokens)
    ours = _child(OURS, args.model, args.prompts, args.max_tokens)
    raw_rate, our_rate = raw["tokens"] / raw["seconds"], ours["tokens"] / ours["seconds"]
    rows = [
        row("raw vLLM LLM.chat (reference)", raw_rate, "tokens/s"),
        row("trajforge vllm backend", our_rate, "tokens/s", raw_rate, "raw vLLM LLM.chat", f">= {TARGET}",
            our_rate / raw_rate >= TARGET),
    ]
    print_rows(f"vllm backend ({args.model}, {args.prompts} prompts x {args.max_tokens} tokens)", rows)
    print(f"ratio trajforge / raw vLLM: {our_rate / raw_rate:.3f} (target >= {TARGET})")
    path = write_results("vllm_backend", rows, model=args.model, prompts=args.prompts, max_tokens=args.max_tokens,
                         raw=raw, trajforge=ours, ratio=round(our_rate / raw_rate, 3))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
