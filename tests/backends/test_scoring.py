"""Prompt logprobs (teacher forcing): vLLM's parameter over HTTP, llama.cpp embedded, and servers that cannot score."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from backends import make_llm
from backends.fake_server import FakeServer, Fault, Rule
from backends.scoring import ScoringError, ScoringUnsupported, TokenLogprob, parse_prompt_logprobs, target_loss

CHAT = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 is 4."}, {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You are welcome."}]


def _llm(server: FakeServer, tmp_path, **extra):
    return make_llm({"backend": "openai", "base_url": server.base_url, "model": "student", "api_key_env": None,
                     "max_retries": 0, "request_timeout_s": 5, "cache_path": str(tmp_path / "cache.sqlite"), **extra})


def test_prompt_logprobs_from_an_openai_compatible_server_are_cached(tmp_path):
    # Each assistant word costs more than the rest: the loss of the targets is exactly that cost.
    def logprob(body):
        return -2.0 if body["messages"][2]["content"] == "2+2 is 4." else -9.0

    async def go(server):
        async with _llm(server, tmp_path) as llm:
            first = await llm.prompt_logprobs(CHAT)
            again = await llm.prompt_logprobs(CHAT)
            return first, again, llm.stats

    with FakeServer(prompt_logprob=logprob) as server:
        tokens, again, stats = asyncio.run(go(server))
        sent = [e["body"] for e in server.log]
    assert len(sent) == 1 and sent[0]["prompt_logprobs"] == 1 and sent[0]["max_tokens"] == 1
    assert again == tokens and stats.cache_hits == 1
    assert tokens[0].logprob is None and "".join(t.text for t in tokens).count("2+2 is 4.") == 1
    loss = target_loss(tokens, CHAT, [2, 4])
    assert loss.mean_nll == pytest.approx(2.0) and loss.tokens == 10  # words and the spaces between them
    assert target_loss(tokens, CHAT, [2]).tokens == 5  # "2+2", " ", "is", " ", "4."


@pytest.mark.parametrize("server_kwargs, why", [
    ({"prompt_logprob": None}, "returned no prompt_logprobs"),
    ({"rules": [Rule(answer=Fault("400", message="Unrecognized request argument supplied: prompt_logprobs"))]},
     "refused prompt_logprobs"),
])
def test_a_server_that_cannot_score_says_so(tmp_path, server_kwargs, why):
    async def go(server):
        async with _llm(server, tmp_path) as llm:
            await llm.prompt_logprobs(CHAT)

    with FakeServer(**server_kwargs) as server, pytest.raises(ScoringUnsupported, match=why):
        asyncio.run(go(server))


def test_backends_without_scoring_raise_the_capability_error():
    async def go():
        async with make_llm({"backend": "fake"}) as llm:
            await llm.prompt_logprobs(CHAT)

    with pytest.raises(ScoringUnsupported, match="fake backend cannot score"):
        asyncio.run(go())


def test_vllm_entries_pick_the_prompt_token_and_targets_must_be_found():
    entries = [None, {"7": {"logprob": -0.5, "rank": 1, "decoded_token": "a"}},
               {"9": {"logprob": -0.1, "rank": 1, "decoded_token": "x"}, "3": {"logprob": -3.0, "rank": 12,
                                                                               "decoded_token": "b"}}]
    assert parse_prompt_logprobs(entries) == [TokenLogprob("", None), TokenLogprob("a", -0.5), TokenLogprob("b", -3.0)]
    with pytest.raises(ScoringError, match="message 1"):
        target_loss(parse_prompt_logprobs(entries), [{"role": "user", "content": "a"},
                                                     {"role": "assistant", "content": "zzz"}], [1])


@pytest.mark.local_llm
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not importable")
def test_llamacpp_scores_a_sensible_answer_above_nonsense():
    async def go():
        async with make_llm({"backend": "llamacpp", "n_ctx": 256}) as llm:
            out = []
            for answer in ("2+2 is 4.", "2+2 is purple banana."):
                chat = [*CHAT[:2], {"role": "assistant", "content": answer}]
                out.append(target_loss(await llm.prompt_logprobs(chat), chat, [2]).mean_nll)
            return out

    sensible, nonsense = asyncio.run(go())
    assert 0 < sensible < nonsense
