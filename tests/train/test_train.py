"""Draft training on real demo-model hidden states: exact resume, data parallel, the vocabulary."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from draftsmith import config as cfg
from draftsmith.draft.vocab import build, count_supervised
from draftsmith.formats.merged import held_out_ids, id_fraction
from draftsmith.formats.shards.writer import ShardWriter
from draftsmith.runtime import slurm
from draftsmith.store.hashing import sample_address
from draftsmith.store.layout import shard_name
from draftsmith.target import load as target
from draftsmith.target.layers import AuxLayers
from draftsmith.train import data as train_data
from draftsmith.train import loop as train
from draftsmith.train.data import TrainData, pack, sort_windows
from draftsmith.train.launch import launch, write_rank_job
from draftsmith.train.process_group import process_group_backend
from draftsmith.train.settings import LoopSettings, TrainSettings, TrainSpec
from draftsmith.train.state import TrainError
from draftsmith.vocab.stage import vocab
from draftsmith.workflow import configure

TEXTS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Name a primary colour.", "Red is a primary colour."),
    ("What is 2 + 2?", "2 + 2 equals 4."),
    ("Say hello in Spanish.", "Hola! That is hello in Spanish."),
    ("Which planet is largest?", "Jupiter is the largest planet in the solar system."),
    ("Write a Python comment.", "# This is a comment in Python."),
    ("What does ls do?", "The ls command lists the files in a directory."),
    ("Count to five.", "One, two, three, four, five."),
    ("Name a fruit.", "An apple is a fruit."),
    ("What is water made of?", "Water is made of hydrogen and oxygen."),
    ("Who wrote Hamlet?", "William Shakespeare wrote Hamlet."),
    ("What colour is the sky?", "On a clear day the sky is blue."),
    ("Give me a word for happy.", "Joyful is another word for happy."),
    ("How many legs does a cat have?", "A cat has four legs."),
    ("What is the opposite of cold?", "The opposite of cold is hot."),
    ("Spell the word cat.", "C, A, T spells cat."),
]
NUM_SHARDS = 2


@pytest.fixture(scope="module")
def hidden(tmp_path_factory, demo_model_dir) -> tuple[Path, Path, list[dict]]:
    """A states store of two shards of real demo-model states (3 aux layers + final) for
    the texts above, and a mix's view of it (`assignment.json`). The shards also hold a
    sample of another mix (the last text), which this mix does not train on."""
    model = target.load_model(demo_model_dir, "float32")
    tokenizer = target.load_tokenizer(demo_model_dir)
    aux = AuxLayers.default(model.config.num_hidden_layers)
    out = tmp_path_factory.mktemp("hidden")
    samples = []
    for i, (prompt, reply) in enumerate(TEXTS):
        prompt_ids = tokenizer(prompt + "\n")["input_ids"]
        reply_ids = tokenizer(reply)["input_ids"] + [2]
        samples.append(
            {
                "id": f"demo-{i:06d}",
                "input_ids": prompt_ids + reply_ids,
                "loss_mask": [0] * len(prompt_ids) + [1] * len(reply_ids),
            }
        )
    for sample in samples:
        sample["address"] = sample_address(sample["input_ids"], sample["loss_mask"])
    view = []
    for s in range(NUM_SHARDS):
        rows = samples[s::NUM_SHARDS]
        name = shard_name([r["address"] for r in rows])
        with ShardWriter(out, name, mode="raw", hidden_size=576, dtype="float32", meta={}) as writer:
            for sample in rows:
                with torch.no_grad():
                    states = model(
                        torch.tensor([sample["input_ids"]]), output_hidden_states=True
                    ).hidden_states
                aux_states = torch.cat([states[k][0] for k in aux.hf_hidden_states], dim=-1)
                writer.add(
                    sample["address"], sample["input_ids"], sample["loss_mask"], aux_states, states[-1][0]
                )
                view.append([sample["id"], sample["address"], name])
    mix = samples[:-1]  # the last sample is another mix's
    order = {r["id"]: k for k, r in enumerate(mix)}
    view = sorted((row for row in view if row[0] in order), key=lambda row: order[row[0]])
    assignment = out / "assignment.json"
    assignment.write_text(json.dumps({"samples": view, "shards": sorted({row[2] for row in view})}))
    return out, assignment, mix


def train_settings(**overrides) -> LoopSettings:
    """The loop's settings as the workflow resolves them from a small config."""
    config = cfg.validate(
        {
            "experiment": "t",
            "model": {"source": {"kind": "hf_dir", "path": "unused"}},
            "datasets": {"a": {"path": "a.jsonl", "format": "prompt"}},
            "tokenize": {"max_length": 64},
            "evaluate": {"enabled": False},
            "train": {
                "draft_vocab_size": 512,
                "ttt_steps": 3,
                "lr": 1.0e-3,
                "warmup_steps": 2,
                "total_steps": 6,
                "checkpoint_every": 3,
                "batch_tokens": 96,
                "grad_accum": 2,
                "val_fraction": 0.15,
                **overrides,
            },
        }
    )
    return TrainSettings.of(config).loop


