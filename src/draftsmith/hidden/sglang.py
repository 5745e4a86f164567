"""Hidden-state capture through an SGLang server, for targets HF cannot hold.

Mechanism (read in SGLang's source; file paths are under python/sglang/srt/):

- Aux layers. `--enable-return-aux-hidden-states --speculative-algorithm EAGLE3`
  turns on EAGLE3's aux capture in the target with no draft loaded: the
  algorithm flag only names the capture convention and is reset to None
  (arg_groups/validation_hook.py, handle_aux_hidden_state_capture). Requests
  with `return_hidden_states` then get the three aux layers concatenated,
  (T, 3H), "in place of the last-layer hidden states" (arg_groups/fields/exec_.py).
  `--return-aux-hidden-state-layer-ids` reaches the model's
  `set_eagle3_layers_to_capture`, which adds 1 (models/llama.py), so it takes
  output-of-layer ids (`layers.sglang_layer_ids`). DeepSeek-V2/V3, Kimi-K2.5
  and GLM-4-MoE-Lite add 1 only when the first id is 1 and otherwise read the
  ids as input-of (models/deepseek_v2.py), so custom layers whose first id is
  not 1 are refused for them. Only EAGLE3 captures aux states: with EAGLE
  (is_eagle(), not is_eagle3()) a draft silently gets the single last-layer
  state (H).
- Final states. The post-norm last-layer states are kept in aux mode too, but
  only for in-process consumers, "not copied into the response path"
  (layers/logits_processor.py, LogitsProcessorOutput.last_hidden_states). Over
  HTTP they come from a second pass: the plain target with
  `--enable-return-hidden-states`, whose hidden state is what the model hands
  the logits processor, after the final norm for Llama and DeepSeek-V2/V3.
  Hence two `CaptureMode`s and two server runs per shard; SpecForge avoids the
  second pass by running SGLang's ModelRunner in-process and patching the
  logits processor (specforge/modeling/target/sglang_backend/), which needs
  SGLang internals and torchrun.
- Payload. POST /generate with `input_ids` and `return_hidden_states: true`;
  `meta_info.hidden_states` is a list whose first entry holds the prompt
  rows, (T, D) nested lists (managers/scheduler_components/
  batch_result_processor.py, _append_prefill_hidden_states; managers/
  tokenizer_manager.py sets meta_info["hidden_states"]). Later entries are
  decode rows; one new token is asked for, so there are none to use.
- Only the prefilled part of a prompt gets rows: a radix-cache hit or a
  chunked prefill leaves fewer than T (older versions took rows from the next
  request instead). So the radix cache and chunked prefill are always off, and
  the row count, `prompt_tokens`, `cached_tokens` and the request id echo are
  checked on every answer.

Verified here, without a GPU: the commands this module builds, the refusals,
request building and parsing of payloads shaped as above. In this session
(not in the test suite, which lacks SGLang) both commands were also resolved
by SGLang 0.5.23's own ServerArgs.resolve_once() with --device cpu: the aux
command resolves to speculative_algorithm None, aux_hidden_state_capture
"eagle3", return_hidden_states_mode "full". NOT verified: a real server run,
i.e. that the returned rows equal HF's hidden_states[i+1] for the aux ids and
the final-norm output for the final pass (check on a GPU against HF with the
demo model before trusting a large run), the cost of JSON transport (~12
bytes of text per value: ~250 KiB per token at H=7168 for the aux pass), and
any SGLang version other than 0.5.23.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

import httpx
import numpy as np

from draftsmith.errors import DraftsmithError
from draftsmith.runtime.process import ManagedServer
from draftsmith.runtime.sglang import (
    SGLangConfigError,
    canonical,
    launch_command,
    parse_flags,
    refused_reason,
    server_url,
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


def build_capture_command(
    model_dir: str | Path, sglang_cfg: dict, aux: AuxLayers, *, mode: CaptureMode = CaptureMode.AUX
) -> list[str]:
    """The `sglang.launch_server` command for one capture pass of the target at `model_dir`
    (`sglang_cfg`: the validated extract.sglang, defaults filled in by the schema)."""
    try:
        cmd = launch_command(
            str(model_dir), sglang_cfg, SECTION, flags=_capture_flags(aux, mode), owned=_CAPTURE_OWNED
        )
    except SGLangConfigError as exc:
        raise CaptureError(str(exc)) from None
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


def build_generate_request(batch: Sequence[Sequence[int]], rids: Sequence[str]) -> dict:
    """A /generate request that prefills `batch` and returns every prompt row's hidden state."""
    if not batch or len(rids) != len(batch):
        raise CaptureError("a capture request needs one request id per sample, and at least one sample")
    if any(len(ids) == 0 for ids in batch):
        raise CaptureError("a capture sample has no tokens")
    return {
        "input_ids": [[int(t) for t in ids] for ids in batch],
        "rid": list(rids),
        # One new token: the prefill is the capture; greedy keeps the run deterministic.
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
    }


