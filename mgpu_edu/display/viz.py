"""Matplotlib drawings of the lessons' ideas. No widgets here (see mgpu_edu.widgets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from mgpu_edu.runtime.devices import DeviceLayout

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


def _short(device: str) -> str:
    return device.split("device:")[-1]


def draw_timeline(runs: dict[str, list], ax: Axes | None = None) -> Axes:
    """Gantt chart of measured device work: one row per (run, device), bars from start to end.

    ``runs`` maps a label ("eager", "graph") to spans with ``device``, ``start`` and ``end`` in
    seconds (as :func:`mgpu_edu.parallel.timed_on_devices` returns them).
    """
    import matplotlib.pyplot as plt

    rows = [(label, span) for label, spans in runs.items() for span in spans]
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1))
    devices = sorted({span.device for _, span in rows})
    for y, (_label, span) in enumerate(reversed(rows)):
        color = device_color(devices.index(span.device))
        ax.barh(y, (span.end - span.start) * 1e3, left=span.start * 1e3, color=color, edgecolor="black", height=0.7)
    ax.set_yticks(range(len(rows)), [f"{label} · {_short(span.device)}" for label, span in reversed(rows)])
    ax.set_xlabel("time since the call started (ms)")
    ax.grid(axis="x", alpha=0.3)
    return ax


def draw_batch_flow(sizes: list[int], devices: list[str], ax: Axes | None = None) -> Axes:
    """How one batch flows through the towers: split, forward/backward per device, combine, update."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    n, batch = len(sizes), sum(sizes)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.4))
    start = 0
    for i, size in enumerate(sizes):  # the batch, coloured by which tower gets each example
        ax.add_patch(plt.Rectangle((start / max(batch, 1) * n, 3.2), size / max(batch, 1) * n, 0.5,
                                   facecolor=device_color(i), edgecolor="black"))
        if size:
            ax.text((start + size / 2) / batch * n, 3.45, f"{size}", ha="center", va="center", color="white",
                    fontsize=9, fontweight="bold")
        start += size
    ax.text(-0.1, 3.45, f"batch of {batch}", ha="right", va="center", fontsize=9)
    for i, (size, device) in enumerate(zip(sizes, devices, strict=True)):
        x = i + 0.1
        ax.add_patch(FancyBboxPatch((x, 1.4), 0.8, 1.2, boxstyle="round,pad=0.02", facecolor=device_color(i),
                                    alpha=0.85, edgecolor="black"))
        ax.text(x + 0.4, 2.0, f"tower {i}\n{_short(device)}\n{size} examples\nforward,\nbackward",
                ha="center", va="center", fontsize=8, color="white")
        ax.annotate("", xy=(x + 0.4, 2.62), xytext=(x + 0.4, 3.18), arrowprops={"arrowstyle": "->"})
        ax.annotate("", xy=(n / 2, 0.82), xytext=(x + 0.4, 1.38), arrowprops={"arrowstyle": "->", "color": "gray"})
    ax.add_patch(FancyBboxPatch((n / 2 - 1.4, 0.1), 2.8, 0.7, boxstyle="round,pad=0.02", facecolor="#eeeeee",
                                edgecolor="black"))
    ax.text(n / 2, 0.45, "Σ gradients ÷ batch → one update\noutputs concatenated in order", ha="center",
            va="center", fontsize=9)
    ax.set_xlim(-1.2, n + 0.1)
    ax.set_ylim(0, 3.8)
    ax.axis("off")
    return ax