def with_processes(spec: TrainSpec, gpus: int) -> TrainSpec:
    return replace(spec, train=replace(spec.train, gpus=gpus))


@pytest.fixture
def spec(hidden, demo_model_dir, tmp_path) -> TrainSpec:
    directory, assignment, samples = hidden
    settings = train_settings()
    held = held_out_ids([s["id"] for s in samples], settings.val_fraction)
    counts = count_supervised(s for s in samples if s["id"] not in held)
    vocab_path = tmp_path / "vocab.safetensors"
    from safetensors.torch import save_file

    save_file(build(counts, settings.draft_vocab_size, 49152), str(vocab_path))
    return TrainSpec(
        key="0123456789abcdef",
        hf_dir=str(demo_model_dir),
        trust_remote_code=False,
        hidden_dir=str(directory),
        assignment=str(assignment),
        vocab=str(vocab_path),
        train=settings,
    )


def losses(records: list[dict]) -> list[tuple]:
    return [(r["kind"], r["step"], r["loss"], tuple(r["loss_pos"]), tuple(r["acc_pos"])) for r in records]


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_split_and_epoch_plan_are_deterministic(hidden, spec):
    directory, assignment, samples = hidden
    data = TrainData(directory, assignment, val_fraction=0.15, seed=0, batch_tokens=96)
    ids = {s["id"] for s in samples}
    held = held_out_ids(ids, 0.15)
    assert held and held == {i for i in ids if id_fraction(i) < 0.15}
    assert len(data.val_items) == len(held) and len(data.train_items) == len(ids) - len(held)
    plan = data.epoch_batches(0)
    seen = [item for batch in plan for item in batch]
    assert sorted(seen) == sorted(data.train_items)  # every training sample once per epoch
    assert all(max(data.lengths[i] for i in b) * len(b) <= 96 for b in plan)
    other = TrainData(directory, assignment, val_fraction=0.15, seed=0, batch_tokens=96)
    assert other.epoch_batches(0) == plan and other.epoch_batches(1) != plan
    assert (
        TrainData(directory, assignment, val_fraction=0.15, seed=1, batch_tokens=96).epoch_batches(0) != plan
    )
    # Each item reads its own sample, wherever it is stored; the batch mixes the shards.
    batch = data.collate(plan[0])
    for r, item in enumerate(plan[0]):
        n = data.lengths[item]
        assert batch.input_ids[r, :n].tolist() == samples[item]["input_ids"]
        assert batch.loss_mask[r, :n].tolist() == samples[item]["loss_mask"]
    assert len({data.where[k][0] for k in seen}) == NUM_SHARDS


def test_the_turns_of_one_conversation_are_on_one_side_of_the_split():
    ids = [f"chat-{i:06d}/{turn}" for i in range(40) for turn in (1, 3, 5)]
    held = held_out_ids(ids, 0.2)
    assert held and all({f"{i.split('/')[0]}/{t}" for t in (1, 3, 5)} <= held for i in held)
    assert id_fraction("chat-000007/3") == id_fraction("chat-000007")
    few = ["a-000000/1", "a-000000/3", "a-000001/1"]
    smallest = min(("a-000000", "a-000001"), key=id_fraction)
    assert held_out_ids(few, 1e-9) == {i for i in few if i.startswith(smallest + "/")}  # all its turns


