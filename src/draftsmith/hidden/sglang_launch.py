"""The SGLang launch commands of hidden-state capture and their checks: a launch (or an
EAGLE3 draft config) that would capture other states than asked is refused. Why each flag
is set or refused: `draftsmith.hidden.sglang`'s docstring.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.runtime.sglang import (
    ServerLaunch,
    canonical,
    parse_flags,
    refused_reason,
)
from draftsmith.target.layers import AuxLayers, sglang_layer_ids
from draftsmith.target.load import read_target_config

SECTION = "extract.sglang"

AUX_FLAG = "--enable-return-aux-hidden-states"
FINAL_FLAG = "--enable-return-hidden-states"
MODE_FLAG = "--return-hidden-states-mode"
ALGO_FLAG = "--speculative-algorithm"
IDS_FLAG = "--return-aux-hidden-state-layer-ids"
DRAFT_FLAG = "--speculative-draft-model-path"
RADIX_FLAG = "--disable-radix-cache"
CHUNK_FLAG = "--chunked-prefill-size"
_KNOWN = (
    AUX_FLAG,
    FINAL_FLAG,
    MODE_FLAG,
    ALGO_FLAG,
    IDS_FLAG,
    DRAFT_FLAG,
    RADIX_FLAG,
    CHUNK_FLAG,
)

# Capture flags the builder sets itself, mapped to what to configure instead.
_CAPTURE_OWNED = {
    AUX_FLAG: "nothing (the capture mode sets it)",
    FINAL_FLAG: "nothing (the capture mode sets it)",
    MODE_FLAG: "nothing (the capture mode sets it)",
    IDS_FLAG: "extract.aux_layers",
    RADIX_FLAG: "nothing (always set)",
    CHUNK_FLAG: "nothing (always -1)",
}

# SGLang classes whose set_eagle3_layers_to_capture adds 1 only when the first
# id is 1 (sglang 0.5.23, models/deepseek_v2.py and models/glm4_moe_lite.py).
_FIRST_ID_HEURISTIC = {
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM",
    "MistralLarge3ForCausalLM",
    "KimiK25ForConditionalGeneration",
    "Glm4MoeLiteForCausalLM",
}


class CaptureMode(StrEnum):
    AUX = "aux"  # the three aux layers, concatenated: (T, 3H)
    FINAL = "final"  # the last layer after the final norm: (T, H)


class CaptureError(DraftsmithError, ValueError):
    """A capture launch that would record the wrong states, or an answer that does not fit."""


def capture_server(section: dict) -> ServerLaunch:
    """`extract.sglang` (`HiddenSettings.sglang`), its extra args refused where they would
    change the capture."""
    return ServerLaunch.of(section, SECTION, _CAPTURE_OWNED)


def build_capture_command(
    model_dir: str | Path, server: ServerLaunch, aux: AuxLayers, *, mode: CaptureMode = CaptureMode.AUX
) -> list[str]:
    """The `sglang.launch_server` command for one capture pass of the target at `model_dir`
    (its extra args were refused, where they had to be, by `capture_server`)."""
    cmd = server.command(model_dir, _capture_flags(aux, mode))
    target = read_target_config(model_dir)
    _check_target(target, aux, Path(model_dir))
    validate_capture_command(cmd, aux, target_config=target)  # the builder obeys its own rules
    return cmd


def _capture_flags(aux: AuxLayers, mode: CaptureMode) -> list[str]:
    common = [RADIX_FLAG, CHUNK_FLAG, "-1"]
    if mode is CaptureMode.FINAL:
        return [FINAL_FLAG, *common]
    ids = [str(i) for i in sglang_layer_ids(aux)]
    return [AUX_FLAG, ALGO_FLAG, "EAGLE3", IDS_FLAG, *ids, *common]


def _check_target(target: dict, aux: AuxLayers, model_dir: Path) -> None:
    layers = target.get("num_hidden_layers")
    if layers != aux.num_layers:
        raise CaptureError(
            f"{model_dir}: the target has num_hidden_layers={layers}, but the aux layers "
            f"were chosen for {aux.num_layers}"
        )
    if not isinstance(target.get("hidden_size"), int):
        raise CaptureError(f"{model_dir}: config.json gives no integer hidden_size")


def validate_capture_command(
    cmd: list[str], aux: AuxLayers | None = None, *, target_config: dict | None = None
) -> CaptureMode:
    """Refuse a launch that would capture other states than asked; return the pass it runs."""
    flags = _flags(cmd)
    _refuse_anywhere(flags)
    mode = _mode_of(flags)
    if mode is CaptureMode.AUX:
        _check_aux_launch(flags, aux, target_config)
    else:
        _check_final_launch(flags)
    return mode


def _flags(cmd: list[str]) -> dict[str, list[list[str]]]:
    """Flag -> the value lists of each time it is given, flags spelled out as SGLang would."""
    args = list(cmd)
    if "sglang.launch_server" in args:
        args = args[args.index("sglang.launch_server") + 1 :]
    flags: dict[str, list[list[str]]] = {}
    for name, values in parse_flags(args):
        # `--disable-radix` is --disable-radix-cache: the checks below look up full names.
        flags.setdefault(canonical(name, _KNOWN), []).append(values)
    return flags


def _refuse_anywhere(flags: dict[str, list[list[str]]]) -> None:
    for flag in flags:
        reason = refused_reason(flag)
        if reason:
            raise CaptureError(f"capture command: {flag} is refused: it {reason}")
    if DRAFT_FLAG in flags:
        raise CaptureError(
            f"capture command: {DRAFT_FLAG} is refused: capture runs the target alone "
            f"({AUX_FLAG}); with a draft, its config would choose the layers"
        )
    for flag, uses in flags.items():
        if flag in _KNOWN and len(uses) > 1:
            raise CaptureError(f"capture command: {flag} is given {len(uses)} times")
    if RADIX_FLAG not in flags:
        raise CaptureError(
            f"capture command: {RADIX_FLAG} is required: a prefix-cache hit returns hidden "
            "states for the uncached tokens only"
        )
    if _value(flags, CHUNK_FLAG) != ["-1"]:
        raise CaptureError(
            f"capture command: {CHUNK_FLAG} -1 is required: a chunked prompt returns hidden "
            "states for its last chunk only"
        )
    if _value(flags, MODE_FLAG) not in (None, ["full"]):
        raise CaptureError(f"capture command: {MODE_FLAG} must be full (last returns one row per request)")


def _value(flags: dict[str, list[list[str]]], flag: str) -> list[str] | None:
    return flags[flag][-1] if flag in flags else None


def _mode_of(flags: dict[str, list[list[str]]]) -> CaptureMode:
    if AUX_FLAG in flags:
        return CaptureMode.AUX
    if FINAL_FLAG in flags or _value(flags, MODE_FLAG) == ["full"]:
        return CaptureMode.FINAL
    raise CaptureError(f"capture command returns no hidden states: it needs {AUX_FLAG} or {FINAL_FLAG}")


def _check_aux_launch(flags: dict, aux: AuxLayers | None, target_config: dict | None) -> None:
    algo = _value(flags, ALGO_FLAG)
    if algo is None or len(algo) != 1 or algo[0].upper() != "EAGLE3":
        got = " ".join(algo) if algo else "nothing"
        raise CaptureError(
            f"capture command: {ALGO_FLAG} must be EAGLE3, got {got}: only EAGLE3 captures the "
            "three aux layers (is_eagle3()); EAGLE gives the draft the single last-layer "
            "state (H instead of 3H) without a word"
        )
    others = sorted(f for f in flags if f.startswith("--speculative") and f != ALGO_FLAG)
    if others:
        raise CaptureError(f"capture command: {', '.join(others)}: aux capture runs no speculative decoding")
    ids = _layer_ids(flags)
    if aux is not None:
        _check_ids_match(ids, aux)
    if target_config is not None:
        _check_sglang_reads_ids(ids, aux, target_config)


def _layer_ids(flags: dict) -> list[int] | None:
    raw = _value(flags, IDS_FLAG)
    if raw is None:
        return None
    values = [v for part in raw for v in part.replace(",", " ").split()]
    try:
        return [int(v) for v in values]
    except ValueError:
        raise CaptureError(f"capture command: {IDS_FLAG} {' '.join(raw)}: not integers") from None


def _check_ids_match(ids: list[int] | None, aux: AuxLayers) -> None:
    expected = sglang_layer_ids(aux)
    if ids is None:
        if aux.is_default:
            return  # SGLang's default [2, N//2, N-3] input-of is exactly EAGLE-3's default
        raise CaptureError(
            f"capture command: no {IDS_FLAG}, so SGLang captures its default layers, not the "
            f"requested output_of_layer {expected}"
        )
    _check_same_ids(ids, aux, f"capture command: {IDS_FLAG}")


def _check_same_ids(ids: list[int], aux: AuxLayers, where: str) -> None:
    expected = sglang_layer_ids(aux)
    if ids == list(aux.input_of) and ids != expected:
        raise CaptureError(
            f"{where} {ids} are input-of ids; SGLang adds 1 itself and would capture the outputs "
            f"of layers {ids}, one layer deeper than asked. Use output-of ids {expected}"
        )
    if ids != expected:
        raise CaptureError(
            f"{where} {ids} disagree with the requested aux layers (output_of_layer {expected})"
        )


def _check_sglang_reads_ids(ids: list[int] | None, aux: AuxLayers | None, target_config: dict) -> None:
    archs = set(target_config.get("architectures") or []) & _FIRST_ID_HEURISTIC
    first = ids[0] if ids is not None else (aux.output_of[0] if aux is not None else 1)
    if archs and first != 1:
        raise CaptureError(
            f"capture command: {sorted(archs)[0]} in SGLang adds 1 to the aux layer ids only when "
            f"the first one is 1, so {ids} would be read as input-of ids and capture one layer "
            "too shallow; choose aux layers whose first output_of_layer id is 1"
        )


def _check_final_launch(flags: dict) -> None:
    algo = _value(flags, ALGO_FLAG)
    if algo is not None and algo[:1] and algo[0].upper() == "EAGLE":
        raise CaptureError(
            f"capture command: {ALGO_FLAG} EAGLE captures only the single last-layer state (H), "
            "not EAGLE3's three aux layers (is_eagle() vs is_eagle3()); the final pass runs "
            "the plain target"
        )
    spec = sorted(f for f in flags if f.startswith("--speculative"))
    if spec or IDS_FLAG in flags:
        raise CaptureError(
            f"capture command: {', '.join(spec or [IDS_FLAG])}: the final-state pass runs the "
            "plain target (aux layers replace the final state in the answer)"
        )


def check_draft_config(draft_config: dict, aux: AuxLayers) -> None:
    """Refuse an EAGLE3 draft whose `eagle_config` would make SGLang feed it other layers."""
    eagle = draft_config.get("eagle_config") or {}
    if eagle.get("use_aux_hidden_state", True) is False:
        raise CaptureError(
            "draft config: eagle_config.use_aux_hidden_state is false: the draft gets H, not 3H"
        )
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        if aux.is_default:
            return  # SGLang then captures its default layers, which are these
        raise CaptureError(
            "draft config: no eagle_config.eagle_aux_hidden_state_layer_ids, so SGLang captures "
            f"its default layers, not output_of_layer {sglang_layer_ids(aux)}"
        )
    _check_same_ids([int(i) for i in ids], aux, "draft config: eagle_aux_hidden_state_layer_ids")