def parse_capture_response(
    output: dict,
    input_ids: Sequence[int],
    *,
    hidden_size: int,
    mode: CaptureMode,
    rid: str | None = None,
) -> np.ndarray:
    """One sample's answer as a float32 array: (T, 3H) for the aux pass, (T, H) for the final pass."""
    meta = output.get("meta_info") if isinstance(output, dict) else None
    if not isinstance(meta, dict):
        raise CaptureError(f"capture answer has no meta_info: {_excerpt(output)}")
    where = f"capture answer {meta.get('id', rid)!r}"
    _check_meta(meta, input_ids, rid, where)
    rows = _prompt_rows(meta, where)
    return _as_array(rows, len(input_ids), hidden_size, mode, where)


def _check_meta(meta: dict, input_ids: Sequence[int], rid: str | None, where: str) -> None:
    tokens = len(input_ids)
    if rid is not None and meta.get("id") != rid:
        raise CaptureError(f"{where}: expected the answer to request {rid!r} (answers out of order?)")
    if meta.get("prompt_tokens", tokens) != tokens:
        raise CaptureError(f"{where}: the server saw {meta['prompt_tokens']} prompt tokens, we sent {tokens}")
    if meta.get("cached_tokens", 0):
        raise CaptureError(
            f"{where}: {meta['cached_tokens']} tokens came from the prefix cache and have no "
            f"hidden states (launch with {RADIX_FLAG})"
        )
    # Only there when logprobs were asked for: (logprob, token id, text) per prompt
    # position from logprob_start_len on, so it echoes the tail of what was sent.
    echo = meta.get("input_token_logprobs")
    if echo:
        echoed = [int(entry[1]) for entry in echo]
        if echoed != [int(t) for t in input_ids[len(input_ids) - len(echoed) :]]:
            raise CaptureError(f"{where}: the server echoes other token ids than we sent")


def _prompt_rows(meta: dict, where: str) -> list:
    states = meta.get("hidden_states")
    if not isinstance(states, list) or not states:
        raise CaptureError(
            f"{where}: no hidden_states in meta_info (server started without {AUX_FLAG} or {FINAL_FLAG}?)"
        )
    rows = states[0]
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], list):
        raise CaptureError(f"{where}: the first hidden_states entry is not a list of per-token rows")
    return rows


def _as_array(rows: list, tokens: int, hidden_size: int, mode: CaptureMode, where: str) -> np.ndarray:
    try:
        array = np.asarray(rows, dtype=np.float32)
    except (ValueError, TypeError):
        raise CaptureError(f"{where}: hidden-state rows of unequal length or non-numbers") from None
    if array.ndim != 2:
        raise CaptureError(f"{where}: hidden states have shape {array.shape}, expected (tokens, width)")
    if array.shape[0] != tokens:
        raise CaptureError(
            f"{where}: {array.shape[0]} hidden-state rows for {tokens} tokens (a prefix-cache hit "
            "or chunked prefill leaves rows out)"
        )
    _check_width(array.shape[1], hidden_size, mode, where)
    if not np.isfinite(array).all():
        raise CaptureError(f"{where}: hidden states contain NaN or inf")
    return array