def test_a_stored_row_that_is_not_the_mix_sample_is_refused(hidden, tmp_path):
    import shutil

    directory, assignment, samples = hidden
    store = tmp_path / "store"
    shutil.copytree(directory, store)
    view = json.loads(assignment.read_text())
    _, address, shard = view["samples"][0]
    index = json.loads((store / f"{shard}.json").read_text())
    offset = next(row for row in index["samples"] if row[0] == address)[2][0]  # its input_ids blob
    data = bytearray((store / f"{shard}.bin").read_bytes())
    data[offset] ^= 0x01
    (store / f"{shard}.bin").write_bytes(bytes(data))
    train_data_ = TrainData(store, assignment, val_fraction=0.0, seed=0, batch_tokens=96)
    with pytest.raises(train_data.TrainDataError, match=f"is not sample {samples[0]['id']}"):
        train_data_.collate([0])


def _fill(batches: list[list], lengths: dict) -> float:
    """Real tokens over padded tokens."""
    real = sum(lengths[i] for b in batches for i in b)
    return real / sum(max(lengths[i] for i in b) * len(b) for b in batches)


def test_sort_windows_hold_enough_tokens_to_fill_large_batches():
    rng = np.random.default_rng(0)
    stream = [(0, i) for i in range(20000)]
    lengths = {item: int(n) for item, n in zip(stream, rng.integers(40, 600, len(stream)), strict=True)}
    budget = 65536  # 256 samples hold ~1.3 batches' worth
    windows = list(sort_windows(stream, lengths, budget))
    assert len(windows) >= 3
    assert [item for w in windows for item in w] == stream  # a partition, in stream order
    for window in windows[:-1]:
        assert len(window) >= train_data.SORT_WINDOW
        assert sum(lengths[i] for i in window) >= train_data.WINDOW_BATCHES * budget
        # ...and no longer than needed: without its last sample it would fall short.
        shorter = window[:-1]
        assert (
            len(shorter) < train_data.SORT_WINDOW
            or sum(lengths[i] for i in shorter) < train_data.WINDOW_BATCHES * budget
        )

    def planned(windows: list[list]) -> list[list]:
        return [b for w in windows for b in pack(sorted(w, key=lambda i: -lengths[i]), lengths, budget)]

    by_count = [stream[s : s + train_data.SORT_WINDOW] for s in range(0, len(stream), train_data.SORT_WINDOW)]
    assert _fill(planned(windows), lengths) > 0.9 and _fill(planned(by_count), lengths) < 0.75


def test_two_segments_equal_one_run_bitwise(spec, tmp_path):
    """Stop after segment 0, rebuild everything from the checkpoint, continue: the same steps."""
    whole = train.Trainer(spec)
    straight = whole.train_until(6)
    assert [r["step"] for r in straight] == list(range(1, 7))

    torch.manual_seed(12345)  # whatever the process did in between must not matter
    first = train.run_segment(spec, 0, None, tmp_path / "ckpt-00000.pt", tmp_path / "metrics-00000.jsonl")
    second = train.run_segment(
        spec, 1, tmp_path / "ckpt-00000.pt", tmp_path / "ckpt-00001.pt", tmp_path / "metrics-00001.jsonl"
    )
    resumed = [r for r in first["records"] + second["records"] if r["kind"] == "train"]
    assert losses(resumed) == losses(straight)  # bitwise: Python floats compared with ==
    assert [r["lr"] for r in resumed] == [r["lr"] for r in straight]
    assert [r["grad_norm"] for r in resumed] == [r["grad_norm"] for r in straight]
    # The metrics files hold the same numbers (JSON round-trips floats exactly), plus validation.
    on_disk = read_records(tmp_path / "metrics-00000.jsonl") + read_records(tmp_path / "metrics-00001.jsonl")
    assert losses([r for r in on_disk if r["kind"] == "train"]) == losses(straight)
    assert [r["kind"] for r in on_disk].count("val") == 2
    state = torch.load(tmp_path / "ckpt-00001.pt", map_location="cpu", weights_only=True)
    expected = {k: v for k, v in whole.draft.state_dict().items() if k != "embed_tokens.weight"}
    assert state["model"].keys() == expected.keys()
    assert all(torch.equal(state["model"][k], expected[k]) for k in expected)
    assert state["step"] == 6 and state["data"]["epoch"] == whole.position.epoch
    assert state["data"]["offset"] == whole.position.offset
    for part in ("python", "numpy", "torch", "cuda"):
        assert part in state["rng"]


