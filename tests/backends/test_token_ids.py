"""Token truth per model call: the ids a model was fed and produced and their logprobs, recorded as the backend
reported them (the fake server over HTTP in vLLM's shape, a tiny transformers model), switched by `llm.token_ids`."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from backends.fake_server import Rule, ToolCallAnswer
from backends.registry import make_llm
from schemas.arrow import TRAJECTORY_SCHEMA, trajectory_from_row, trajectory_to_row
from schemas.models import MessageAction, Tokens, Trajectory, Usage
from tests.export import _tiny

ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "say hello twice"}]
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


def _ask(cfg, messages=ASK, **kwargs):
    async def go():
        async with make_llm(cfg) as llm:
            completions = await llm.chat(messages, **kwargs)
            return completions, [llm.step_usage(c) for c in completions]
    return asyncio.run(go())


def test_the_openai_backend_records_the_ids_and_logprobs_a_vllm_server_returned(fake_server, client_config):
    srv = fake_server()
    completions, usages = _ask(client_config(srv), n=2, temperature=1.0)
    [entry] = [e for e in srv.log if "body" in e]
    # "auto": the server's /models says vLLM, so the request asked for ids and logprobs.
    assert entry["body"]["return_token_ids"] is True and entry["body"]["logprobs"] is True
    for i, (c, u) in enumerate(zip(completions, usages)):
        assert c.tokens is not None and u.tokens is not None
        assert u.tokens.prompt_ids == entry["prompt_token_ids"] and len(u.tokens.prompt_ids) > 5
        assert u.tokens.completion_ids == entry["token_ids"][i]
        assert u.tokens.logprobs == [-((k % 8) + 1) / 16 for k in range(len(u.tokens.completion_ids))]
        assert u.tokens.tokenizer == "fake-model" and u.tokens.chat_template is None


def test_tool_call_answers_carry_ids_and_the_cache_keeps_them(tmp_path, fake_server, client_config):
    srv = fake_server(rules=[Rule(answer=ToolCallAnswer("lookup", {"q": "x"}))])
    cfg = client_config(srv, cache_path=str(tmp_path / "cache.sqlite"))
    [fresh], [fresh_usage] = _ask(cfg, tools=TOOLS)
    [again], [again_usage] = _ask(cfg, tools=TOOLS)
    assert fresh.tool_calls and again.cached and len([e for e in srv.log if "body" in e]) == 1
    assert again_usage.tokens == fresh_usage.tokens and fresh_usage.tokens.completion_ids == srv.log[-1]["token_ids"][0]


def test_off_asks_nothing_and_auto_asks_no_server_that_does_not_say_it_is_vllm(fake_server, client_config):
    srv = fake_server()
    [c], [u] = _ask(client_config(srv, token_ids="off"))
    assert "return_token_ids" not in srv.log[-1]["body"] and c.tokens is None and u.tokens is None
    hosted = fake_server(owned_by="openai")
    [c], [u] = _ask(client_config(hosted))
    assert "return_token_ids" not in hosted.log[-1]["body"] and u.tokens is None
    [c], [u] = _ask(client_config(hosted, token_ids="on"))
    assert hosted.log[-1]["body"]["return_token_ids"] is True
    assert u.tokens.completion_ids == hosted.log[-1]["token_ids"][0]


def test_tokens_round_trip_through_arrow_as_int_and_float_lists():
    tokens = Tokens(prompt_ids=[1, 2, 3], completion_ids=[7, 8], logprobs=[-0.1, -2.5], tokenizer="t",
                    chat_template="ab")
    t = Trajectory(id="t1", source="s", steps=[MessageAction(content="hi", usage=Usage(model="m", tokens=tokens))])
    table = pa.Table.from_pylist([trajectory_to_row(t)], schema=TRAJECTORY_SCHEMA)
    usage_type = TRAJECTORY_SCHEMA.field("steps").type.value_type.field("usage").type
    tokens_type = usage_type.field("tokens").type
    assert tokens_type.field("prompt_ids").type == pa.list_(pa.int32())
    assert tokens_type.field("logprobs").type == pa.list_(pa.float32())
    back = trajectory_from_row(table.to_pylist()[0])
    assert back == t and back.steps[0].usage.tokens.logprobs == tokens.logprobs  # float32 values, kept exactly
    with pytest.raises(ValueError, match="2 logprobs for 1 completion ids"):
        Tokens(prompt_ids=[1], completion_ids=[7], logprobs=[-0.1, -0.2])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(_tiny.shared_model_dir(tmp_path_factory))


def test_the_transformers_backend_records_what_generate_produced(model_path):
    import torch

    cfg = {"backend": "transformers", "model_path": model_path, "max_tokens": 5}

    async def go():
        async with make_llm(cfg) as llm:
            [c] = await llm.chat(ASK)
            text, _ = llm.prompt_text(llm._build(ASK, None, None, 1, {}, None))
            return c, llm.step_usage(c), text, llm.model, llm.tokenizer

    c, u, prompt, model, tokenizer = asyncio.run(go())
    t = u.tokens
    assert t is not None and t.tokenizer == model_path and t.chat_template and len(t.chat_template) == 16
    assert t.prompt_ids == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    # The same greedy generation, run by hand: the recorded ids are the model's own.
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([t.prompt_ids]), max_new_tokens=5, do_sample=False,
                             return_dict_in_generate=True, output_logits=True, pad_token_id=0)
        produced = out.sequences[0, len(t.prompt_ids):].tolist()
        assert t.completion_ids == produced and len(produced) == 5  # a random model writes no end token in 5
        logits = model(input_ids=torch.tensor([t.prompt_ids + produced])).logits[0, len(t.prompt_ids) - 1:-1]
        expected = logits.float().log_softmax(-1).gather(1, torch.tensor(produced)[:, None])[:, 0].tolist()
    assert t.logprobs == pytest.approx(expected, abs=1e-4)
    assert all(lp <= 0 for lp in t.logprobs)
    assert tokenizer.decode(t.completion_ids) == c.text


def test_shards_written_before_the_field_read_with_no_tokens():
    from converters.export.records import Batch
    from schemas.arrow import USAGE_TYPE, as_current, readable_as

    old_usage = pa.struct([f for f in USAGE_TYPE if f.name != "tokens"])
    step_type = TRAJECTORY_SCHEMA.field("steps").type.value_type
    old_step = pa.struct([f.with_type(old_usage) if f.name == "usage" else f for f in step_type])
    i = TRAJECTORY_SCHEMA.get_field_index("steps")
    old_schema = TRAJECTORY_SCHEMA.set(i, TRAJECTORY_SCHEMA.field("steps").with_type(pa.list_(old_step)))
    t = Trajectory(id="t1", source="s", steps=[MessageAction(content="hi", usage=Usage(model="m", prompt_tokens=3))])
    row = trajectory_to_row(t)
    for step in row["steps"]:
        step["usage"].pop("tokens")
    old = pa.Table.from_pylist([row], schema=old_schema)
    assert readable_as(old.schema.field("steps").type, TRAJECTORY_SCHEMA.field("steps").type)
    assert Batch(old.to_batches()[0]).step_tokens is None  # the export reads old shards as they are
    back = trajectory_from_row(as_current(old, TRAJECTORY_SCHEMA).to_pylist()[0])
    assert back == t and back.steps[0].usage.tokens is None


def test_off_keeps_no_tokens_in_the_transformers_backend(model_path):
    async def go():
        async with make_llm({"backend": "transformers", "model_path": model_path, "max_tokens": 3,
                             "token_ids": "off", "max_retries": 0}) as llm:
            [c] = await llm.chat(ASK)
            return c, llm.step_usage(c)

    c, u = asyncio.run(go())
    assert c.tokens is None and u.tokens is None and u.completion_tokens == 3


def test_the_vllm_probe_tells_a_server_that_is_down_from_one_that_is_not_vllm(fake_server, client_config):
    import socket

    from backends.openai_backend import serves_token_ids

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    assert serves_token_ids(dead, None, 2.0) is None  # unknown: asked again, never remembered as "no"
    srv = fake_server()
    assert serves_token_ids(srv.base_url, None) is True
    assert serves_token_ids(fake_server(owned_by="openai").base_url, None) is False
