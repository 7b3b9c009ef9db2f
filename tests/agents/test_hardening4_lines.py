"""Issue 44.3: "one line, before work" on the new surfaces. A remote server's error text
reaches a terminal or an exception message only terminal-safe (OSC 52 and clear-screen shown,
not obeyed) and on one line; ``python -m agents play`` reports an OpenAI-compatible server's
failure in one line; a sampling temperature that would overflow the logits is refused with
its range before anything loads; a ``leader.json`` whose ``policy_kwargs`` are out of bounds
or do not fit the saved tensors is refused in one line before any network is built."""

from __future__ import annotations

import importlib.util

import pytest
from http_stub import ScriptedServer

HOSTILE = "boom\x1b]52;c;ZXZpbA==\x07\x1b[2J\x9b31m\nsecond line\u202e"
"""An error text that writes the clipboard (OSC 52), clears the screen, uses the C1 CSI,
breaks the line and reorders the text after it."""


def _safe_one_line(message: str) -> None:
    assert "\x1b" not in message and "\x07" not in message and "\x9b" not in message
    assert "\u202e" not in message and "\n" not in message and "\r" not in message
    assert "\\x1b]52;c;ZXZpbA==\\x07" in message  # shown, written out


# ---------------------------------------------------------------------------- remote error texts


@pytest.mark.parametrize("status, body", [
    (400, {"error": HOSTILE}),                        # a retrieval server's {"error": "..."}
    (400, {"error": {"message": HOSTILE}}),           # OpenAI-style
    (404, "<html>" + HOSTILE + "</html>"),            # not JSON: an excerpt
    (503, {"error": HOSTILE}),                        # retried, then "last error: ..."
])
def test_a_servers_error_text_reaches_the_message_terminal_safe(status, body):
    from envs.http import post_json

    with ScriptedServer([(status, body)]) as srv:
        with pytest.raises(RuntimeError) as err:
            post_json(srv.url + "/retrieve", {"queries": ["q"]}, retries=1, backoff=0.0, timeout=10)
    _safe_one_line(str(err.value))
    assert str(err.value).startswith(f"POST {srv.url}/retrieve")


def test_a_bad_status_line_is_shown_terminal_safe():
    from envs.http import post_json

    with ScriptedServer([(None, b"HTTP/1.1 2\x1b]52;c;ZXZpbA==\x07\x1b[2J OK\r\n\r\n")]) as srv:
        with pytest.raises(RuntimeError) as err:
            post_json(srv.url + "/retrieve", {"queries": ["q"]}, retries=0, timeout=10)
    message = str(err.value)
    assert "\x1b" not in message and "\x07" not in message and "BadStatusLine" in message


def test_the_remote_retriever_error_is_terminal_safe():
    from envs.retrieval import RemoteRetriever, RetrievalError

    with ScriptedServer([(400, {"error": HOSTILE})]) as srv:
        remote = RemoteRetriever(srv.url + "/retrieve", retries=0)
        with pytest.raises(RetrievalError) as err:
            remote.search(["q"])
    _safe_one_line(str(err.value))


needs_openai = pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="no openai SDK")


@needs_openai
@pytest.mark.parametrize("status, body", [(400, {"error": {"message": HOSTILE}}), (200, HOSTILE)])
def test_an_openai_compatible_servers_error_is_terminal_safe(tokenizer, status, body):
    import numpy as np

    from agents.base import Observation
    from agents.openai_chat import OpenAIError, OpenAIPolicy

    obs = Observation(agent="leader_0", role="leader", token_ids=np.zeros(1, dtype=np.int64),
                      messages=({"role": "user", "content": "Q"},), stop=("</subtask>",), max_new_tokens=8)
    with ScriptedServer([(status, body)]) as srv:
        policy = OpenAIPolicy("m", base_url=srv.url + "/v1", retries=0, timeout=10)
        try:
            with pytest.raises(OpenAIError) as err:
                policy.act([obs])
        finally:
            policy.close()
    _safe_one_line(str(err.value))