def draw_allreduce_step(trace, k: int, ax: Axes | None = None) -> Axes:  # trace: an allreduce.Trace
    """Each device's chunks after step k of an all-reduce trace, with the sends of step k as arrows.

    A cell shows which devices' data the chunk has summed; it darkens as the sum fills, and
    is marked Σ when complete.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    n = trace.n
    chunks = len(trace.chunk_bytes)
    state = trace.state_at(k)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.1 * chunks + 2.5, 0.55 * n + 1.2))
    for d in range(n):
        y = n - 1 - d
        for c in range(chunks):
            members = state[d][c]
            share = len(members) / n
            base = to_rgb(device_color(d))
            face = tuple(1 - share * (1 - v) for v in base)
            ax.add_patch(plt.Rectangle((c, y + 0.1), 0.9, 0.8, facecolor=face, edgecolor="black"))
            label = "Σ" if len(members) == n else "+".join(map(str, members))
            ax.text(c + 0.45, y + 0.5, label, ha="center", va="center", fontsize=8 if len(label) < 8 else 6)
        ax.text(-0.15, y + 0.5, f"device {d}", ha="right", va="center", fontsize=9, color=device_color(d))
    if k > 0:
        step = trace.steps[k - 1]
        for send in step.sends:  # from the sender's chunk to the receiver's (another column in an all-to-all)
            ys, yd = n - 1 - send.src + 0.5, n - 1 - send.dst + 0.5
            ax.annotate("", xy=(send.target + 0.75, yd), xytext=(send.chunk + 0.75, ys),
                        arrowprops={"arrowstyle": "->", "color": "black" if send.op == "add" else "gray",
                                    "connectionstyle": "arc3,rad=0.3", "lw": 1.2})
        title = f"{trace.algorithm}, N={n}: step {k} of {len(trace.steps)} ({step.phase}, {len(step.sends)} sends)"
    else:
        title = f"{trace.algorithm}, N={n}: before the first step"
    ax.set_title(title, fontsize=10)
    ax.set_xlim(-1.3, chunks + 0.1)
    ax.set_ylim(-0.1, n + 0.1)
    labels = trace.labels or [f"chunk {c}" for c in range(chunks)]
    ax.set_xticks([c + 0.45 for c in range(chunks)], labels, fontsize=8)
    ax.set_yticks([])
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    return ax


def draw_allreduce_cost(ns: list[int], series: dict[str, list[float]], ylabel: str, ax: Axes | None = None,
                        logy: bool = False) -> Axes:
    """Line chart of an all-reduce cost (bytes or seconds) against the number of devices N."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    for i, (label, values) in enumerate(series.items()):
        ax.plot(ns, values, marker="o", markersize=3, label=label, color=device_color(i))
    ax.set_xlabel("devices N")
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def figure_png(fig: Figure, tight: bool = True) -> bytes:
    """A figure as PNG bytes (what the widgets show), closing it. tight=False renders once: faster."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return buffer.getvalue()


def new_figure(width: float, height: float) -> Figure:
    """A figure outside pyplot's global state: safe to draw from a widget's training thread."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def draw_runs(results: list, axes: tuple) -> None:  # results: mirrored.RunResult
    """Compare training runs: examples per second and test accuracy, one bar per run."""
    labels = [f"{r.replicas}×{r.per_replica}" for r in results]
    colors = [device_color(r.replicas - 1) for r in results]
    speed, accuracy = axes
    speed.bar(range(len(results)), [r.examples_per_second for r in results], color=colors)
    speed.set_ylabel("examples/s", fontsize=8)
    accuracy.bar(range(len(results)), [r.accuracy for r in results], color=colors)
    accuracy.set_ylabel("test accuracy", fontsize=8)
    accuracy.set_ylim(0, 1)
    for ax in axes:
        ax.set_xticks(range(len(results)), labels, fontsize=7)
        ax.set_xlabel("run (replicas × per-replica batch)", fontsize=8)
        ax.tick_params(labelsize=7)


