"""The workflow under a real Slurm: the tiny every-stage config through `profiles/slurm`.

Needs a Slurm node with two GPUs as a GRES and the `[slurm]` extra: `.ci/slurm_node.sh
start` makes one on this machine (`.ci/run` does). Without one these tests skip, unless
DRAFTSMITH_REQUIRE_SLURM is set (CI), where they fail.

One module run (`slurm_run`) builds `train` locally and under Slurm, with training on
two ranks (srun tasks under Slurm, torchrun locally), cancels the Slurm job of the
second (last) training segment while it runs, and resumes with two workflows at once on the
same store (the first checkout and a second one): the tests then read what happened.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, built_by, finished_files, pipeline_config, snakemake_cmd

from draftsmith.config import validate
from draftsmith.store.layout import segment_name
from draftsmith.store.plan import Plan, plan_for
from draftsmith.store.verify import SHARD_INDEX_GLOB

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

PROFILE = REPO / "profiles" / "slurm"
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: .*/slurm_logs/(\S+)/\d+\.log\)")
# Files that record wall time or tokens/s: equal in their keys, not in bytes (checkpoints'
# weights are compared on their own).
TIMED = re.compile(r"(metrics-\d+\.jsonl|train_summary\.json|ckpt-\d+\.pt)$")


@pytest.fixture(scope="module")
def slurm_node() -> None:
    idle = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, check=False)
    plugin = importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None
    if idle.returncode != 0 or not {"idle", "mixed"} & set(idle.stdout.split()) or not plugin:
        reason = "needs an idle Slurm node (.ci/slurm_node.sh start) and the [slurm] extra"
        if os.environ.get("DRAFTSMITH_REQUIRE_SLURM"):
            pytest.fail(reason)
        pytest.skip(reason)


def slurm_command(work: Path, config_path: Path, *args: str) -> list[str]:
    return snakemake_cmd(work, config_path, "--profile", str(PROFILE), "--jobs", "4", *args)


@dataclass
class SlurmRun:
    """A snakemake run through the Slurm profile, its output going to a file."""

    work: Path
    process: subprocess.Popen
    output: Path

    @classmethod
    def start(cls, work: Path, config: dict, *args: str, name: str = "run") -> SlurmRun:
        config_path = work / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        output = work / f"{name}.out"
        with output.open("w") as sink:
            process = subprocess.Popen(
                slurm_command(work, config_path, *args), stdout=sink, stderr=subprocess.STDOUT
            )
        return cls(work, process, output)

    def text(self) -> str:
        return self.output.read_text()

    def jobs(self) -> dict[str, int]:
        """Slurm job id of each submitted job, by its log name (`rule_train_segment/00001`)."""
        return {name: int(job_id) for job_id, name in SUBMITTED.findall(self.text())}

    def wait(self, timeout_s: float = 900) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"snakemake under Slurm did not finish:\n{self.text()[-4000:]}") from None


def sacct(job_ids: list[int], fields: str, steps: bool = False) -> list[dict[str, str]]:
    """One dict per allocation (and per step with `steps`) of `job_ids`."""
    cmd = ["sacct", "-n", "-P", "-j", ",".join(map(str, job_ids)), "-o", fields]
    rows = subprocess.run(cmd if steps else [*cmd, "-X"], capture_output=True, text=True, check=True)
    names = fields.split(",")
    return [dict(zip(names, line.split("|"), strict=True)) for line in rows.stdout.splitlines()]


def contents(store: Path) -> dict[str, str]:
    """sha256 of every data file every finished artifact lists, by path under the store
    (manifests, shard indexes and staging records hold times and are left out)."""
    listed = finished_files(store)
    records = {
        p for p in listed if p.name == "manifest.json" or ".staged" in p.parts or p.match(SHARD_INDEX_GLOB)
    }
    return {str(p.relative_to(store)): digest for p, digest in listed.items() if p not in records}


def plan_of(config: dict) -> Plan:
    return plan_for(validate(copy.deepcopy(config)))


def snapshot(paths: list[Path]) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths}


def slurm_config(tmp: Path, model_dir: Path, store: Path) -> dict:
    config = pipeline_config(tmp, model_dir, store)
    # Two ranks (gloo on CPU): srun tasks under Slurm, torchrun locally; two segments.
    config["train"] |= {"gpus": 2, "grad_accum": 2, "total_steps": 4}
    return config


@dataclass
class Outcome:
    local_store: Path
    work: Path
    store: Path
    config: dict
    first: SlurmRun
    cancelled: int
    kept: dict[Path, tuple[int, int]]
    ranks_left: list[str]
    rerun: SlurmRun
    second: SlurmRun  # another checkout, resuming the same store at the same time


def train_ranks() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if "draftsmith.train.launch" in line]


@pytest.fixture(scope="module")
def slurm_run(slurm_node, tmp_path_factory, demo_model_dir) -> Outcome:
    work = tmp_path_factory.mktemp("slurm")
    config = slurm_config(work, demo_model_dir, work / "store")
    plan = plan_of(config)
    first = SlurmRun.start(work, config, "train", name="first")
    # The local reference run meanwhile: Slurm jobs spend much of their time starting and polled.
    local = tmp_path_factory.mktemp("local")
    reference = local / "config.yaml"
    reference.write_text(yaml.safe_dump(slurm_config(local, demo_model_dir, local / "store")))
    with (local / "run.out").open("w") as sink:
        command = snakemake_cmd(local, reference, "train")
        local_run = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    second_segment = work / "logs" / "train" / plan.train.key / f"segment-{segment_name(1)}.log"
    deadline = time.monotonic() + 600
    while "srun segment 1: running" not in (second_segment.read_text() if second_segment.exists() else ""):
        assert first.process.poll() is None and time.monotonic() < deadline, first.text()[-4000:]
        time.sleep(0.5)
    cancelled = first.jobs()[f"rule_train_segment/{segment_name(1)}"]
    subprocess.run(["scancel", str(cancelled)], check=True)
    assert first.wait() != 0, "the run with a cancelled job must fail"
    assert local_run.wait(timeout=900) == 0, (local / "run.out").read_text()[-4000:]
    time.sleep(2)  # srun's tasks get SIGTERM then SIGKILL from slurmd
    finished = [plan.checkpoint(0), *(plan.shard(n, "bin") for n in plan.mix_shard_names())]
    kept = snapshot(finished)
    ranks_left = train_ranks()
    other = tmp_path_factory.mktemp("second")
    rerun = SlurmRun.start(work, config, "train", name="rerun")
    second = SlurmRun.start(other, slurm_config(other, demo_model_dir, work / "store"), "train")
    assert [rerun.wait(), second.wait()] == [0, 0], [rerun.text()[-3000:], second.text()[-3000:]]
    outcome = (first, cancelled, kept, ranks_left, rerun, second)
    return Outcome(local / "store", work, work / "store", config, *outcome)


def test_every_job_ran_under_slurm_with_its_ids_in_the_log(slurm_run):
    jobs = slurm_run.first.jobs() | slurm_run.rerun.jobs()
    ids = [*jobs.values(), *slurm_run.second.jobs().values()]
    segments = {f"rule_train_segment/{segment_name(n)}" for n in range(2)}
    assert {"rule_model", "rule_train"} | segments <= set(jobs)
    assert any(name.startswith("group_data") for name in jobs)  # the small jobs run as one
    states = {row["JobID"]: row["State"] for row in sacct([*ids, slurm_run.cancelled], "JobID,State")}
    expected = {str(i): "COMPLETED" for i in ids} | {str(slurm_run.cancelled): "CANCELLED by 0"}
    assert states == expected
    logs = "".join(p.read_text() for p in (slurm_run.work / ".snakemake" / "log").glob("*.log"))
    assert all(f"SLURM jobid {i} " in logs for i in jobs.values())


def test_training_ranks_are_srun_tasks_of_the_segment_allocation(slurm_run):
    segment = slurm_run.first.jobs()[f"rule_train_segment/{segment_name(0)}"]
    steps = {row["JobID"]: row for row in sacct([segment], "JobID,NTasks,NCPUS,State", steps=True)}
    assert steps[f"{segment}.0"]["NTasks"] == "2" and steps[f"{segment}.0"]["State"] == "COMPLETED"
    assert steps[str(segment)]["NCPUS"] == "2"


def test_cancelled_segment_resumes_and_finished_work_is_untouched(slurm_run):
    assert slurm_run.ranks_left == []  # scancel took the srun tasks down with the job
    assert snapshot(list(slurm_run.kept)) == slurm_run.kept
    later = {f"rule_train_segment/{segment_name(1)}", "rule_train"}
    assert set(slurm_run.rerun.jobs()) == set(slurm_run.second.jobs()) == later  # nothing earlier


def test_two_workflows_resuming_one_store_build_each_artifact_once(slurm_run):
    keyed = built_by([slurm_run.work, slurm_run.second.work])
    resumed = {job: who for job, who in keyed.items() if job.startswith("train/")}
    assert all(len(who) == 1 for who in keyed.values()), keyed
    assert len(resumed) == 3  # segment 0 (first run), segment 1 and the final weights


def test_keys_and_contents_equal_the_local_run(slurm_run):
    stores = (slurm_run.local_store, slurm_run.store)
    local, remote = map(contents, stores)
    assert sorted(local) == sorted(remote)  # the same artifacts under the same keys
    differ = sorted(path for path in local if local[path] != remote[path] and not TIMED.search(path))
    assert differ == []
    assert any(path.endswith("draft.safetensors") for path in local)
    for path in (p for p in local if p.endswith(".pt")):
        weights = [torch.load(root / path, weights_only=True)["model"] for root in stores]
        assert all(torch.equal(weights[1][name], tensor) for name, tensor in weights[0].items()), path


def test_gpu_rules_carry_their_gpu_request(slurm_run):
    """Rerun the finished shards and first segment on 'GPUs' (the node's fake GPU GRES):
    each job is scheduled with its rule's GPUs, then finds its outputs built."""
    config = copy.deepcopy(slurm_run.config)
    config["extract"]["device"] = config["train"]["device"] = "cuda"
    plan = plan_of(config)
    expected = {f"rule_hidden_shard/{name}": 1 for name in plan.mix_shard_names()}
    expected[f"rule_train_segment/{segment_name(0)}"] = 2
    jobs: dict[str, int] = {}
    # One rule forced per run: forcing the shards as well drops the segment from the DAG.
    shards = [str(plan.shard(name, "bin")) for name in plan.mix_shard_names()]
    for rule, targets in (("hidden_shard", shards), ("train_segment", [str(plan.checkpoint(0))])):
        run = SlurmRun.start(slurm_run.work, config, *targets, "--forcerun", rule, name=f"gpu-{rule}")
        assert run.wait() == 0, run.text()[-4000:]
        jobs |= run.jobs()
    assert set(jobs) == set(expected)
    rows = {row["JobID"]: row for row in sacct(list(jobs.values()), "JobID,ReqTRES,AllocTRES")}
    for name, job_id in jobs.items():
        requested, row = f"gres/gpu={expected[name]}", rows[str(job_id)]
        assert requested in row["ReqTRES"] and requested in row["AllocTRES"], (name, row)
