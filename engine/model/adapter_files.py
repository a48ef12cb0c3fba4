"""LoRA adapters in PEFT's own format: made for training, checked, merged at load.

An adapter directory holds `adapter_config.json` and `adapter_model.safetensors`
with the Hugging Face model's module names, exactly as `peft` saves them, so
`peft.PeftModel.from_pretrained(hf_model, DIR)` loads a corps-trained adapter and
corps serves an adapter trained elsewhere with peft. `Engine.open(adapter=DIR)`
merges it into the weights when they load (in float32, before the engine's
precision path casts them), so serving with an adapter costs nothing per token.

An adapter trained with `scope="rewired"` (`corps distill --scope rewired`) says so
in a file of ours beside peft's (`corps_adapter.json`, which peft ignores): it is
meant only for calls whose context choreography rewired (`corps.cache.rewired`).
The engine then keeps it apart from the weights and adds its low-rank product to
those calls' rows only (`corps.engine.model.adapter_rows`); every other call runs the base
model exactly. peft itself knows nothing of scopes: `PeftModel.from_pretrained`
applies such an adapter to everything.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from corps.engine.adapter_dir import ADAPTER_FILES as FILES
from corps.engine.adapter_dir import adapter_problem as problem
from corps.engine.errors import BadAdapter

#: Our own file in an adapter directory: {"scope": "all" | "rewired"}.
SCOPE_FILE = "corps_adapter.json"
#: Which calls an adapter applies to: every call, or those whose context is rewired.
SCOPES = ("all", "rewired")
#: The projections distillation adapts by default: attention and MLP (the paper).
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def read_adapter_config(path: str | Path) -> dict:
    """The adapter's `adapter_config.json`; BadAdapter if `problem(path)`."""
    why = problem(path)
    if why is not None:
        raise BadAdapter(f"adapter {str(path)!r}: {why}")
    return json.loads((Path(path).expanduser() / FILES[0]).read_text())


def read_scope(path: str | Path) -> str:
    """The adapter's scope: "all" unless its directory says otherwise (`SCOPE_FILE`);
    BadAdapter if that file is unreadable or names no scope we know."""
    file = Path(path).expanduser() / SCOPE_FILE
    if not file.is_file():
        return "all"
    try:
        scope = json.loads(file.read_text()).get("scope", "all")
    except (OSError, ValueError, AttributeError) as exc:
        raise BadAdapter(f"adapter {str(path)!r}: unreadable {SCOPE_FILE} ({exc})") from None
    if scope not in SCOPES:
        raise BadAdapter(
            f"adapter {str(path)!r}: {SCOPE_FILE} names scope {scope!r}; "
            f"corps knows {', '.join(SCOPES)}"
        )
    return scope


def write_scope(path: str | Path, scope: str) -> None:
    """Record the adapter's scope in its directory (only when it is not "all")."""
    file = Path(path) / SCOPE_FILE
    if scope == "all":
        file.unlink(missing_ok=True)
    else:
        file.write_text(json.dumps({"scope": scope}) + "\n")


def check_fits(hf, path: str | Path) -> None:
    """BadAdapter unless every tensor of the adapter at `path` names a module of `hf`
    (a loaded transformers model) with matching shapes and the config's rank."""
    from safetensors import safe_open

    config = read_adapter_config(path)
    rank = config.get("r")
    kept_apart = read_scope(path) == "rewired"
    if kept_apart and config.get("use_dora"):
        raise BadAdapter(
            f"adapter {str(path)!r}: a DoRA adapter cannot be kept apart from the weights "
            f"(scope 'rewired' in {SCOPE_FILE}); corps serves it with scope 'all' only"
        )
    modules = dict(hf.named_modules())
    with safe_open(str(Path(path).expanduser() / FILES[1]), framework="pt") as f:
        names = list(f.keys())
        if not names:
            raise BadAdapter(f"adapter {str(path)!r} holds no tensors")
        for name in names:
            module, kind = _module_of(name)
            target = modules.get(module)
            if target is None or not hasattr(target, "weight"):
                raise BadAdapter(
                    f"adapter {str(path)!r} adapts {module!r}, which this model does not have: "
                    f"it was trained for another architecture"
                )
            if kept_apart and module.rsplit(".", 1)[-1] not in TARGETS:
                raise BadAdapter(
                    f"adapter {str(path)!r} adapts {module!r}; an adapter of scope "
                    f"'rewired' may adapt only {', '.join(TARGETS)}"
                )
            shape = tuple(f.get_slice(name).get_shape())
            out_f, in_f = target.weight.shape
            want = (rank, in_f) if kind == "lora_A" else (out_f, rank)
            if shape != want:
                raise BadAdapter(
                    f"adapter {str(path)!r}: {name} is {list(shape)}, this model needs "
                    f"{list(want)} (rank {rank} in adapter_config.json; another model size?)"
                )


def check_for_model(model_path: str | Path, path: str | Path) -> None:
    """`check_fits` against the model at `model_path` without loading its weights (its
    skeleton on the meta device): a bad adapter fails before anything loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_path))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    check_fits(skeleton, path)


def check_adapter_of(config, console=None) -> None:
    """An EngineConfig's adapter against its model (resolved, fetched if need be, but
    no weights loaded): the CLI calls it before opening engines."""
    from corps.engine.model.names import resolve_model

    if config.adapter is not None:
        check_for_model(resolve_model(config.model, console=console), config.adapter)


def merge(hf, path: str | Path):
    """`hf` (a float32 transformers model) with the adapter at `path` merged into its
    weights; BadAdapter if it does not fit the model."""
    from peft import PeftModel

    check_fits(hf, path)
    with warnings.catch_warnings():  # peft asks transformers a deprecated question
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
        adapted = PeftModel.from_pretrained(hf, str(Path(path).expanduser()))
    return adapted.merge_and_unload()


def apart(hf, path: str | Path):
    """`hf` (a float32 transformers model) as it was, and the adapter at `path`'s
    factors by module name (`corps.engine.model.adapter_rows.factors_of`), not merged."""
    from peft import PeftModel

    from corps.engine.model.adapter_rows import factors_of

    check_fits(hf, path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
        adapted = PeftModel.from_pretrained(hf, str(Path(path).expanduser()))
    factors = factors_of(adapted)
    return adapted.unload(), factors


def trainable(hf, *, rank: int = 64, alpha: int = 32, dropout: float = 0.05, targets=TARGETS):
    """`hf` wrapped for training a fresh LoRA adapter (peft): only the adapter trains.
    B starts at zero, so the wrapped model computes exactly what `hf` does."""
    from peft import LoraConfig, get_peft_model

    present = {n.rsplit(".", 1)[-1] for n, _ in hf.named_modules()}
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=[t for t in targets if t in present],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(hf, config)


def _module_of(tensor_name: str) -> tuple[str, str]:
    """'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' ->
    ('model.layers.0.self_attn.q_proj', 'lora_A')."""
    parts = tensor_name.split(".")
    for kind in ("lora_A", "lora_B"):
        if kind in parts:
            i = parts.index(kind)
            module = ".".join(parts[:i]).removeprefix("base_model.model.")
            return module, kind
    raise BadAdapter(f"adapter tensor {tensor_name!r} is not a LoRA weight (lora_A / lora_B)")
