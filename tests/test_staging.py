"""model/staging.py: a model directory appears whole or not at all."""

from __future__ import annotations

import pytest

from corps.engine.model.staging import staged


def done(path) -> bool:
    return (path / "config.json").is_file()


def test_the_directory_appears_whole_and_the_scratch_goes(tmp_path):
    target = tmp_path / "models" / "m"
    with staged(target, ".m-", done) as work:
        (work / "model").mkdir()
        (work / "model" / "config.json").write_text("{}")
        assert not target.exists()  # nothing visible until it is whole
    assert done(target) and sorted(p.name for p in target.parent.iterdir()) == ["m"]


def test_a_failed_build_leaves_nothing(tmp_path):
    target = tmp_path / "m"
    with pytest.raises(RuntimeError), staged(target, ".m-", done) as work:
        (work / "model").mkdir()
        raise RuntimeError("conversion failed")
    assert list(tmp_path.iterdir()) == []


def test_another_process_that_finished_first_wins(tmp_path):
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text('{"theirs": 1}')
    with staged(target, ".m-", done) as work:
        (work / "model").mkdir()
        (work / "model" / "config.json").write_text('{"ours": 1}')
        (work / "model" / "more").write_text("x")  # a non-empty dir: the rename fails
    assert (target / "config.json").read_text() == '{"theirs": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
