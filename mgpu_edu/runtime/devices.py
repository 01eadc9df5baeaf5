"""Set up and describe logical devices, so every lesson has several devices to use.

TensorFlow can split one physical device into several *logical* devices. On a GPU each
logical GPU gets a memory limit; on a CPU the logical CPUs share the cores and TensorFlow
refuses memory limits. Either way the lessons get N device names to place work on and to
hand to ``tf.distribute``: the same code paths as N real GPUs, without their speed.

TensorFlow fixes its devices the first time it uses them, once per process. So
:func:`setup_devices` must run before any other TensorFlow code, and changing the layout
afterwards needs a kernel restart. It says so instead of letting TensorFlow's bare
``RuntimeError`` through.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Iterator
from typing import Any

from mgpu_edu._validate import BadArgument, whole_number
from mgpu_edu.runtime import env as _env
from mgpu_edu.runtime import quiet

#: The most logical devices setup_devices will make (enough for any lesson).
MAX_DEVICES = 64
#: Share of a GPU's memory the default limits hand out; the rest stays free for the CUDA
#: context and other processes.
USABLE_FRACTION = 0.8
#: Default limits are rounded down to a multiple of this many MB.
ROUND_MB = 256
#: Per-device limit used when the GPU's memory can't be read.
FALLBACK_LIMIT_MB = 1024

def restart_hint(call: str) -> str:
    """What to do when TensorFlow's devices are already fixed: restart, then call first."""
    return (
        "Restart the kernel (Colab: Runtime → Restart session; JupyterLab: Kernel → Restart Kernel) "
        f"and run {call} first, before any other TensorFlow code."
    )


class DeviceSetupError(RuntimeError):
    """TensorFlow's devices are already fixed in this process and can't take the new layout."""