def test_checkpoint_restores_every_part_of_the_state(spec, tmp_path):
    trainer = train.Trainer(spec)
    trainer.train_until(3)
    trainer.save(tmp_path / "ckpt.pt", 0)
    torch.manual_seed(99)
    restored = train.Trainer(spec)
    restored.load(tmp_path / "ckpt.pt")
    assert restored.step == 3 and restored.position == trainer.position
    assert restored.scheduler.state_dict() == trainer.scheduler.state_dict()
    assert restored.optimizer.param_groups[0]["lr"] == trainer.optimizer.param_groups[0]["lr"]
    assert torch.equal(torch.get_rng_state(), trainer.state_dict(0)["rng"]["torch"])
    with pytest.raises(TrainError, match="checkpoint of draft"):
        train.Trainer(replace(spec, key="fedcba9876543210")).load(tmp_path / "ckpt.pt")
    # A checkpoint whose draft was built otherwise (here: another RoPE) does not continue as this one.
    state = torch.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=True)
    assert "rope_scaling" not in state["draft_config"]  # the demo target has plain RoPE
    state["draft_config"]["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    torch.save(state, tmp_path / "other.pt")
    with pytest.raises(TrainError, match=r"draft config .*'rope_scaling'.* is not this run's"):
        restored.load(tmp_path / "other.pt")


def test_segment_bounds_refuse_steps_outside_the_run(spec):
    settings = train_settings(total_steps=7, checkpoint_every=3)
    assert train.num_segments(settings) == 3
    assert [train.segment_bounds(settings, n) for n in range(3)] == [(0, 3), (3, 6), (6, 7)]
    with pytest.raises(TrainError, match="outside the run"):
        train.segment_bounds(settings, 3)
    with pytest.raises(TrainError, match="needs the checkpoint"):
        train.run_segment(spec, 1, None, "x.pt", "x.jsonl")


def test_data_parallel_gloo_equals_one_process(spec, tmp_path):
    """2 torchrun processes (gloo), each half of every global batch == 1 process."""
    one = train.run_segment(spec, 0, None, tmp_path / "one.pt", tmp_path / "one.jsonl")
    two_spec = with_processes(spec, 2)
    launch(two_spec, 0, None, tmp_path / "two.pt", tmp_path / "two.jsonl", world_size=2, threads=2)
    assert not list(tmp_path.glob(".tmp-*"))  # the job file is gone
    single, parallel = one["records"], read_records(tmp_path / "two.jsonl")
    assert [(r["kind"], r["step"], r["count_pos"], r["tokens"]) for r in parallel] == [
        (r["kind"], r["step"], r["count_pos"], r["tokens"]) for r in single
    ]
    for a, b in zip(single, parallel, strict=True):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-5)
        for x, y in zip(a["loss_pos"], b["loss_pos"], strict=True):
            assert math.isclose(x, y, rel_tol=1e-5)
    weights_one = torch.load(tmp_path / "one.pt", weights_only=True)["model"]
    weights_two = torch.load(tmp_path / "two.pt", weights_only=True)["model"]
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[name], tensor, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # two torch processes more: the gloo equality above is the fast check
def test_resume_across_a_change_of_process_count(spec, tmp_path):
    """Segment 0 on one process, segment 1 on two (gloo): the steps, the data position and
    the weights of one process running both, within float tolerance."""
    first = train.run_segment(spec, 0, None, tmp_path / "ckpt-0.pt", tmp_path / "m0.jsonl")
    straight = train.run_segment(spec, 1, tmp_path / "ckpt-0.pt", tmp_path / "one.pt", tmp_path / "one.jsonl")
    two_spec = with_processes(spec, 2)
    launch(two_spec, 1, tmp_path / "ckpt-0.pt", tmp_path / "two.pt", tmp_path / "two.jsonl", world_size=2)
    single = [r for r in straight["records"] if r["kind"] == "train"]
    parallel = [r for r in read_records(tmp_path / "two.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in first["records"] if r["kind"] == "train"] == [1, 2, 3]
    assert [(r["step"], r["tokens"]) for r in parallel] == [(r["step"], r["tokens"]) for r in single]
    for a, b in zip(single, parallel, strict=True):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-5)
    one = torch.load(tmp_path / "one.pt", weights_only=True)
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    assert one["step"] == two["step"] == 6 and one["data"] == two["data"]
    for name, tensor in one["model"].items():
        torch.testing.assert_close(two["model"][name], tensor, rtol=1e-4, atol=1e-4)


def test_nccl_between_gpus_gloo_on_cpu():
    assert process_group_backend("cuda") == "nccl"
    assert process_group_backend("cpu") == "gloo"


@pytest.mark.slow  # two torch processes more: the gloo equality above is the fast check
def test_srun_tasks_take_their_ranks_from_slurm(spec, tmp_path):
    """Two processes given only what srun gives its tasks (SLURM_PROCID, SLURM_NTASKS,
    SLURM_LOCALID) and the launcher's rendezvous train exactly as torchrun's two ranks."""
    two_spec = with_processes(spec, 2)
    launch(two_spec, 0, None, tmp_path / "torchrun.pt", tmp_path / "torchrun.jsonl", world_size=2)
    job = write_rank_job(two_spec, 0, None, tmp_path / "srun.pt", tmp_path / "srun.jsonl")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env |= slurm.rendezvous_env() | {"SLURM_NTASKS": "2", "OMP_NUM_THREADS": "1"}
    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "draftsmith.train.launch", str(job), "--slurm"],
            env=env | {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
        )
        for rank in range(2)
    ]
    assert [task.wait(timeout=300) for task in tasks] == [0, 0]
    by_torchrun = torch.load(tmp_path / "torchrun.pt", weights_only=True)["model"]
    by_srun = torch.load(tmp_path / "srun.pt", weights_only=True)["model"]
    assert all(torch.equal(by_srun[name], tensor) for name, tensor in by_torchrun.items())
    losses = {
        run: [(r["step"], r["loss"]) for r in read_records(tmp_path / f"{run}.jsonl")]
        for run in ("srun", "torchrun")
    }
    assert losses["srun"] == losses["torchrun"]


