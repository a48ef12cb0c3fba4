"""`corps bench tenants` (bench/tenants.py): a light and a heavy tenant over real HTTP
on a tiny model, structure only (nothing here asserts on a timing)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from corps.bench import tenants as bt
from corps.cli.app import app
from corps.engine.config import EngineConfig
from corps.serve.principals import Keys


def test_the_three_phases_measure_both_tenants(tiny_dirs):
    cfg = EngineConfig.of(str(tiny_dirs["llama"]), dtype="float32", capacity=4096, policy="fair")
    plan = bt.Plan(streams=3, requests=2, tokens=3, heavy_s=0.2)
    s = bt.run_setting(cfg, "tiny", "fair", plan)
    assert len(s.solo.light_ttft) == len(s.together.light_ttft) == 2
    assert s.solo.heavy_tokens == 0 and s.solo.light_tokens >= 2
    assert s.heavy_solo.seconds >= 0.2 and s.together.heavy_tokens >= 0
    row = bt.summary(s)
    assert row["setting"] == "fair" and len(row["light_ttft_p50_s"]) == 2


def test_the_key_file_gives_each_tenant_its_weight(tmp_path):
    keys = Keys.load(bt.key_file(tmp_path, bt.Plan(heavy_weight=3.0)))
    assert keys.weights() == {"light": 1.0, "heavy": 3.0}
    assert keys.principal(f"Bearer {bt.LIGHT_KEY}").tenant == "light"


def test_nearest_rank_percentiles():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert bt.pct(xs, 0.5) == 3.0 and bt.pct(xs, 0.99) == 5.0 and bt.pct([7.0], 0.5) == 7.0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--policies", "lottery"], "policy"),
        (["--modes", " , "], "--modes"),
        (["--modes", "hf-ish"], "mode"),
        (["--streams", "0"], "streams"),
    ],
)
def test_bad_options_are_refused_in_a_line(args, says):
    result = CliRunner().invoke(app, ["bench", "tenants", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output


def test_the_command_prints_the_table(tiny_dirs, monkeypatch):
    monkeypatch.setattr(bt.Plan, "__init__", _short(bt.Plan.__init__))
    result = CliRunner().invoke(
        app,
        ["bench", "tenants", "-m", str(tiny_dirs["llama"]), "--dtype", "float32", "--streams",
         "2", "--requests", "1", "--tokens", "2", "--modes", "choreographed", "--policies",
         "fair"],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "choreographed / fair" in result.output and "light TTFT p50" in result.output


def _short(init):
    def short(self, *args, **kw):
        init(self, *args, **{**kw, "heavy_s": 0.2})

    return short


async def test_a_backlog_measures_each_tenants_service_and_weight(tiny_dirs):
    cfg = EngineConfig.of(str(tiny_dirs["llama"]), dtype="float32", capacity=4096)
    got = await bt.shares(cfg, {"light": 1.0, "heavy": 2.0}, streams=3, tokens=3,
                          seconds=0.5, slots=2)  # fmt: skip
    assert got.weights == {"light": 1.0, "heavy": 2.0} and got.slots == 2
    assert set(got.served) == set(got.completed) == {"light", "heavy"}
    assert all(v >= 0 for v in got.served.values())  # a slow machine may serve one only
    assert got.weights["heavy"] / got.weights["light"] == 2.0
    assert "weight share" in str(bt.shares_table(got, "t").columns[-1].header)