@dataclasses.dataclass(frozen=True)
class DeviceLayout:
    """The devices :func:`setup_devices` made: what a lesson places work on.

    Iterating gives the logical device names, so ``MirroredStrategy(list(layout))`` and
    ``tf.device(layout[1])`` work.

    Example:
        >>> layout = setup_devices(2)  # doctest: +SKIP
        No GPU → 2 logical CPUs: same code paths, no real speed-up
        >>> list(layout)  # doctest: +SKIP
        ['/device:CPU:0', '/device:CPU:1']
    """

    kind: str
    mode: str
    physical: tuple[str, ...]
    hardware: str
    logical: tuple[str, ...]
    memory_limits_mb: tuple[int | None, ...]
    environment: _env.Environment
    notes: tuple[str, ...] = ()
    tf32: bool | None = None  # TF32 for float32 products, on GPUs that have it (A100, H100, ...); None elsewhere

    def __len__(self) -> int:
        return len(self.logical)

    def __iter__(self) -> Iterator[str]:
        return iter(self.logical)

    def __getitem__(self, index: int) -> str:
        return self.logical[index]

    @property
    def summary(self) -> str:
        """What was made, in a few words: "4 logical GPUs × 3,072 MB"."""
        count = len(self.logical)
        plural = "s" if count != 1 else ""
        if self.mode == "physical":
            return f"{count} physical GPU{plural}, used as they are"
        text = f"{count} logical {self.kind}{plural}"
        limits = set(self.memory_limits_mb)
        if self.kind == "GPU" and len(limits) == 1 and None not in limits:
            text += f" × {limits.pop():,} MB"
        return text

    @property
    def banner(self) -> str:
        """One line: where we are and what was made."""
        line = f"{self.environment.label} · {self.hardware} → {self.summary}"
        if self.kind == "CPU":
            line += ": same code paths, no real speed-up"
        notes = list(self.notes)
        if self.tf32 is not None:
            notes.append("(TF32 on: float32 products round inputs to TF32.)" if self.tf32 else
                         "(TF32 off, so split models can equal one device to float32 rounding; lesson 08.)")
        return " ".join([line, *notes])

    def _rows(self) -> list[tuple[str, str, str, str]]:
        rows = []
        for i, name in enumerate(self.logical):
            physical = self.physical[0] if self.mode == "split" else self.physical[i]
            limit = self.memory_limits_mb[i]
            if limit is not None:
                memory = f"{limit:,} MB"
            elif self.kind == "CPU":
                memory = "shared (no limits on CPUs)"
            else:
                memory = "whole GPU"
            rows.append((str(i), name, physical, memory))
        return rows

    def __repr__(self) -> str:
        header = ("#", "logical device", "physical device", "memory")
        rows = [header, *self._rows()]
        widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
        lines = [self.banner]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        cells = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self._rows()
        )
        return (
            f"<div class='mgpu-layout'><p><b>{html.escape(self.banner)}</b></p>"
            "<table><thead><tr><th>#</th><th>logical device</th><th>physical device</th>"
            f"<th>memory</th></tr></thead><tbody>{cells}</tbody></table></div>"
        )


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The layout a request asks for, before TensorFlow is touched."""

    kind: str
    mode: str
    count: int
    memory_limits_mb: tuple[int | None, ...]
    physical: tuple[Any, ...]
    hardware: str
    notes: tuple[str, ...]

    def describe(self) -> str:
        plural = "s" if self.count != 1 else ""
        if self.mode == "physical":
            return f"{self.count} physical GPU{plural}"
        limit = self.memory_limits_mb[0]
        extra = f" × {limit:,} MB" if limit is not None else ""
        return f"{self.count} logical {self.kind}{plural}{extra}"


_ACTIVE: DeviceLayout | None = None
_ACTIVE_CALL: str = ""


def _call_text(n: object, memory_limit_mb: object, prefer_physical: object, tf32: object = False) -> str:
    args = [repr(n)]
    if memory_limit_mb is not None:
        args.append(f"memory_limit_mb={memory_limit_mb!r}")
    if prefer_physical is not True:
        args.append(f"prefer_physical={prefer_physical!r}")
    if tf32 is not False:
        args.append(f"tf32={tf32!r}")
    return f"setup_devices({', '.join(args)})"


def _validate(n: object, memory_limit_mb: object, prefer_physical: object, call: str, tf32: object = False) -> None:
    whole_number("n", n, maximum=MAX_DEVICES, where=call, hint="n is how many devices to make. Try setup_devices(4).")
    if memory_limit_mb is not None:
        whole_number("memory_limit_mb", memory_limit_mb, example=1024, where=call,
                     hint="It is megabytes per logical GPU; leave it out to pick a limit from the GPU's memory.")
    if not isinstance(prefer_physical, bool):
        raise BadArgument(f"{call}: prefer_physical must be True or False, got {prefer_physical!r}.")
    if not isinstance(tf32, bool):
        raise BadArgument(f"{call}: tf32 must be True or False, got {tf32!r}. Leave it out (False) for float32 "
                          "products at full float32 precision, or pass tf32=True to let A100/H100-class GPUs round "
                          f"their inputs to TF32, e.g. setup_devices({n!r}, tf32=True).")


def default_memory_limit_mb(total_mb: int, n: int) -> int:
    """The memory limit for each of n logical GPUs carved from a GPU of total_mb.

    It hands out 80 % of the card, rounded down to a multiple of 256 MB where that leaves
    something. Works without a GPU: it is arithmetic only.

    Example:
        >>> default_memory_limit_mb(15360, 4)  # a Colab T4 split four ways
        3072
    """
    share = int(total_mb * USABLE_FRACTION) // n
    rounded = share // ROUND_MB * ROUND_MB
    return rounded if rounded > 0 else share


def _gpu_memory_mb(environment: _env.Environment, name: str | None) -> int | None:
    for gpu in environment.gpus:
        if name is None or gpu.name == name:
            return gpu.memory_mb
    return environment.gpus[0].memory_mb if environment.gpus else None


def _plan(tf: Any, n: int, memory_limit_mb: int | None, prefer_physical: bool, call: str) -> _Plan:
    environment = _env.detect_environment()
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        notes = ()
        if memory_limit_mb is not None:
            notes = (f"(memory_limit_mb={memory_limit_mb:,} not applied: "
                     "TensorFlow has no memory limits for logical CPUs.)",)
        cpus = tf.config.list_physical_devices("CPU")
        return _Plan("CPU", "split", n, (None,) * n, tuple(cpus[:1]), "No GPU", notes)

    details = tf.config.experimental.get_device_details(gpus[0]) or {}
    name = details.get("device_name")
    hardware = f"{len(gpus)} × {name or 'GPU'}"
    if len(gpus) >= n and prefer_physical and memory_limit_mb is None:
        return _Plan("GPU", "physical", n, (None,) * n, tuple(gpus[:n]), hardware, ())

    total = _gpu_memory_mb(environment, name)
    notes: tuple[str, ...] = ()
    if len(gpus) > 1:
        notes = ("(GPU 0 only: the other GPUs are hidden.)",)
    if memory_limit_mb is None:
        if total is None:
            limit = FALLBACK_LIMIT_MB
            notes += (f"(GPU memory unknown: {FALLBACK_LIMIT_MB:,} MB each by default.)",)
        else:
            limit = default_memory_limit_mb(total, n)
            if limit < 1:
                raise ValueError(
                    f"{call}: GPU 0 ({name}) has {total:,} MB, too little to split into {n} "
                    f"logical GPUs. Ask for fewer, e.g. setup_devices({max(1, n // 4)})."
                )
    else:
        limit = memory_limit_mb
        if total is not None and n * limit > total:
            raise ValueError(
                f"{call} asks for {n} × {limit:,} MB = {n * limit:,} MB, but GPU 0 ({name}) has "
                f"{total:,} MB. Use at most {total // n:,} MB per device, or leave memory_limit_mb "
                f"out for a safe default ({default_memory_limit_mb(total, n):,} MB)."
            )
    return _Plan("GPU", "split", n, (limit,) * n, tuple(gpus[:1]), hardware, notes)


def _current_description(tf: Any) -> str:
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return f"{len(gpus)} logical GPU{'s' if len(gpus) != 1 else ''}"
    cpus = tf.config.list_logical_devices("CPU")
    return f"{len(cpus)} logical CPU{'s' if len(cpus) != 1 else ''}"


def _apply(tf: Any, plan: _Plan) -> None:
    config = tf.config
    if plan.kind == "CPU":
        if plan.count > 1:
            config.set_logical_device_configuration(
                plan.physical[0], [config.LogicalDeviceConfiguration() for _ in range(plan.count)]
            )
        return
    all_gpus = config.list_physical_devices("GPU")
    if plan.mode == "physical":
        if len(all_gpus) > plan.count:
            config.set_visible_devices(list(plan.physical), "GPU")
        return
    if len(all_gpus) > 1:
        config.set_visible_devices([plan.physical[0]], "GPU")
    config.set_logical_device_configuration(
        plan.physical[0],
        [config.LogicalDeviceConfiguration(memory_limit=limit) for limit in plan.memory_limits_mb],
    )


def _layout(tf: Any, plan: _Plan) -> DeviceLayout:
    names = tuple(d.name for d in tf.config.list_logical_devices(plan.kind))
    return DeviceLayout(
        kind=plan.kind,
        mode=plan.mode,
        physical=tuple(p.name for p in plan.physical),
        hardware=plan.hardware,
        logical=names[: plan.count],
        memory_limits_mb=plan.memory_limits_mb,
        environment=_env.detect_environment(),
        notes=plan.notes,
    )


def _has_tf32(tf: Any, kind: str) -> bool:
    """Whether GPU 0 can run TF32 (compute capability 8.0 and up: A100, H100, ...)."""
    if kind != "GPU":
        return False
    try:
        details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]) or {}
    except (IndexError, RuntimeError, ValueError):
        return False
    capability = details.get("compute_capability")
    return capability is not None and tuple(capability) >= (8, 0)


def _with_tf32(tf: Any, layout: DeviceLayout, tf32: bool) -> DeviceLayout:
    """Set TensorFlow's TF32 switch to tf32 and note it in the layout where the GPU has TF32."""
    tf.config.experimental.enable_tensor_float_32_execution(tf32)
    noted = tf32 if _has_tf32(tf, layout.kind) else None
    return layout if layout.tf32 == noted else dataclasses.replace(layout, tf32=noted)