def test_lr_warms_up_then_decays_to_zero():
    schedule = train.WarmupCosine(warmup=4, total=20)
    values = [schedule(s) for s in range(20)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(values[3:], values[4:], strict=False))
    assert schedule(20) == 0.0


# --- the draft_vocab stage -------------------------------------------------------------
def vocab_config(tmp_path: Path, demo_model_dir: Path, **train_overrides) -> dict:
    data = tmp_path / "a.jsonl"
    data.write_text('{"prompt": "x"}\n')
    return cfg.validate(
        {
            "experiment": "v",
            "artifacts_dir": str(tmp_path / "artifacts"),
            "model": {"source": {"kind": "hf_dir", "path": str(demo_model_dir)}},
            "datasets": {"a": {"path": str(data), "format": "prompt"}},
            "train": {"val_fraction": 0.3, **train_overrides},
            "evaluate": {"enabled": False},
        }
    )


def run_vocab_stage(tmp_path: Path, config: dict, samples: list[dict]) -> tuple[dict, dict]:
    merged = tmp_path / "train.jsonl"
    merged.write_text("".join(json.dumps(s) + "\n" for s in samples))
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "model.json").write_text(json.dumps({"vocab_size": 49152, "hf_dir": "."}))
    out = tmp_path / "vocab"
    outputs = {
        "vocab": out / "vocab.safetensors",
        "info": out / "vocab.json",
        "manifest": out / "manifest.json",
    }
    resolved = configure(config)
    info = vocab(
        resolved.vocab,
        resolved.plan.vocab,
        inputs={"model": str(tmp_path / "model" / "model.json"), "merged": str(merged)},
        outputs=outputs,
    )
    assert json.loads(outputs["info"].read_text()) == info
    assert json.loads(outputs["manifest"].read_text())["stage"] == "vocab"
    return info, load_file(str(outputs["vocab"]))


