"""`corps models`: the model aliases, dummy shapes and converted models."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def models() -> None:
    """List model aliases, dummy models (real shapes, random weights, for speed) and the
    models converted in $CORPS_HOME."""
    from corps.engine.config import DEFAULT_MODEL
    from corps.engine.model.dummy import PREFIX, SHAPES, dummy_config
    from corps.engine.model.names import EMBEDDED, cached_models, corps_home

    table = Table(title=f"models (CORPS_HOME={corps_home()})")
    table.add_column("name")
    table.add_column("cached")
    table.add_column("description")
    cached = {p.name: p for p in cached_models()}
    for alias, m in EMBEDDED.items():
        default = " (default)" if alias == DEFAULT_MODEL else ""
        table.add_row(alias + default, "yes" if alias in cached else "no", m.description)
    for shape in SHAPES:
        c = dummy_config(shape, 49152)
        about = (
            f"random weights, {c.num_hidden_layers} layers x {c.hidden_size}, "
            f"{c.num_attention_heads}/{c.num_key_value_heads} heads ({c.model_type})"
        )
        table.add_row(PREFIX + shape, "yes" if f"dummy-{shape}" in cached else "no", about)
    for name, path in cached.items():
        if name not in EMBEDDED and not name.startswith("dummy-"):
            table.add_row(name, "yes", str(path))
    Console().print(table)
