"""engine/config.py: EngineConfig, the one home of engine settings and their checks."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from corps.cache.errors import InvalidRequest
from corps.engine.config import (
    ATTENTION_BACKENDS,
    CONTEXTS,
    DTYPES,
    MODES,
    BadConfig,
    EngineConfig,
)

from conftest import open_tiny


def test_defaults_and_the_valid_values():
    cfg = EngineConfig.of()
    assert (cfg.model, cfg.mode, cfg.dtype, cfg.device) == (
        "smollm2-135m",
        "choreographed",
        "auto",
        "cpu",
    )
    assert MODES == ("choreographed", "baseline", "hf")
    assert set(DTYPES) == {"auto", "mixed", "float32", "bfloat16", "float16"}
    assert CONTEXTS == ("copy", "store")
    assert "torch" in ATTENTION_BACKENDS


def test_it_is_frozen_and_pickles():
    cfg = EngineConfig.of("some/model", mode="baseline", capacity=1024, trace="t.jsonl")
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    with pytest.raises(Exception, match="frozen"):
        cfg.mode = "hf"  # type: ignore[misc]


def test_fields_override_a_config_and_keep_the_rest():
    base = EngineConfig.of("m", dtype="float32", contexts="store")
    cfg = EngineConfig.of(base, mode="baseline")
    assert (cfg.model, cfg.dtype, cfg.contexts, cfg.mode) == ("m", "float32", "store", "baseline")
    assert EngineConfig.of(base) == base


@pytest.mark.parametrize(
    ("fields", "at_fault", "says"),
    [
        (dict(mode="fast"), ("mode",), "mode must be one of choreographed, baseline, hf"),
        (dict(dtype="int8"), ("dtype",), "dtype must be one of"),
        (dict(contexts="shared"), ("contexts",), "contexts must be one of copy, store"),
        (dict(leak_policy="maybe"), ("leak_policy",), "leak_policy must be one of"),
        (dict(device="tpu"), ("device",), r"'cpu' or 'cuda\[:N\]'"),
        (dict(capacity=0), ("capacity",), "greater than or equal to 16"),
        (dict(queue_size=0), ("queue_size",), "greater than or equal to 1"),
        (dict(max_workflows=0), ("max_workflows",), "greater than or equal to 1"),
        (dict(run_ahead=0), ("run_ahead",), "greater than or equal to 1"),
        (dict(run_ahead="many"), ("run_ahead",), "integer"),
        (dict(run_ahead=2.5), ("run_ahead",), "integer"),
        (dict(colour="red"), ("colour",), "unknown engine setting 'colour'"),
        (dict(contexts="store", attention="flex"), ("contexts", "attention"), "torch attention"),
        (dict(decision_repair="query:2"), ("decision_repair",), "each part is none, full"),
        (dict(decision_repair=["full"]), ("decision_repair",), "string"),
        (dict(repair="\udcff"), ("repair",), "each part is none, full"),
        (dict(weights="q4"), ("weights",), "weights must be one of auto, dense, gguf, int8"),
        (dict(weights=4), ("weights",), "weights must be one of"),
        (dict(weights="int8", device="cuda"), ("weights",), "int8 CPU kernel.*int4"),
        (dict(weights="gguf", mode="hf"), ("weights",), "not for mode='hf'"),
    ],
)
def test_bad_values_say_which_setting_and_what_it_takes(fields, at_fault, says):
    with pytest.raises(BadConfig, match=says) as info:
        EngineConfig.of(**fields)
    assert info.value.fields == at_fault
    assert isinstance(info.value, InvalidRequest)
    assert info.value.for_cli().startswith("--" + at_fault[0].replace("_", "-"))


def test_values_are_normalised():
    cfg = EngineConfig.of(mode=" Baseline ", dtype="FLOAT32", device="CUDA:1")
    assert (cfg.mode, cfg.dtype, cfg.device) == ("baseline", "float32", "cuda:1")
    cfg = EngineConfig.of(decision_repair=" Query:0.30 ")
    assert cfg.decision_repair == "query:0.3"


def test_environment_variables_only_fill_defaults(monkeypatch):
    monkeypatch.setenv("CORPS_CONTEXTS", "store")
    monkeypatch.setenv("CORPS_ATTENTION", " Torch ")
    cfg = EngineConfig.of()
    assert (cfg.contexts, cfg.attention) == ("store", "torch")
    assert EngineConfig.of(contexts="copy").contexts == "copy"  # a field wins
    monkeypatch.setenv("CORPS_CONTEXTS", "nope")
    with pytest.raises(InvalidRequest, match="CORPS_CONTEXTS must be one of copy, store"):
        EngineConfig.of()


def test_a_config_loads_without_torch():
    code = (
        "import sys, corps.engine.config as c; c.EngineConfig.of(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_not_a_config_is_refused():
    with pytest.raises(InvalidRequest, match="EngineConfig or a model name"):
        EngineConfig.of(42)  # type: ignore[arg-type]


async def test_an_engine_opens_from_a_config_and_reports_it(tiny_dirs):
    from corps.engine import Engine

    cfg = EngineConfig.of(str(tiny_dirs["llama"]), dtype="float32", capacity=512, queue_size=3)
    async with Engine.open(cfg) as engine:
        assert engine.config == cfg and engine.stats().capacity == 512
        h = await engine.prefill("hello")
        assert h.length > 0
    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        assert engine.config.mode == "baseline" and engine.config.dtype == "float32"


async def test_a_bad_setting_fails_before_any_weights_load(tmp_path):
    from corps.engine import Engine

    with pytest.raises(BadConfig, match="dtype"):
        async with Engine.open(str(tmp_path / "no-such-model"), dtype="int4"):
            pass


def test_step_tokens_default_by_device_and_a_given_value_wins():
    from corps.engine.config import step_tokens_for

    assert EngineConfig.of().step_tokens is None
    assert (step_tokens_for("cpu"), step_tokens_for("cuda:1")) == (512, 4096)
    assert EngineConfig.of(step_tokens=40).step_tokens == 40


def test_an_adapter_is_refused_beside_the_files_own_blocks(tmp_path):
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (tmp_path / "adapter_model.safetensors").write_text("{}")
    with pytest.raises(BadConfig, match="an adapter changes them") as info:
        EngineConfig.of(weights="gguf", adapter=tmp_path)
    assert info.value.fields == ("weights", "adapter")
    assert EngineConfig.of(weights="auto", adapter=tmp_path).weights == "auto"  # dense then
