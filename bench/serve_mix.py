"""The workflows `corps bench serve` mixes: the default mix, and `--mix` read as
pattern names or a JSON / TOML file of their settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The default mix: small settings of three patterns, so a run fits a CPU.
MIX: dict[str, dict[str, Any]] = {
    "tree_of_thoughts": dict(branches=4, voters=2, max_tokens=32),
    "multi_qa": dict(max_tokens=24),
    "debate": dict(rounds=1, max_tokens=32),
}


def load_mix(value: str) -> dict[str, dict[str, Any]]:
    """`--mix`: built-in patterns by name, comma-separated (each at its small setting in
    `MIX`, or its defaults), or a JSON / TOML file mapping patterns to their settings
    (`{"map_reduce": {"chunk_tokens": 128}, "debate": {"rounds": 1}}`). Settings are
    checked as `corps run --set` checks them; InvalidRequest says what is wrong."""
    import json
    import tomllib

    from corps.cache.errors import InvalidRequest
    from corps.patterns import registry

    path = Path(value)
    if path.suffix in (".json", ".toml"):
        if not path.is_file():
            raise InvalidRequest(f"--mix: no file {value!r}")
        try:
            text = path.read_text()
            raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise InvalidRequest(f"--mix: {value} is not valid {path.suffix[1:]}: {exc}") from None
        if (
            not isinstance(raw, dict)
            or not raw
            or not all(isinstance(v, dict) for v in raw.values())
        ):
            raise InvalidRequest(f"--mix: {value} must map pattern names to their settings")
    else:
        names = [m.strip() for m in value.split(",") if m.strip()]
        if not names:
            raise InvalidRequest("--mix: give pattern names or a .json / .toml file")
        raw = {n: MIX.get(registry.canonical(n), {}) for n in names}
    mix = {}
    for name, settings in raw.items():
        fn = registry.get(name)  # UnknownPattern lists the built-ins
        registry.validate(fn, settings, where=f"--mix {fn.__name__}: ")
        mix[fn.__name__] = dict(settings)
    return mix