def split_ids(count: int, fraction: float) -> tuple[list[str], list[str]]:
    ids = [f"s-{i:06d}" for i in range(count)]
    held = held_out_ids(ids, fraction)
    return [i for i in ids if i not in held], [i for i in ids if i in held]


def test_vocab_counts_supervised_training_tokens_only(tmp_path, demo_model_dir):
    train_ids, held = split_ids(12, 0.3)
    assert held and train_ids
    samples = []
    for n, sample_id in enumerate(train_ids):
        # 5000 appears often but never supervised; 10 + n supervised n + 1 times.
        samples.append(
            {
                "id": sample_id,
                "input_ids": [5000] * 9 + [10 + n] * (n + 1),
                "loss_mask": [0] * 9 + [1] * (n + 1),
            }
        )
    for sample_id in held:
        samples.append(
            {"id": sample_id, "input_ids": [777] * 50, "loss_mask": [1] * 50}
        )  # held out: never counted
    size = 4
    info, vocab = run_vocab_stage(
        tmp_path, vocab_config(tmp_path, demo_model_dir, draft_vocab_size=size), samples
    )
    chosen = (vocab["d2t"] + torch.arange(size)).tolist()
    most_frequent = sorted(10 + n for n in range(len(train_ids) - size, len(train_ids)))
    assert chosen == most_frequent  # the top ids by supervised count, sorted
    assert vocab["d2t"].dtype == torch.int64 and vocab["t2d"].dtype == torch.bool
    assert vocab["t2d"].sum() == size and vocab["t2d"][chosen].all()
    total = sum(range(1, len(train_ids) + 1))
    assert info["supervised_tokens"] == total and info["distinct_tokens"] == len(train_ids)
    assert info["coverage"] == pytest.approx(
        sum(range(len(train_ids) - size + 1, len(train_ids) + 1)) / total
    )
    assert info["held_out_samples"] == len(held) and info["train_samples"] == len(train_ids)
    assert info["padded"] == 0


def test_vocab_pads_with_unused_ids_when_the_data_is_small(tmp_path, demo_model_dir):
    train_ids, held = split_ids(6, 0.3)
    samples = [{"id": i, "input_ids": [3, 7, 7, 9], "loss_mask": [1, 1, 1, 1]} for i in train_ids]
    samples += [{"id": i, "input_ids": [4], "loss_mask": [1]} for i in held]
    info, vocab = run_vocab_stage(
        tmp_path, vocab_config(tmp_path, demo_model_dir, draft_vocab_size=6), samples
    )
    chosen = (vocab["d2t"] + torch.arange(6)).tolist()
    # 3, 7, 9 from the data, padded with the smallest ids not chosen (4 is only held out).
    assert chosen == [0, 1, 2, 3, 7, 9]
    assert info["distinct_tokens"] == 3 and info["padded"] == 3 and info["coverage"] == 1.0
    assert vocab["t2d"].nonzero().flatten().tolist() == chosen  # d2t and t2d describe the same ids


