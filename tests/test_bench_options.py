"""cli/bench_options.py: a benchmark's corps error is one printed line and exit 1,
raised alone or from inside a task group of concurrent workflows; anything else
propagates as it is."""

from __future__ import annotations

import anyio
import pytest
import typer

from corps.cache.errors import CacheFullError
from corps.cli.bench_options import run_bench


async def _in_group(exc: BaseException) -> None:
    async def fail() -> None:
        raise exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(fail)


@pytest.mark.parametrize("grouped", [False, True])
def test_a_corps_error_is_one_line_and_exit_1(grouped, capsys, monkeypatch):
    monkeypatch.delenv("CORPS_DEBUG", raising=False)
    exc = CacheFullError("KV store full: 14 token slots needed")

    async def work() -> None:
        if grouped:
            await _in_group(exc)
        raise exc

    with pytest.raises(typer.Exit) as ended:
        run_bench(work)
    assert ended.value.exit_code == 1
    out = capsys.readouterr().err
    assert "KV store full" in out and "Traceback" not in out


def test_any_other_error_propagates():
    with pytest.raises(BaseExceptionGroup):
        run_bench(lambda: _in_group(ValueError("a bug")))
