"""The report's figures, drawn with matplotlib's Agg canvas (no display, no pyplot state).

Each function takes the parsed JSON artifacts and writes one PNG atomically. The PNG
carries no software/version or date metadata, so the same inputs give the same bytes.
"""

from __future__ import annotations

import math
import os

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from draftsmith.fsutil import atomic
from draftsmith.report.summary import by_k

DPI = 110
PANEL_SIZE = (4.8, 3.6)  # inches per subplot
MAX_COLUMNS = 3
DODGE = 0.05  # x offset between the k lines of the per-position plot
THOUSANDS = StrMethodFormatter("{x:,.0f}")


def save_png(fig: Figure, path: str | os.PathLike) -> None:
    FigureCanvasAgg(fig)  # attaches the Agg canvas: whatever backend pyplot would pick is never used
    with atomic.atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=DPI, metadata={"Software": None})


def _panels(count: int, title: str) -> tuple[Figure, list[Axes]]:
    """One subplot per item, wrapped at MAX_COLUMNS; unused grid cells are hidden."""
    columns = min(count, MAX_COLUMNS)
    rows = math.ceil(count / columns)
    fig = Figure(figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows), layout="constrained")
    axes = list(fig.subplots(rows, columns, squeeze=False).flat)
    for spare in axes[count:]:
        spare.set_visible(False)
    fig.suptitle(title)
    return fig, axes[:count]


def not_measured(path: str | os.PathLike, title: str, reason: str) -> None:
    """A figure that says why there is nothing to draw (the report's outputs are fixed)."""
    fig = Figure(figsize=PANEL_SIZE, layout="constrained")
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes)
    save_png(fig, path)


# --- benchmark ---------------------------------------------------------------------
def acceptance_length(benchmark: dict, path: str | os.PathLike) -> None:
    """Mean accepted tokens per verify step against k, one line per prompt set."""
    fig = Figure(figsize=PANEL_SIZE, layout="constrained")
    ax = fig.subplots()
    ks = sorted(benchmark["k"])
    ax.plot(ks, [k + 1 for k in ks], "k--", linewidth=1, label="upper bound k+1")
    for name, prompt_set in sorted(benchmark["prompt_sets"].items()):
        points = by_k(prompt_set)
        ax.plot([k for k, _ in points], [r["acceptance_length"] for _, r in points], "o-", label=name)
    ax.set(
        title="Acceptance length vs k",
        xlabel="k (draft tokens per verify step)",
        ylabel="tokens per verify step",
        xticks=ks,
    )
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save_png(fig, path)


def acceptance_per_position(benchmark: dict, path: str | os.PathLike) -> None:
    """Acceptance rate at each draft position, one panel per prompt set, one line per k."""
    sets = sorted(benchmark["prompt_sets"].items())
    fig, axes = _panels(len(sets), "Acceptance per draft position")
    for ax, (name, prompt_set) in zip(axes, sets, strict=True):
        points = by_k(prompt_set)
        for index, (k, result) in enumerate(points):
            # Nudge each k sideways: the rates at a position are often equal across k.
            shift = (index - (len(points) - 1) / 2) * DODGE
            positions = [j + 1 + shift for j in range(len(result["per_position"]))]
            ax.plot(positions, result["per_position"], "o-", label=f"k={k}")
        ax.set(title=name, xlabel="draft position", ylabel="accepted (share of verify steps)", ylim=(0, 1.05))
        ax.set_xticks(range(1, max(benchmark["k"]) + 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    save_png(fig, path)


def throughput(benchmark: dict, path: str | os.PathLike) -> None:
    """Tokens/s of the target alone and with the draft at each k, speed-up over each bar."""
    sets = sorted(benchmark["prompt_sets"].items())
    fig, axes = _panels(len(sets), "Decoding throughput, baseline vs draft")
    for ax, (name, prompt_set) in zip(axes, sets, strict=True):
        points = by_k(prompt_set)
        labels = ["target"] + [f"k={k}" for k, _ in points]
        rates = [prompt_set["baseline"]["tokens_per_s"]] + [r["tokens_per_s"] for _, r in points]
        bars = ax.bar(labels, rates, color=["tab:gray"] + ["tab:blue"] * len(points))
        ax.bar_label(bars, ["1.00x"] + [f"{r['speedup']:.2f}x" for _, r in points], fontsize="small")
        ax.set(title=name, ylabel="tokens/s")
        ax.yaxis.set_major_formatter(THOUSANDS)
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    save_png(fig, path)


# --- training ----------------------------------------------------------------------
def _split(records: list[dict]) -> tuple[list[dict], list[dict]]:
    train = sorted((r for r in records if r["kind"] == "train"), key=lambda r: r["step"])
    val = sorted((r for r in records if r["kind"] == "val"), key=lambda r: r["step"])
    return train, val


def training_loss(records: list[dict], path: str | os.PathLike) -> None:
    """The TTT loss (sum over positions, weighted 0.8^j) per step, validation as markers."""
    train, val = _split(records)
    fig = Figure(figsize=(PANEL_SIZE[0] * 1.4, PANEL_SIZE[1]), layout="constrained")
    ax = fig.subplots()
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], linewidth=1, label="train (per step)")
    ax.plot([r["step"] for r in val], [r["loss"] for r in val], "o--", label="validation")
    ax.set(title="Draft training loss", xlabel="optimiser step", ylabel="TTT loss (0.8^j-weighted sum)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save_png(fig, path)


def training_accuracy(records: list[dict], path: str | os.PathLike) -> None:
    """Top-1 accuracy per TTT position against step: train per step and validation."""
    train, val = _split(records)
    fig, (ax_train, ax_val) = _panels(2, "Draft accuracy per TTT position")
    parts = ((ax_train, train, "-", "train (per step)"), (ax_val, val, "o-", "validation"))
    for ax, part, style, title in parts:
        steps = [r["step"] for r in part]
        positions = len(part[0]["acc_pos"]) if part else 0
        for j in range(positions):
            ax.plot(steps, [r["acc_pos"][j] for r in part], style, label=f"position {j + 1}")
        ax.set(title=title, xlabel="optimiser step", ylabel="top-1 accuracy")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if positions:
            ax.legend(fontsize="x-small", ncols=2)
    save_png(fig, path)


# --- data --------------------------------------------------------------------------
def data_report(report: dict, path: str | os.PathLike) -> None:
    """Tokens and supervised tokens per dataset; a cost panel when any dataset cost money."""
    rows = report["datasets"]
    names = [r["dataset"] for r in rows]
    paid = any(r["cost_usd"] for r in rows)
    fig, axes = _panels(2 if paid else 1, f"Training data: {report['experiment']}")
    ax = axes[0]
    x = range(len(rows))
    width = 0.4
    ax.bar([i - width / 2 for i in x], [r["tokens"] for r in rows], width, label="tokens")
    ax.bar([i + width / 2 for i in x], [r["supervised_tokens"] for r in rows], width, label="supervised")
    ax.set_xticks(list(x), names)
    ax.set(title="Tokens per dataset", ylabel="tokens")
    ax.yaxis.set_major_formatter(THOUSANDS)
    ax.legend(fontsize="small")
    if paid:
        axes[1].bar(names, [r["cost_usd"] for r in rows], color="tab:red")
        axes[1].set(title="Generation cost per dataset", ylabel="US$")
    for panel in axes:
        panel.grid(axis="y", alpha=0.3)
        if len(names) > 4:  # long lists of names overlap unless slanted
            panel.tick_params(axis="x", labelrotation=30)
    save_png(fig, path)
