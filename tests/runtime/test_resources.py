"""Each stage that runs on a GPU declares it, so the scheduler never puts two such jobs on one."""

from __future__ import annotations

import copy
from pathlib import Path

from draftsmith import config as cfg
from draftsmith.runtime.resources import evaluate_gpus, hidden_gpus, responses_gpus, train_gpus

ROOT = Path(__file__).resolve().parents[2]


def test_every_gpu_stage_of_the_medium_run_declares_one_gpu():
    # The medium run put five hf generation jobs on one GPU at once (out of memory) while
    # their rule declared none.
    config = cfg.load(ROOT / "configs" / "smollm2-medium-h200.yaml")
    for dataset in cfg.enabled_datasets(config):
        backend = cfg.dataset_settings(config, dataset)["generation"]["backend"]
        assert responses_gpus(config, backend) == 1, dataset
    assert hidden_gpus(config) == 1
    assert train_gpus(config) == 1
    assert evaluate_gpus(config) == 1


def test_cpu_and_api_generation_hold_no_gpu():
    config = cfg.load(ROOT / "config.yaml")
    assert config["generation"]["hf"]["device"] == "cpu"
    assert responses_gpus(config, "hf") == 0
    assert responses_gpus(config, "openai") == 0
    served = copy.deepcopy(config)
    served["generation"]["sglang"]["gpus"] = 2
    assert responses_gpus(served, "sglang") == 2