def draw_schedule(events: list, ax: Axes, unit: str = "time slot", title: str = "") -> Axes:
    """Gantt chart of a pipeline schedule: one row per stage, forward (F) and backward (B) boxes.

    Works for the ideal schedule (unit-time slots) and for measured events (seconds).
    """
    from matplotlib.colors import to_rgb

    stages = sorted({e.stage for e in events})
    scale = 1e3 if unit == "ms" else 1.0
    for e in events:
        base = to_rgb(device_color(e.micro_batch))
        color = base if e.phase == "F" else tuple(0.55 + 0.45 * v for v in base)
        ax.barh(e.stage, (e.end - e.start) * scale, left=e.start * scale, color=color, edgecolor="black",
                height=0.8, linewidth=0.5)
        width = (e.end - e.start) * scale
        span = (max(x.end for x in events) - min(x.start for x in events)) * scale
        if width > span / 40:
            ax.text((e.start + (e.end - e.start) / 2) * scale, e.stage, f"{e.phase}{e.micro_batch}", ha="center",
                    va="center", fontsize=7)
    ax.set_yticks(stages, [f"stage {s}" for s in stages], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit, fontsize=8)
    ax.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def draw_in_flight(peaks: dict[str, list[int]], ax: Axes) -> Axes:
    """Bars: for each schedule, the most micro-batches each stage holds in flight (run forward, not yet backward)."""
    width = 0.8 / len(peaks)
    for k, (name, counts) in enumerate(peaks.items()):
        ax.barh([s + (k - (len(peaks) - 1) / 2) * width for s in range(len(counts))], counts, height=width,
                color=device_color(k), label=name)
    stages = range(len(next(iter(peaks.values()))))
    ax.set_yticks(list(stages), [f"stage {s}" for s in stages], fontsize=8)
    ax.invert_yaxis()
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("micro-batches held at once", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_title("activations in flight", fontsize=9)
    ax.legend(fontsize=7)
    return ax


def draw_restart(runs: dict[str, list[int]], checkpoints: list[int], saved: int, ax: Axes) -> Axes:
    """The steps each run of a job finished (one row per run), its checkpoints, and where the restart resumed."""
    last = max(max(steps) for steps in runs.values() if steps)
    for row, steps in enumerate(runs.values()):
        ax.barh([row] * len(steps), [0.9] * len(steps), left=[s - 0.95 for s in steps], height=0.5,
                color=device_color(row), edgecolor="black", linewidth=0.5)
    for step in checkpoints:
        ax.axvline(step, color="black", linestyle=":", linewidth=1)
    ax.axvline(saved, color="tab:red", linewidth=2, label=f"resumed from the checkpoint of step {saved}")
    ax.set_yticks(range(len(runs)), list(runs), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, last + 0.5)
    ax.set_xticks(range(0, last + 1))
    ax.set_xlabel("training step (dotted: a checkpoint saved after it)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    return ax


def _share_boxes(shares: list[int], height: int) -> str:
    """One flex row of coloured boxes, one per replica, sized by its share of a batch."""
    box = "display:flex;align-items:center;justify-content:center;overflow:hidden;white-space:nowrap"
    cells = "".join(
        f"<div title='replica {i}: {size} examples' style='flex:{size} 0 0;background:{device_color(i)};"
        f"color:white;{box};border-right:1px solid #000'>{f'replica {i} · {size}' if size else ''}</div>"
        for i, size in enumerate(shares))
    return f"<div style='display:flex;height:{height}px;border:1px solid #000;margin:2px 0 8px'>{cells}</div>"


def split_diagram_html(plan) -> str:  # a mirrored.BatchPlan
    """How TensorFlow splits one global batch over the replicas, and one epoch as steps, as light HTML.

    The shares are TensorFlow's (``plan.shares``, from :func:`mgpu_edu.mirrored.replica_shares`);
    a short last batch is drawn with its own split, or struck out when it is dropped. HTML rather
    than a matplotlib figure, so it redraws in a few milliseconds on every slider move.
    """
    shown = min(plan.steps_per_epoch, 60)
    short = plan.last_batch < plan.global_batch and shown == plan.steps_per_epoch
    steps = "".join("<div style='flex:1 0 0;margin-right:2px;background:#bbb'></div>" for _ in range(shown - short))
    if short:
        frac = plan.last_batch / plan.global_batch
        steps += (f"<div style='flex:1 0 0;display:flex'><div style='flex:{frac:.3f} 0 0;background:#DD8452'>"
                  f"</div><div style='flex:{1 - frac:.3f} 0 0'></div></div>")
    if plan.dropped and shown == plan.steps_per_epoch:
        frac = plan.dropped / plan.global_batch
        steps += (f"<div title='dropped' style='flex:1 0 0;display:flex'><div style='flex:{frac:.3f} 0 0;"
                  "background:repeating-linear-gradient(45deg,#fff,#fff 2px,#bbb 2px,#bbb 4px)'></div>"
                  f"<div style='flex:{1 - frac:.3f} 0 0'></div></div>")
    more = "" if shown == plan.steps_per_epoch else f" (first {shown} drawn)"
    if plan.dropped:
        last = f"the last {plan.dropped} examples are dropped (hatched):"
    elif short:
        last = f"last batch {plan.last_batch} examples (orange), split {', '.join(map(str, plan.last_shares))}:"
    else:
        last = "every batch is full:"
    return (
        "<div style='font:11px sans-serif;width:440px'>"
        f"<div>TensorFlow splits a global batch of {plan.global_batch} over {plan.replicas} replica(s):</div>"
        f"{_share_boxes(plan.shares, 30)}"
        f"<div>one epoch = {plan.steps_per_epoch} steps{more}; {last}</div>"
        f"<div style='display:flex;height:12px;margin-top:2px'>{steps}</div>"
        + (_share_boxes(plan.last_shares, 16) if short and plan.replicas > 1 else "")
        + "</div>")


def draw_scaling(steps: list, curve: dict, axes: tuple) -> None:  # steps: costmodel.StepTime for 1 … N
    """Compute and exposed all-reduce time per step (bars), and scaling efficiency (line), for 1 … N replicas.

    Example:
        >>> ns = range(1, 5)  # doctest: +SKIP
        >>> draw_scaling([costmodel.step_time(..., n, ...) for n in ns], costmodel.scaling(...), axes)  # doctest: +SKIP
    """
    bars, line = axes
    ns = [s.replicas for s in steps]
    bars.bar(ns, [s.compute_s * 1e3 for s in steps], color=device_color(0), label="compute")
    bars.bar(ns, [(s.comm_s - s.hidden_s) * 1e3 for s in steps], bottom=[s.compute_s * 1e3 for s in steps],
             color=device_color(3), label="all-reduce (not hidden)")
    bars.set_xlabel("replicas", fontsize=8)
    bars.set_ylabel("ms per step", fontsize=8)
    bars.legend(fontsize=7)
    line.plot(ns, curve["efficiency"], marker="o", markersize=3, color=device_color(2))
    line.set_ylim(0, 1.05)
    line.set_xlabel("replicas", fontsize=8)
    line.set_ylabel("scaling efficiency", fontsize=8)
    line.grid(alpha=0.3)


def bytes_text(n: float) -> str:
    """A byte count in the binary unit that reads best: "512 B", "2.15 MiB", "13.4 GiB".

    Example:
        >>> bytes_text(2_254_888), bytes_text(3 * 2**30)
        ('2.15 MiB', '3.00 GiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


MEMORY_PARTS = (("params", "weights"), ("grads", "gradients"), ("optimizer", "optimizer state"),
                ("activations", "activations"))


def memory_unit(nbytes: float) -> tuple[str, int]:
    """The binary unit a memory axis reads best in, for a largest value of nbytes: ("KiB", 1024) for 110 KiB.

    Example:
        >>> memory_unit(112_640), memory_unit(3 * 2**30)
        (('KiB', 1024), ('GiB', 1073741824))
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return unit, scale
    return "B", 1


def draw_memory_bars(bars: list, marks: dict[str, float], ax: Axes) -> Axes:
    """Stacked bars of what each device holds, with a dashed line at each GPU's memory (shared if alike).

    ``bars`` is a list of (label, memory) where memory has params, grads, optimizer and
    activations in bytes (a :class:`mgpu_edu.memory.DeviceMemory`); ``marks`` maps a GPU's
    name to its memory in bytes. The axis's unit follows the tallest bar (:func:`memory_unit`),
    so a 110 KiB model reads in KiB, not as a sliver on a GiB axis; a GPU line far above the bars is
    not drawn but named, with its size, in an "off the scale" note.
    """
    labels = [label for label, _ in bars]
    tallest = max([sum(getattr(memory, field) for field, _ in MEMORY_PARTS) for _, memory in bars] + [0])
    unit, scale = memory_unit(tallest)
    bottom = [0.0] * len(bars)
    for k, (field, name) in enumerate(MEMORY_PARTS):
        values = [getattr(memory, field) / scale for _, memory in bars]
        ax.bar(labels, values, bottom=bottom, color=device_color(k), label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    top = max(bottom + [1e-9])
    lines: list[tuple[float, list[str]]] = []  # marks within 2 % of each other share one line and label
    for name, size in sorted(marks.items(), key=lambda mark: mark[1]):
        if lines and size <= 1.02 * lines[-1][0]:
            lines[-1][1].append(name)
        else:
            lines.append((size, [name]))
    shown, off_scale, last, last_right = [], [], None, False
    for k, (size, names) in enumerate(lines):
        height = size / scale
        if height > 2.2 * top:  # far above the bars: named in a note instead, so the bars stay readable
            far_unit, far_scale = memory_unit(size)
            off_scale.append(f"{', '.join(names)} ({size / far_scale:,.1f} {far_unit})")
            continue
        ax.axhline(height, color="black", linestyle=(0, (4, 2 + k)), linewidth=0.8)
        shown.append(height)
        close = last is not None and height - last < 0.06 * max(2.2 * top, height)
        # labels sit inside the axes (axes fraction): at the right edge, or, for a line close to the one
        # below it, at the left edge (beside the bars' legend side, so the two labels don't overlap)
        right = not close or not last_right
        ax.text(0.99 if right else 0.01, height, (", ".join(names) + " ") if right else (" " + ", ".join(names)),
                transform=ax.get_yaxis_transform(), ha="right" if right else "left", va="bottom", fontsize=7)
        last, last_right = height, right
    ax.set_ylim(0, max(shown + [top]) * 1.3)  # headroom: the legend and the labels don't cover a bar
    if off_scale:
        ax.text(0.99, 0.98, "off the scale: " + "; ".join(off_scale), transform=ax.transAxes, ha="right",
                va="top", fontsize=7)
    ax.set_ylabel(f"{unit} per device", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="upper left")
    return ax


def draw_zero_layout(stage: int, n: int, ax: Axes) -> Axes:
    """Who holds which shard under ZeRO ``stage``: a row per device, boxes for shards of weights, gradients, state.

    A filled box is a shard the device keeps between steps (coloured by the device that owns
    it); an empty box is one it doesn't keep.
    """
    from matplotlib.patches import Rectangle

    kept = {"weights": stage < 3, "gradients": stage < 2, "optimizer state": stage < 1}
    for d in range(n):
        for k, everything in enumerate(kept.values()):
            for j in range(n):
                x = k * (n + 1) + j
                held = everything or j == d
                ax.add_patch(Rectangle((x, n - 1 - d), 0.9, 0.8, facecolor=device_color(j) if held else "white",
                                       edgecolor="black" if held else "#999", linestyle="-" if held else ":"))
        ax.text(-0.3, n - 1 - d + 0.4, f"device {d}", ha="right", va="center", fontsize=8)
    for k, part in enumerate(kept):
        ax.text(k * (n + 1) + n / 2, n + 0.1, part, ha="center", fontsize=8)
    ax.set_xlim(-2.4, 3 * (n + 1))
    ax.set_ylim(-0.2, n + 0.6)
    ax.set_title(f"ZeRO stage {stage}" + (" (plain data parallelism)" if stage == 0 else ""), fontsize=9)
    ax.axis("off")
    return ax


def draw_step_memory(readings: dict, ax: Axes, title: str = "") -> Axes:  # readings: name -> tradeoffs.StepMemory
    """Lines: bytes held at each layer boundary of one training step (forward, rebuilt, backward); dashes: each peak."""
    markers = {"forward": "o", "recompute": "^", "backward": "s"}
    for k, (name, memory) in enumerate(readings.items()):
        color = device_color(k)
        held = [nbytes / 2**20 for _, _, nbytes in memory.timeline]
        ax.plot(range(len(held)), held, color=color, linewidth=1.2,
                label=f"{name} (peak {memory.peak / 2**20:.1f} MiB)")
        for phase, marker in markers.items():
            points = [(i, v) for i, ((p, _, _), v) in enumerate(zip(memory.timeline, held, strict=True)) if p == phase]
            if points:
                ax.plot(*zip(*points, strict=True), marker, color=color, markersize=3.5,
                        label=phase if k == len(readings) - 1 else None, markerfacecolor="white" if
                        phase == "recompute" else color)
        ax.axhline(memory.peak / 2**20, color=color, linestyle="--", linewidth=0.8)
    ax.set_xlabel("reading, at each layer boundary in the order the step ran", fontsize=8)
    ax.set_ylabel("MiB held (above the weights)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return ax


def draw_tensor_parallel_block(t: int, heads: int = 4, sequence_parallel: bool = False,
                               ax: Axes | None = None) -> Axes:
    """Who holds what in one transformer block split over t devices (:mod:`mgpu_edu.tensor`), left to right.

    One row per device: the activations it holds (the whole sequence, or its chunk with sequence
    parallelism), its heads of attention and its slice of the MLP; grey bars are the collectives
    between the regions, forward above and backward below.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    if heads % t:
        raise ValueError(f"heads={heads} doesn't divide by t={t}: each device takes whole heads.")
    per = heads // t
    enter = ("all-gather", "reduce-scatter") if sequence_parallel else ("f: copy", "all-reduce")
    leave = ("reduce-scatter", "all-gather") if sequence_parallel else ("g: all-reduce", "copy")
    columns = [("x", None), ("LayerNorm", None), ("enter", enter), ("attention", None), ("wo", None),
               ("leave", leave), ("+x, LayerNorm", None), ("enter", enter), ("MLP w1", None), ("w2", None),
               ("leave", leave)]
    if ax is None:
        _, ax = plt.subplots(figsize=(13, 0.7 * t + 1.6))
    for c, (name, comm) in enumerate(columns):
        if comm is not None:
            ax.add_patch(plt.Rectangle((c + 0.25, -0.05), 0.5, t + 0.1, facecolor="0.85", edgecolor="0.5"))
            ax.text(c + 0.5, t + 0.65, comm[0], ha="center", va="bottom", fontsize=7)
            ax.text(c + 0.5, -0.25, f"back: {comm[1]}", ha="center", va="top", fontsize=7, color="0.35")
            continue
        for d in range(t):
            y = t - 1 - d
            if name in ("x", "LayerNorm", "+x, LayerNorm"):
                label, share = (f"seq chunk {d}" if sequence_parallel else "whole seq"), 1 / t if \
                    sequence_parallel else 1.0
            elif name == "attention":
                label = f"head {d}" if per == 1 else f"heads {d * per}–{(d + 1) * per - 1}"
                label += "\nwhole seq" if sequence_parallel else ""
                share = 1 / t
            elif name == "wo":
                label, share = "rows → partial", 1 / t
            elif name == "MLP w1":
                label, share = f"columns {d + 1}/{t}" + ("\nwhole seq" if sequence_parallel else ""), 1 / t
            else:
                label, share = "rows → partial", 1 / t
            base = to_rgb(device_color(d))
            face = tuple(1 - (0.35 + 0.65 * share) * (1 - v) for v in base)
            ax.add_patch(plt.Rectangle((c + 0.05, y + 0.1), 0.9, 0.8, facecolor=face, edgecolor="black"))
            ax.text(c + 0.5, y + 0.5, label, ha="center", va="center", fontsize=7)
        ax.text(c + 0.5, t + 0.25, name, ha="center", va="bottom", fontsize=8, weight="bold")
    for d in range(t):
        ax.text(-0.1, t - 1 - d + 0.5, f"device {d}", ha="right", va="center", fontsize=9, color=device_color(d))
    kind = "tensor + sequence parallelism" if sequence_parallel else "tensor parallelism"
    ax.set_title(f"One transformer block, {kind} over {t} devices", fontsize=10, pad=18)
    ax.set_xlim(-1.2, len(columns))
    ax.set_ylim(-0.8, t + 1.0)
    ax.axis("off")
    return ax


def draw_attention_work(n: int, layout: str = "contiguous", causal: bool = True, ax: Axes | None = None) -> Axes:
    """Which device computes each (query chunk, key chunk) product of ring attention (:mod:`mgpu_edu.context`).

    Rows are query chunks, columns key chunks, in sequence order; a cell is coloured by the device
    that holds its queries, hatched where it is the diagonal (masked inside), and left white where
    causal masking skips it. The legend counts each device's products.
    """
    import matplotlib.pyplot as plt

    from mgpu_edu.parallelism import context

    count = len(context.chunks_of(0, n, layout)) * n
    owner = {c: d for d in range(n) for c in context.chunks_of(d, n, layout)}
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 4.2))
    for q in range(count):
        for k in range(count):
            if causal and k > q:
                continue
            ax.add_patch(plt.Rectangle((k, count - 1 - q), 1, 1, facecolor=device_color(owner[q]), edgecolor="white",
                                       hatch="//" if causal and k == q else None, alpha=0.9))
    work = context.blocks_computed(n, causal, layout)
    for d in range(n):
        ax.plot([], [], "s", color=device_color(d), label=f"device {d}: {work[d]}")
    ax.legend(loc="upper right", fontsize=7, title="products", title_fontsize=7, frameon=False,
              bbox_to_anchor=(1.45, 1.0))
    ax.set_xlim(0, count)
    ax.set_ylim(0, count)
    ax.set_xticks([c + 0.5 for c in range(count)], [str(c) for c in range(count)], fontsize=7)
    ax.set_yticks([count - 0.5 - c for c in range(count)], [str(c) for c in range(count)], fontsize=7)
    ax.set_xlabel("key chunk")
    ax.set_ylabel("query chunk")
    ax.set_aspect("equal")
    ax.set_title(f"{layout}{', causal' if causal else ''}, N={n}: {count} chunks of s/{count}", fontsize=9)
    return ax


def draw_expert_load(wanted: Sequence[float], kept: Sequence[float], capacity: int, ax: Axes | None = None,
                     title: str = "") -> Axes:
    """Token choices each expert was sent (``wanted``) and took (``kept``), against its ``capacity`` (a line)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    experts = range(len(wanted))
    ax.bar(experts, wanted, color="0.85", edgecolor="0.5", label="sent (dropped above the line)")
    ax.bar(experts, kept, color=PALETTE[0], label="kept")
    ax.axhline(capacity, color="black", linestyle="--", linewidth=1)
    ax.text(len(wanted) - 0.5, capacity, f" capacity {capacity}", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(list(experts), [str(e) for e in experts])
    ax.set_xlabel("expert")
    ax.set_ylabel("token choices")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def draw_tensor_layout(axes: dict[str, int], specs: Sequence[str | None], shape: Sequence[int],
                       ax: Axes | None = None, title: str = "") -> Axes:
    """A 2-D tensor on a mesh: each block in the colour of the device holding it, with every holder's number.

    ``axes`` is the mesh (axis name → size), ``specs`` the layout (the mesh axis splitting each dimension,
    or None). Blocks held by several devices (replicated along an axis) list all of them in grey.

    Example:
        >>> ax = draw_tensor_layout({"batch": 2, "model": 4}, ["batch", "model"], [8, 16])  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from mgpu_edu.parallelism.meshes import holders

    if len(shape) != 2:
        raise ValueError(f"draw_tensor_layout draws 2-D tensors; shape {list(shape)} has {len(shape)} dimensions.")
    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 2.6))
    owners = holders(axes, specs, shape)
    rows = max(b[0] for b in owners) + 1
    cols = max(b[1] for b in owners) + 1
    for (r, c), devices in owners.items():
        color = device_color(devices[0]) if len(devices) == 1 else "#d9d9d9"
        ax.add_patch(Rectangle((c / cols, 1 - (r + 1) / rows), 1 / cols, 1 / rows, facecolor=color,
                               edgecolor="white", linewidth=2))
        label = ",".join(str(d) for d in devices)
        ax.text((c + 0.5) / cols, 1 - (r + 0.5) / rows, label, ha="center", va="center", fontsize=8,
                color="white" if len(devices) == 1 else "black", fontweight="bold", wrap=True)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel(f"dim 1 ({shape[1]}): {specs[1] or 'not split'}", fontsize=8)
    ax.set_ylabel(f"dim 0 ({shape[0]}): {specs[0] or 'not split'}", fontsize=8)
    mesh = " × ".join(f"{name}={size}" for name, size in axes.items())
    ax.set_title(title or f"mesh {mesh}", fontsize=9)
    return ax


def draw_grid(data: int, tensor: int, pipeline: int, ax: Axes | None = None) -> Axes:
    """The devices of a data × tensor × pipeline grid: one column per pipeline stage, one row per data replica,
    the tensor ranks side by side; each box shows the device's number (``threed.Grid.device``)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    if ax is None:
        _, ax = plt.subplots(figsize=(2.2 * pipeline * tensor, 1.0 + 0.9 * data))
    for s in range(pipeline):
        for k in range(data):
            for r in range(tensor):
                device = s * data * tensor + k * tensor + r
                x, y = s * (tensor + 0.6) + r, data - 1 - k
                ax.add_patch(FancyBboxPatch((x + 0.05, y + 0.1), 0.9, 0.75, boxstyle="round,pad=0.02",
                                            facecolor=device_color(s), edgecolor="black", alpha=0.85))
                ax.text(x + 0.5, y + 0.47, f"device {device}\nrank {r}", ha="center", va="center", fontsize=8,
                        color="white", fontweight="bold")
        ax.text(s * (tensor + 0.6) + tensor / 2, data + 0.15, f"stage {s}", ha="center", fontsize=9)
    for k in range(data):
        ax.text(-0.15, data - 1 - k + 0.47, f"replica {k}", ha="right", va="center", fontsize=9)
    ax.set_xlim(-1.3, pipeline * (tensor + 0.6))
    ax.set_ylim(0, data + 0.5)
    ax.axis("off")
    return ax


#: How :func:`draw_op_timeline` colours ops: matrix products are compute; an Identity placed on another device is
#: a receive (what :func:`mgpu_edu.collectives.send_receive` runs; between logical CPUs a hand-over, no copy);
#: anything else is other work.
OP_KINDS = {"MatMul": "compute", "BatchMatMulV2": "compute", "Einsum": "compute", "Identity": "receive"}


def draw_op_timeline(spans: Sequence, ax: Axes, title: str = "", kinds: dict[str, str] | None = None) -> Axes:
    """Gantt chart of a traced step's ops (``overlap.op_timeline``): one row per device, each op a box from its
    start to its end (µs), coloured by kind (:data:`OP_KINDS`)."""
    kinds = OP_KINDS if kinds is None else kinds
    colors = {"compute": PALETTE[0], "receive": PALETTE[1], "other": "#cccccc"}
    devices = sorted({s.device for s in spans})
    for s in spans:
        kind = kinds.get(s.op, "other")
        ax.barh(devices.index(s.device), max((s.end - s.start) * 1e6, 0.5), left=s.start * 1e6, height=0.7,
                color=colors.get(kind, colors["other"]), edgecolor="black", linewidth=0.3)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=k) for k, c in colors.items()], fontsize=7, loc="upper right")
    ax.set_yticks(range(len(devices)), devices, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("µs since the first op started", fontsize=8)
    ax.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def draw_roofline(devices: dict, axis: str, ax: Axes, n: int = 8, marks: dict[str, float] | None = None,
                  inside: bool = True) -> Axes:
    """For each device (``roofline.DEVICES``), the ratio of communication time to the compute it can hide behind,
    against tokens per device (data, FSDP) or the MLP width (tensor), by lesson 03's α-β model: above 1 the
    axis is communication-bound. ``marks`` places runs (label → tokens or width) on the chart."""
    import numpy as np

    from mgpu_edu.analysis import roofline

    sizes = np.logspace(1, 6, 120)
    for i, (name, device) in enumerate(devices.items()):
        ratios = []
        for size in sizes:
            if axis == "tensor":
                compute, comm = roofline.axis_seconds(axis, device, n, 2048, 4096, size, inside)
            else:
                compute, comm = roofline.axis_seconds(axis, device, n, size, 4096, 16384, inside)
            ratios.append(comm / compute)
        ax.loglog(sizes, ratios, color=device_color(i), label=name)
    ax.axhline(1, color="black", linewidth=0.8, linestyle="--")
    for label, size in (marks or {}).items():
        ax.axvline(size, color="grey", linewidth=0.8, linestyle=":")
        ax.text(size, ax.get_ylim()[1], f" {label}", rotation=90, va="top", fontsize=7)
    what = f"MLP width F (tensor degree {n})" if axis == "tensor" else f"tokens per device ({n} devices)"
    ax.set_xlabel(what, fontsize=8)
    ax.set_ylabel("communication ÷ compute", fontsize=8)
    ax.set_title(f"{axis}: communication-bound above the dashed line", fontsize=9)
    ax.legend(fontsize=7)
    ax.tick_params(labelsize=7)
    return ax
