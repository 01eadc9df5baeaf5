"""Matplotlib drawings of the lessons' ideas. No widgets here (see mgpu_edu.widgets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes

    from mgpu_edu.devices import DeviceLayout

PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def device_color(i: int) -> str:
    """The colour every drawing uses for logical device i."""
    return PALETTE[i % len(PALETTE)]


def draw_layout(layout: DeviceLayout, ax: Axes | None = None) -> Axes:
    """Draw physical devices on top and the logical devices carved from them below.

    Works the same with or without a GPU: on a CPU the logical devices share the cores,
    which the drawing says instead of showing memory limits.

    Example:
        >>> ax = draw_layout(mgpu_edu.setup_devices(4))  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.8))
    n = len(layout)
    width = max(n, 2)
    physical = layout.physical if layout.mode == "physical" else layout.physical[:1]
    for j, name in enumerate(physical):
        x0 = j * width / len(physical)
        w = width / len(physical) - 0.1
        ax.add_patch(FancyBboxPatch((x0 + 0.05, 1.6), w, 0.7, boxstyle="round,pad=0.02",
                                    facecolor="#eeeeee", edgecolor="black"))
        label = layout.hardware if layout.mode == "split" else name
        ax.text(x0 + 0.05 + w / 2, 1.95, f"physical: {label}\n{name}", ha="center", va="center", fontsize=9)
    for i, logical in enumerate(layout):
        ax.add_patch(FancyBboxPatch((i * width / n + 0.1, 0.2), width / n - 0.2, 0.8, boxstyle="round,pad=0.02",
                                    facecolor=device_color(i), edgecolor="black", alpha=0.85))
        limit = layout.memory_limits_mb[i]
        memory = f"{limit:,} MB" if limit else ("shared RAM" if layout.kind == "CPU" else "whole GPU")
        ax.text((i + 0.5) * width / n, 0.6, f"{logical.split('/')[-1]}\n{memory}", ha="center", va="center",
                fontsize=9, color="white", fontweight="bold")
        parent = 0 if layout.mode == "split" else i
        px = (parent + 0.5) * width / len(physical)
        ax.annotate("", xy=((i + 0.5) * width / n, 1.02), xytext=(px, 1.58),
                    arrowprops={"arrowstyle": "->", "color": "gray"})
    ax.set_xlim(-0.1, width + 0.1)
    ax.set_ylim(0, 2.45)
    ax.axis("off")
    ax.set_title(layout.banner, fontsize=10)
    return ax


def draw_memory_split(total_mb: int, counts: range, limits: list[int], ax: Axes | None = None) -> Axes:
    """Bar chart: memory limit per logical GPU against how many logical GPUs share one card."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    bars = ax.bar([str(n) for n in counts], limits, color=[device_color(i) for i in range(len(limits))])
    ax.bar_label(bars, labels=[f"{v:,}" for v in limits], fontsize=8)
    ax.axhline(total_mb, color="black", linestyle=":", linewidth=1)
    ax.text(len(limits) - 0.5, total_mb, f"whole card: {total_mb:,} MB", ha="right", va="bottom", fontsize=8)
    ax.set_xlabel("logical GPUs carved from one card")
    ax.set_ylabel("memory limit each (MB)")
    ax.set_ylim(0, total_mb * 1.15)
    return ax
