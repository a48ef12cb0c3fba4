"""examples/serve_agents_sdk.py and examples/serve_pydantic_ai.py: two agent frameworks,
unchanged, streaming tool-calling turns from `corps serve` (a tiny model, float32):
each assembles a tool call from the streamed tool-call deltas and runs the tool."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from corps.cli.serve.background import BackgroundServer
from corps.engine.api.engine import Engine

EXAMPLES = Path(__file__).parent.parent / "examples"


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(tiny_dirs):
    opened = Engine.open(str(tiny_dirs["llama"]), dtype="float32", capacity=8192)
    with BackgroundServer(opened, model="tiny") as s:
        yield s


async def test_an_openai_agents_sdk_agent_runs_a_tool_from_a_streamed_call(served):
    pytest.importorskip("agents")
    calls = served.app.state.metrics.completions
    out = await example("serve_agents_sdk").run(served.url + "/v1", "tiny", max_tokens=400)
    assert len(out["called"]) == 1  # the SDK assembled the streamed call and ran the tool
    assert out["output"] == f"It is sunny in {out['called'][0]}."
    assert "raw_response_event" in out["events"] and "run_item_stream_event" in out["events"]
    assert served.app.state.metrics.completions == calls + 1  # one streamed turn


async def test_a_pydantic_ai_agent_runs_a_tool_from_a_streamed_call(served):
    pytest.importorskip("pydantic_ai")
    out = await example("serve_pydantic_ai").run(served.url + "/v1", "tiny", max_tokens=400)
    assert len(out["called"]) == 1  # first step: the streamed call, run
    assert out["pieces"] and "".join(out["pieces"]) == out["output"]  # then text, streamed