def setup_devices(n: int = 4, memory_limit_mb: int | None = None, *, prefer_physical: bool = True,
                  tf32: bool = False, verbose: bool = True) -> DeviceLayout:
    """Make n devices for the lesson, print a one-line banner, and return the layout.

    - One physical GPU (or fewer than n): GPU 0 becomes n logical GPUs, each with
      memory_limit_mb (default: 80 % of the card shared out, e.g. 3,072 MB each on a T4).
    - At least n physical GPUs: the first n are used as they are. Pass
      prefer_physical=False (or a memory_limit_mb) to split GPU 0 instead.
    - No GPU: the CPU becomes n logical CPUs. They share the cores, so they run the same
      code paths as GPUs but give no real speed-up; memory_limit_mb is noted, not applied.
    - TF32: TensorFlow's default lets A100/H100-class GPUs run float32 matrix products and
      convolutions in TF32 (inputs rounded to 10 mantissa bits). The lessons check split models
      against one device to float32 rounding, so ``tf32=False`` (the default) turns it off; the
      banner says so on GPUs that have TF32. ``tf32=True`` turns it back on (TensorFlow's default).
      Every call sets the switch, the same call again included.

    Call it before any other TensorFlow code. The same call again returns the same layout;
    a different layout afterwards raises DeviceSetupError, which says how to restart.

    Example:
        >>> layout = setup_devices(4)  # doctest: +SKIP
        Local · No GPU → 4 logical CPUs: same code paths, no real speed-up
        >>> layout[2]  # doctest: +SKIP
        '/device:CPU:2'
    """
    global _ACTIVE, _ACTIVE_CALL
    call = _call_text(n, memory_limit_mb, prefer_physical, tf32)
    _validate(n, memory_limit_mb, prefer_physical, call, tf32)
    tf = quiet.import_tensorflow()
    if _ACTIVE is not None and call == _ACTIVE_CALL:
        _ACTIVE = _with_tf32(tf, _ACTIVE, tf32)  # the same call sets TF32 again (it may have been switched since)
        if verbose:
            print(_ACTIVE.banner)
        return _ACTIVE

    plan = _plan(tf, n, memory_limit_mb, prefer_physical, call)
    if _ACTIVE is not None:
        same = (_ACTIVE.kind, _ACTIVE.mode, len(_ACTIVE), _ACTIVE.memory_limits_mb) == (
            plan.kind, plan.mode, plan.count, plan.memory_limits_mb)
        if not same:
            raise DeviceSetupError(
                f"{call} can't change devices after TensorFlow started using them: this kernel "
                f"already has {_ACTIVE.summary} (from {_ACTIVE_CALL}), and {call} asks for "
                f"{plan.describe()}. {restart_hint(call)}"
            )
        _ACTIVE, _ACTIVE_CALL = _with_tf32(tf, _ACTIVE, tf32), call  # the same devices; TF32 as this call asks
        if verbose:
            print(_ACTIVE.banner)
        return _ACTIVE

    try:
        _apply(tf, plan)
    except RuntimeError as error:
        if "initialized" not in str(error):
            raise
        raise DeviceSetupError(
            f"{call} can't change devices after TensorFlow started using them: this kernel already "
            f"has {_current_description(tf)}, and {call} asks for {plan.describe()}. {restart_hint(call)}"
        ) from None
    layout = _layout(tf, plan)
    if len(layout.logical) != plan.count:  # TensorFlow kept an earlier layout of this process
        raise DeviceSetupError(
            f"{call} asks for {plan.describe()}, but TensorFlow already fixed this kernel's devices "
            f"at {_current_description(tf)}. {restart_hint(call)}"
        )
    _ACTIVE, _ACTIVE_CALL = _with_tf32(tf, layout, tf32), call
    if verbose:
        print(_ACTIVE.banner)
    return _ACTIVE


def logical_devices(k: int | None = None) -> list[str]:
    """Names of the first k logical devices of the active kind (all of them when k is None).

    The names suit ``tf.device`` and ``tf.distribute.MirroredStrategy(devices=...)``.
    Without setup_devices, it lists TensorFlow's default devices (GPUs if any, else CPUs),
    which fixes them for this process.

    Example:
        >>> logical_devices(2)  # doctest: +SKIP
        ['/device:CPU:0', '/device:CPU:1']
    """
    if _ACTIVE is not None:
        names, made_by = list(_ACTIVE.logical), f"made by {_ACTIVE_CALL}"
        kind = _ACTIVE.kind
    else:
        tf = quiet.import_tensorflow()
        kind = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
        names = [d.name for d in tf.config.list_logical_devices(kind)]
        made_by = "TensorFlow's default; setup_devices was not called"
    if k is None:
        return names
    whole_number("k", k, maximum=len(names), where=f"logical_devices(k={k!r})",
                 hint=f"This kernel has {len(names)} logical {kind}s ({made_by}). Ask for at most {len(names)}, "
                 f"or restart the kernel and call setup_devices({k}) first.")
    return names[:k]