def test_sparse_steps_equal_computing_every_position(spec):
    """Steps after the first skip positions never scored again: same losses and gradients."""
    from draftsmith.draft.model import ttt_sums

    trainer = train.Trainer(spec)
    items = trainer.data.epoch_batches(0)[0]
    batch = trainer.data.collate(items, torch.float32)
    in_vocab = trainer.in_vocab(items, batch)
    results = {}
    for sparse in (False, True):
        trainer.draft.zero_grad()
        sums = ttt_sums(
            trainer.draft,
            trainer.head,
            batch.input_ids,
            batch.loss_mask,
            batch.attention_mask,
            batch.aux,
            batch.final,
            3,
            in_vocab=in_vocab,
            sparse=sparse,
        )
        sum(s["loss_sum"] for s in sums).backward()
        results[sparse] = (
            [(float(s["loss_sum"].detach()), int(s["count"]), int(s["correct"])) for s in sums],
            [p.grad.clone() for p in trainer.params],
        )
    assert results[True][0] == results[False][0]
    for sparse_grad, dense_grad in zip(results[True][1], results[False][1], strict=True):
        # Float summation order differs (gathered rows), nothing else.
        scale = float(dense_grad.abs().max())
        assert float((sparse_grad - dense_grad).abs().max()) <= 1e-5 * scale


def _explicit_ttt_attention(q, keys, values):
    """The TTT attention written out: one softmax over step 0's causal scores and the
    diagonal scores of the later steps (GQA: key heads repeated)."""
    b, h, t, d = q.shape
    groups = h // keys[0].shape[1]
    k = [x.repeat_interleave(groups, dim=1) for x in keys]
    v = [x.repeat_interleave(groups, dim=1) for x in values]
    allowed = torch.ones(t, t, device=q.device).tril().bool()
    scores0 = (q @ k[0].transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
    diag = [(q * x).sum(-1, keepdim=True) for x in k[1:]]
    weights = torch.softmax(torch.cat([scores0, *diag], dim=-1) / math.sqrt(d), dim=-1)
    out = weights[..., :t] @ v[0] + sum(weights[..., t + i : t + i + 1] * x for i, x in enumerate(v[1:]))
    return out.transpose(1, 2).reshape(b, t, h * d)


def assert_ttt_attention_matches_explicit(steps: int, dtype: torch.dtype, device: str, tol: float) -> None:
    """`Attention.heads` (fused kernel) against the written-out softmax in float64, outputs
    and the gradients of every input, on a right-padded batch with grouped key heads.
    Padded positions are never scored, so the probe reads real positions only."""
    from draftsmith.draft.model import Attention, DraftConfig

    attn = Attention(DraftConfig(64, 32, 4, 2, 32, 50, 20, 64))
    gen = torch.Generator().manual_seed(0)
    b, t = 2, 37
    real = torch.ones(b, t, 1, dtype=torch.float64)
    real[1, 30:] = 0  # right padding
    exact = [torch.randn(b, 4, t, 32, generator=gen, dtype=torch.float64)]
    exact += [torch.randn(b, 2, t, 32, generator=gen, dtype=torch.float64) for _ in range(2 * steps)]
    probe = torch.randn(b, t, 128, generator=gen, dtype=torch.float64) * real
    inputs = [x.to(device, dtype).requires_grad_(True) for x in exact]
    for x in exact:
        x.requires_grad_(True)
    got = attn.heads(inputs[0], inputs[1 : 1 + steps], inputs[1 + steps :])
    want = _explicit_ttt_attention(exact[0], exact[1 : 1 + steps], exact[1 + steps :])
    assert got.dtype == dtype
    grads_got = torch.autograd.grad((got.double() * probe.to(device)).sum(), inputs)
    grads_want = torch.autograd.grad((want * probe).sum(), exact)
    for a, w in zip([got, *grads_got], [want * real, *grads_want], strict=True):
        a, w = a.detach().double().cpu() * (real if a.dim() == 3 else 1), w.detach()
        assert float((a - w).abs().max()) <= tol * float(w.abs().max()), float((a - w).abs().max())


@pytest.mark.parametrize(
    "dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.bfloat16, 3e-2)]
)
@pytest.mark.parametrize("steps", [1, 2, 4])
def test_ttt_attention_equals_the_written_out_softmax(steps, dtype, tol):
    """On the CPU kernel; tests/test_train_gpu.py runs the same check on the CUDA kernels."""
    assert_ttt_attention_matches_explicit(steps, dtype, "cpu", tol)
