"""Loading the converted target: tokenizer, model, and the facts the model stage recorded."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.errors import ModelError

if TYPE_CHECKING:  # torch loads only where a model does: reading model.json must stay cheap
    import torch

log = logging.getLogger(__name__)


def load_tokenizer(hf_dir: str | Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """A conversation's ids as a server conditions on them: the chat template's rendering
    (with the tool schemas, when any) and the generation prompt."""
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def longest_token_chars(tokenizer) -> int:
    """The most characters one token stands for (the longest vocabulary entry, added tokens
    included): a text of n characters has at least n / this many tokens. Byte-level entries
    spell each byte as one character, so they bound the decoded text from above."""
    return max(map(len, tokenizer.get_vocab()), default=1)


def load_model(hf_dir: str | Path, dtype: str, device: str = "cpu", trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    from draftsmith.target.dtypes import torch_dtype

    model = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code
    )
    return model.to(device).eval()


def model_info(info_file: str | Path) -> dict:
    """The model stage's record (`model.json`): shapes, special tokens, the HF directory.

    A converted target's directory is recorded relative to `model.json` (the store may be
    reached from any checkout or mount point) and returned as a full path."""
    info = json.loads(Path(info_file).read_text())
    hf_dir = Path(info_file).parent / info["hf_dir"]  # an absolute hf_dir stays as it is
    if not hf_dir.is_dir():
        raise ModelError(
            f"{info_file}: hf_dir {info['hf_dir']} is not a directory; delete {Path(info_file).parent} "
            "to rebuild the model stage"
        )
    return {**info, "hf_dir": str(hf_dir)}


def _weight_map(hf_dir: Path) -> dict[str, Path]:
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        names = json.loads(index.read_text())["weight_map"]
        return {name: hf_dir / file for name, file in names.items()}
    from safetensors import safe_open

    found: dict[str, Path] = {}
    for path in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            found.update(dict.fromkeys(f.keys(), path))
    return found


def _pick(names: dict[str, Path], name: str) -> str | None:
    """`name`, or the shortest key ending in `.name` (a wrapped model, e.g.
    `language_model.model.embed_tokens.weight`), never a decoder layer's own copy."""
    if name in names:
        return name
    candidates = sorted((n for n in names if n.endswith("." + name) and ".layers." not in n), key=len)
    return candidates[0] if candidates else None


def load_target(
    hf_dir: str | Path, trust_remote_code: bool = False
) -> tuple[object, dict[str, torch.Tensor]]:
    """The target's text config and its embedding, lm_head and final-norm weights (as stored).

    Only these tensors are read. The head is the embedding when `tie_word_embeddings`
    (or when no `lm_head.weight` exists); a missing final norm leaves the draft's at ones.
    """
    from safetensors import safe_open
    from transformers import AutoConfig

    hf_dir = Path(hf_dir)
    text_config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust_remote_code).get_text_config()
    names = _weight_map(hf_dir)
    embed = _pick(names, "model.embed_tokens.weight")
    if embed is None:
        raise ModelError(f"{hf_dir}: no embed_tokens weight in the safetensors files")
    tied = getattr(text_config, "tie_word_embeddings", False)
    head = None if tied else _pick(names, "lm_head.weight")
    wanted = {"embed": embed, "head": head or embed, "norm": _pick(names, "model.norm.weight")}
    loaded: dict[str, torch.Tensor] = {}
    for name in set(wanted.values()) - {None}:
        with safe_open(names[name], "pt") as f:
            loaded[name] = f.get_tensor(name)
    out = {kind: loaded[name] for kind, name in wanted.items() if name is not None}
    vocab, hidden = text_config.vocab_size, text_config.hidden_size
    for kind in ("embed", "head"):
        if out[kind].shape[1] != hidden or out[kind].shape[0] < vocab:
            raise ModelError(f"{hf_dir}: {wanted[kind]} has shape {tuple(out[kind].shape)}")
        out[kind] = out[kind][:vocab]  # some checkpoints pad the vocabulary
    log.info(
        "target weights: embed %s, head %s (tied: %s), norm %s", embed, wanted["head"], tied, wanted["norm"]
    )
    return text_config, out


def hf_config(model_dir: str | Path) -> dict:
    """The target's config.json as stored."""
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read the target's config: {exc}") from None


def read_target_config(model_dir: str | Path) -> dict:
    """The target's config.json, with the text model's settings on top for multimodal wrappers."""
    config = hf_config(model_dir)
    # Kimi-K2.5 keeps its DeepSeek-V3 text model's sizes under text_config.
    return {**config, **(config.get("text_config") or {}), "architectures": config.get("architectures") or []}
