"""srun process groups: the task layout a training job asks Slurm for, the srun command,
and the rank each task takes (the real run under Slurm: tests/slurm)."""

from __future__ import annotations

import pytest
from conftest import stand_in_config

from draftsmith import config as cfg
from draftsmith.runtime import slurm
from draftsmith.runtime.resources import TRAIN_THREADS, train_tasks


@pytest.fixture
def train_config(tmp_path):
    def with_train(**train) -> dict:
        return cfg.validate(stand_in_config(tmp_path) | {"train": train})

    return with_train


def test_one_rank_asks_for_no_tasks(train_config):
    assert train_tasks(train_config()) == {}


def test_cpu_ranks_are_tasks_sharing_the_job_threads(train_config):
    tasks = train_tasks(train_config(gpus=2, grad_accum=2))
    assert tasks == {"tasks": 2, "mpi": "srun", "cpus_per_task": TRAIN_THREADS // 2}


def test_gpu_ranks_are_one_task_per_gpu(train_config):
    tasks = train_tasks(train_config(gpus=4, grad_accum=4, device="cuda"))
    assert tasks == {"tasks": 4, "mpi": "srun", "cpus_per_task": 1, "tasks_per_gpu": 1}


def test_srun_command_starts_every_rank_in_one_step():
    cmd = slurm.srun_command(2, 3, 1, ["python", "-m", "x"])
    assert cmd[0] == "srun" and cmd[-3:] == ["python", "-m", "x"]
    assert {"--ntasks=2", "--cpus-per-task=3", "--gpus-per-task=1", "--kill-on-bad-exit=1"} <= set(cmd)
    assert not any(arg.startswith("--gpus") for arg in slurm.srun_command(2, 1, 0, ["x"]))


def test_rank_comes_from_the_task_variables():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}
    assert slurm.rank_env(env) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    with pytest.raises(KeyError, match="SLURM_PROCID"):
        slurm.rank_env({"SLURM_NTASKS": "4"})


def test_outside_a_job_there_is_no_allocation(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert not slurm.in_allocation()
    env = slurm.rendezvous_env()
    assert env["MASTER_ADDR"] and 0 < int(env["MASTER_PORT"]) < 65536
