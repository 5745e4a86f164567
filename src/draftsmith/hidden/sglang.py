"""Hidden-state capture through an SGLang server, for targets HF cannot hold (the launch
command and its checks: `sglang_launch`).

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

Verified here, without a GPU: the commands `sglang_launch` builds and its
refusals, request building and parsing of payloads shaped as above. In this session
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
from pathlib import Path

import httpx
import numpy as np

from draftsmith.hidden.sglang_launch import (
    AUX_FLAG,
    FINAL_FLAG,
    RADIX_FLAG,
    CaptureError,
    CaptureMode,
    build_capture_command,
)
from draftsmith.runtime.process import ManagedServer
from draftsmith.runtime.sglang import ServerLaunch
from draftsmith.target.layers import AuxLayers
from draftsmith.target.load import read_target_config


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
        server: ServerLaunch,
        aux: AuxLayers,
        *,
        mode: CaptureMode = CaptureMode.AUX,
        log_path: Path | None = None,
    ) -> None:
        self.settings = server
        self.mode = mode
        self.cmd = build_capture_command(model_dir, server, aux, mode=mode)  # fail before launching
        self.hidden_size = int(read_target_config(model_dir)["hidden_size"])
        self.url = server.url
        self._server = ManagedServer(
            self.cmd,
            health_url=f"{self.url}/health",
            log_path=log_path,
            startup_timeout_s=server.startup_timeout_s,
            name=f"sglang {mode} capture",
        )
        self._client: httpx.Client | None = None
        self._requests = 0

    def __enter__(self) -> SGLangCapture:
        self._server.__enter__()
        try:
            # trust_env=False: a proxy from the environment must not see loopback traffic.
            timeout = httpx.Timeout(self.settings.request_timeout_s, connect=10.0)
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