def _check_width(width: int, hidden_size: int, mode: CaptureMode, where: str) -> None:
    expected = 3 * hidden_size if mode is CaptureMode.AUX else hidden_size
    if width == expected:
        return
    if mode is CaptureMode.AUX and width == hidden_size:
        raise CaptureError(
            f"{where}: rows are {width} wide, one layer (H), not three aux layers (3H = "
            f"{expected}): the server does not capture EAGLE3 aux states"
        )
    if mode is CaptureMode.FINAL and width == 3 * hidden_size:
        raise CaptureError(f"{where}: rows are 3H = {width} wide: aux states came back in the final pass")
    raise CaptureError(f"{where}: rows are {width} wide, expected {expected} ({mode} pass, H={hidden_size})")


def _excerpt(value: object, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def pair_passes(
    aux: Sequence[np.ndarray], final: Sequence[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Join the two passes' arrays sample by sample, refusing any that do not line up."""
    if len(aux) != len(final):
        raise CaptureError(f"aux pass has {len(aux)} samples, final pass {len(final)}")
    for i, (a, f) in enumerate(zip(aux, final, strict=True)):
        if a.shape[0] != f.shape[0] or a.shape[1] != 3 * f.shape[1]:
            raise CaptureError(f"sample {i}: aux {a.shape} and final {f.shape} do not line up")
    return list(zip(aux, final, strict=True))


class SGLangCapture:
    """One capture pass: a server started and always torn down with the `with` block.

    `capture(batch)` returns one array per sample: (T, 3H) aux states for
    CaptureMode.AUX, (T, H) final states for CaptureMode.FINAL. GPUs come from
    the environment (lease them with `draftsmith.runtime.gpus.acquire_gpus` first).
    """

    def __init__(
        self,
        model_dir: str | Path,
        sglang_cfg: dict,
        aux: AuxLayers,
        *,
        mode: CaptureMode = CaptureMode.AUX,
        log_path: Path | None = None,
    ) -> None:
        self.cfg = sglang_cfg
        self.mode = mode
        self.cmd = build_capture_command(model_dir, self.cfg, aux, mode=mode)  # fail before launching
        self.hidden_size = int(read_target_config(model_dir)["hidden_size"])
        self.url = server_url(self.cfg)
        self._server = ManagedServer(
            self.cmd,
            health_url=f"{self.url}/health",
            log_path=log_path,
            startup_timeout_s=self.cfg["startup_timeout_s"],
            name=f"sglang {mode} capture",
        )
        self._client: httpx.Client | None = None
        self._requests = 0

    def __enter__(self) -> SGLangCapture:
        self._server.__enter__()
        try:
            # trust_env=False: a proxy from the environment must not see loopback traffic.
            timeout = httpx.Timeout(self.cfg["request_timeout_s"], connect=10.0)
            self._client = httpx.Client(timeout=timeout, trust_env=False)
        except BaseException:
            self._server.stop()
            raise
        return self

    def __exit__(self, *_exc) -> None:
        try:
            if self._client is not None:
                self._client.close()
        finally:
            self._client = None
            self._server.stop()

    def capture(self, batch: Sequence[Sequence[int]]) -> list[np.ndarray]:
        if self._client is None:
            raise CaptureError("SGLangCapture.capture runs inside its `with` block only")
        self._requests += 1
        rids = [f"capture-{self._requests}-{i}" for i in range(len(batch))]
        response = self._client.post(f"{self.url}/generate", json=build_generate_request(batch, rids))
        outputs = _outputs(response, len(batch))
        return [
            parse_capture_response(out, ids, hidden_size=self.hidden_size, mode=self.mode, rid=rid)
            for out, ids, rid in zip(outputs, batch, rids, strict=True)
        ]


def _outputs(response: httpx.Response, expected: int) -> list[dict]:
    if response.status_code != 200:
        raise CaptureError(f"/generate answered {response.status_code}: {response.text[:500]}")
    body = response.json()
    if not isinstance(body, list) or len(body) != expected:
        got = len(body) if isinstance(body, list) else type(body).__name__
        raise CaptureError(f"/generate answered {got} outputs for a batch of {expected}")
    return body