@needs_openai
def test_agents_play_reports_an_openai_error_in_one_line(capsys, monkeypatch):
    import envs
    from agents.__main__ import main
    from envs.retrieval.factory import make_retriever

    words, real = make_retriever("words"), envs.make_env
    monkeypatch.setattr(envs, "make_env", lambda **kw: real(retriever=words, **kw))  # no encoder to build
    with ScriptedServer([(400, {"error": {"message": HOSTILE}})]) as srv:
        rc = main(["play", "--question", "Who directed X?", "--policy", f"openai:m@{srv.url}/v1",
                   "--max-new-tokens", "8"])
    out, err = capsys.readouterr()
    assert rc == 1  # was: the OpenAIError's 27-line traceback
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m agents play: POST ")
    assert "HTTP 400" in lines[0]
    _safe_one_line(lines[0])
    assert "\x1b" not in out


# ---------------------------------------------------------------------------- sampling settings


def test_the_temperature_floor_is_the_logit_bound_over_the_dtypes_max():
    import torch

    from agents.sampling import FLOAT_MAX, LOGIT_BOUND, min_temperature

    assert LOGIT_BOUND == 1000.0
    for name in ("float16", "bfloat16", "float32", "float64"):
        assert FLOAT_MAX[name] == torch.finfo(getattr(torch, name)).max
    assert min_temperature("float16") == pytest.approx(1000 / 65504)  # 0.015266...
    assert min_temperature() == min_temperature("float32") == pytest.approx(2.93873605e-36)
    # the floor is tight: at it, logits of +-1000 divide to the dtype's max; a hair below, inf
    for name in ("float16", "bfloat16", "float32"):
        logits = torch.tensor([1000.0, -1000.0], dtype=getattr(torch, name))
        assert torch.isfinite(logits / min_temperature(name)).all()
        assert not torch.isfinite(logits / (min_temperature(name) * 0.99)).any()


def test_a_sampler_at_the_floor_samples_and_below_it_fails():
    import torch

    from agents.logprobs import next_tokens
    from agents.sampling import min_temperature

    logits = torch.tensor([[1000.0, -1000.0, 0.0]])
    generator = torch.Generator().manual_seed(0)
    tokens, logps = next_tokens(logits, min_temperature(), 1.0, generator)
    assert tokens.tolist() == [0] and logps.tolist() == [0.0]
    with pytest.raises(ValueError, match="NaN or infinite"):  # what the floor keeps from happening
        next_tokens(logits, min_temperature() / 10, 1.0, generator)


@pytest.mark.parametrize("text", ["1e-40", "1e-37", "2.9e-36", "5e-324"])
def test_a_temperature_that_overflows_the_logits_is_refused_with_its_range(text, capsys):
    from agents.__main__ import main as agents_main
    from agents.registry import check_policy

    with pytest.raises(ValueError) as err:  # was accepted, then died mid-episode blaming the weights
        check_policy(f"hf:smollm2?temperature={text}")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"hf:smollm2?temperature={text}: temperature must be 0 "
                                                      "(greedy) or at least 2.94e-36")
    assert "float32" in message and message.endswith(f"got {text!r}")
    with pytest.raises(SystemExit):
        agents_main(["play", "--policy", "hf:smollm2", "--temperature", text])
    assert "at least 2.94e-36" in capsys.readouterr().err


@needs_openai
def test_the_openai_policy_checks_its_settings_too():
    from agents.openai_chat import OpenAIPolicy

    with pytest.raises(ValueError, match="at least 2.94e-36"):
        OpenAIPolicy("m", temperature=1e-40)
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\]"):
        OpenAIPolicy("m", top_p=0.0)
    OpenAIPolicy("m", temperature=0.0, top_p=1.0).close()


# ---------------------------------------------------------------------------- autocast's cache setting (issue 44.7)


def test_the_compute_context_sets_autocasts_cache_as_asked():
    import torch

    from algos.engine.precision import precision_for

    mixed = precision_for("cpu", "bfloat16")
    outside = torch.is_autocast_cache_enabled()
    for cache in (True, False):
        with mixed.compute(cache=cache):
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            assert torch.is_autocast_cache_enabled() is cache
            layer = torch.nn.Linear(4, 4)
            assert layer(torch.ones(1, 4)).dtype == torch.bfloat16
        assert torch.is_autocast_cache_enabled() is outside  # restored on the way out
    with mixed.compute():  # the default keeps the casts (generation and scoring)
        assert torch.is_autocast_cache_enabled() is True
    with precision_for("cpu", "float32").compute(cache=False):  # no lower dtype: no autocast at all
        assert not torch.is_autocast_enabled("cpu")
