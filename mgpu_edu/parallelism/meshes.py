"""One mesh for every strategy: DTensor layouts, and the collectives TensorFlow inserts for them.

Lessons 02–14 send every byte by hand. DTensor (``tf.experimental.dtensor``) turns that around: you
put the devices on a *mesh* with named axes (``batch=2, model=4``), say for each tensor which of its
dimensions is split along which axis (a *layout*), and write the program as if it ran on one device.
When a function runs, DTensor's compiler (MLIR passes in TensorFlow's C++) propagates layouts to every
op, expands the program to one device's share (SPMD expansion), and inserts the collectives that make
the shares agree. This module makes meshes and layouts with short calls and reads back which
collectives were inserted, from the program TensorFlow compiled.

Reading the compiled program needs :func:`record_collectives` before TensorFlow starts: it asks
DTensor to write each compiled function to a folder (the ``TF_DUMP_GRAPH_PREFIX`` and
``TF_CPP_VMODULE`` settings of TensorFlow's bridge logger), keeping two passes: the SPMD expansion
(DTensor's own, logical collectives such as ``DTensorAllGather``) and the cluster outlining after the
collectives are lowered (the TensorFlow ops that run, such as ``CollectiveReduceV2``).

DTensor is experimental: its API can change between TensorFlow releases without the usual
compatibility promise. It runs on CPUs, GPUs and TPUs. Keras 3's ``keras.distribution`` is documented for
the JAX backend; its TensorFlow prototype (built on DTensor) is unfinished and splits nothing (lesson 15).
Reading the dumped programs was checked on TensorFlow 2.20 and 2.21.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mgpu_edu._validate import BadArgument, whole_number
from mgpu_edu.parallelism import collectives
from mgpu_edu.runtime import quiet

#: The pass after which DTensor's logical collectives stand in the program, and the one after which
#: the physical ones do (every collective lowered, the program cut into per-mesh functions).
LOGICAL_PASS, PHYSICAL_PASS = "DTensorSPMDExpansion", "ClusterOutliningPass"
_FOLDER_VARIABLE = "MGPU_EDU_DTENSOR_DUMPS"

#: Each physical collective, the lesson-12 collective whose ring formula gives the bytes a device sends,
#: and whether that formula's S is the op's input (True) or its output (False, the gathered result).
PHYSICAL = {
    "CollectiveReduceV2": ("all_reduce", True),
    "CollectiveGatherV2": ("all_gather", False),
    "CollectiveAllToAllV2": ("all_to_all", True),
    "CollectiveReduceScatterV2": ("reduce_scatter", True),
}
#: DTensor's own collectives, as SPMD expansion writes them before they are lowered to TensorFlow ops.
LOGICAL = ("DTensorAllReduce", "DTensorAllGather", "DTensorAllScatter", "DTensorAllToAll", "DTensorReduceScatter",
           "DTensorSend", "DTensorRecv")
_ITEMSIZE = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
             "ui8": 1, "ui16": 2, "ui32": 4, "ui64": 8}


def record_collectives(folder: str | os.PathLike[str] | None = None) -> Path:
    """Ask DTensor to write each function it compiles to ``folder`` (if None, a temporary one removed at exit).

    Call it before TensorFlow starts (before ``setup_devices``): TensorFlow reads these settings once.
    It changes nothing DTensor computes; it only writes text files (a few KB to a few hundred KB per
    compiled function, two per function).
    Works the same with or without a GPU.

    Example:
        >>> from mgpu_edu import meshes
        >>> folder = meshes.record_collectives()  # doctest: +SKIP
    """
    if "tensorflow" in sys.modules and not os.environ.get(_FOLDER_VARIABLE):
        raise RuntimeError("record_collectives() must run before TensorFlow starts, and TensorFlow is already "
                           "imported. Restart the kernel (Colab: Runtime → Restart session) and call it first, "
                           "before setup_devices.")
    if folder is None:  # a temporary folder, removed when Python exits
        path = Path(tempfile.mkdtemp(prefix="mgpu-edu-dtensor-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    else:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
    os.environ["TF_DUMP_GRAPH_PREFIX"] = str(path)
    modules = [m for m in os.environ.get("TF_CPP_VMODULE", "").split(",") if m and
               not m.startswith("dtensor_mlir_passes=")]
    os.environ["TF_CPP_VMODULE"] = ",".join([*modules, "dtensor_mlir_passes=1"])
    os.environ["MLIR_BRIDGE_LOG_PASS_FILTER"] = f"{LOGICAL_PASS};{PHYSICAL_PASS}"
    os.environ[_FOLDER_VARIABLE] = str(path)
    return path


def _folder() -> Path:
    folder = os.environ.get(_FOLDER_VARIABLE)
    if not folder:
        raise RuntimeError("DTensor isn't writing its compiled programs. Restart the kernel and call "
                           "meshes.record_collectives() first, before setup_devices.")
    return Path(folder)


def make_mesh(axes: dict[str, int], devices: Sequence[str] | None = None) -> Any:
    """A DTensor mesh: ``axes`` maps each axis name to its size; their product must be the device count.

    ``devices`` defaults to the logical devices of ``setup_devices`` (CPUs, or GPUs where there is one).

    Example:
        >>> mesh = make_mesh({"batch": 2, "model": 4})  # doctest: +SKIP
        >>> mesh.shape()  # doctest: +SKIP
        [2, 4]
    """
    from mgpu_edu.runtime import devices as _devices

    if not isinstance(axes, dict) or not axes:
        raise BadArgument(f"axes={axes!r} must be a dict of axis name → size, e.g. {{'batch': 2, 'model': 4}}.")
    for name, size in axes.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise BadArgument(f"axis name {name!r} must be a short word such as 'batch' or 'model'.")
        whole_number(f"axes[{name!r}]", size, minimum=1, maximum=1024, hint="It is how many devices lie along it.")
    names = list(devices) if devices is not None else _devices.logical_devices()
    total = 1
    for size in axes.values():
        total *= size
    if total != len(names):
        shape = " × ".join(f"{n}={s}" for n, s in axes.items())
        raise BadArgument(f"axes={axes!r} make a mesh of {total} devices ({shape}), but {len(names)} devices were "
                          f"given. Choose sizes whose product is {len(names)}, or pass that many devices.")
    quiet.import_tensorflow()
    from tensorflow.experimental import dtensor

    return dtensor.create_mesh(list(axes.items()), devices=names)


def layout(mesh: Any, *axes: str | None) -> Any:
    """A layout: for each dimension of the tensor, the mesh axis it is split along, or None (not split).

    Example:
        >>> layout(mesh, "batch", None)  # doctest: +SKIP
        Layout.from_string(sharding_specs:batch,unsharded, ...)
    """
    from tensorflow.experimental import dtensor

    names = mesh.dim_names
    used = [a for a in axes if a is not None]
    for axis in used:
        if axis not in names:
            raise BadArgument(f"axis {axis!r} is not on this mesh, whose axes are {list(names)}: use one of those, "
                              f"or None for a dimension that isn't split.")
    if len(set(used)) != len(used):
        raise BadArgument(f"layout{axes!r} splits two dimensions along the same mesh axis; one axis can split "
                          f"only one dimension of a tensor.")
    return dtensor.Layout([dtensor.UNSHARDED if a is None else a for a in axes], mesh)


def holders(axes: dict[str, int], specs: Sequence[str | None],
            shape: Sequence[int]) -> dict[tuple[int, ...], list[int]]:
    """Which devices hold each block of a tensor: block index (one per dimension) → device numbers.

    Plain arithmetic, no TensorFlow: devices are numbered in row-major order over the mesh axes (as
    ``make_mesh`` lays them out), dimension i is cut into as many blocks as its axis has devices, and a
    device holds the block at its own coordinates along the axes that cut the tensor; along the other
    axes every device holds a copy.

    Example:
        >>> holders({"batch": 2, "model": 2}, ["batch", None], [4, 6])
        {(0, 0): [0, 1], (1, 0): [2, 3]}
    """
    names = list(axes)
    for axis in specs:
        if axis is not None and axis not in axes:
            raise BadArgument(f"axis {axis!r} is not on this mesh, whose axes are {names}.")
    if len(specs) != len(shape):
        raise BadArgument(f"specs {list(specs)} give {len(specs)} dimensions but shape {list(shape)} has {len(shape)}.")
    sizes = list(axes.values())
    total = 1
    for size in sizes:
        total *= size
    blocks: dict[tuple[int, ...], list[int]] = {}
    for device in range(total):
        coords, rest = [], device
        for size in reversed(sizes):
            coords.append(rest % size)
            rest //= size
        where = dict(zip(names, reversed(coords), strict=True))
        block = tuple(0 if axis is None else where[axis] for axis in specs)
        blocks.setdefault(block, []).append(device)
    return dict(sorted(blocks.items()))


def put(value: Any, where: Any) -> Any:
    """``value`` (NumPy or a tensor) as a DTensor with layout ``where``: each device keeps only its share.

    Example:
        >>> x = put(np.ones((8, 4), "float32"), layout(mesh, "batch", None))  # doctest: +SKIP
    """
    tf = quiet.import_tensorflow()
    from tensorflow.experimental import dtensor

    tensor = tf.convert_to_tensor(value)
    if tensor.shape.rank != where.rank:
        raise BadArgument(f"a tensor of shape {tensor.shape.as_list()} needs a layout of rank {tensor.shape.rank}; "
                          f"this one has rank {where.rank} ({where.sharding_specs}).")
    for size, parts in zip(tensor.shape.as_list(), [where.num_shards(i) for i in range(where.rank)], strict=True):
        if size % parts:
            raise BadArgument(f"shape {tensor.shape.as_list()} can't be split by layout {where.sharding_specs}: "
                              f"{size} doesn't divide into {parts} equal parts. Use sizes that divide evenly.")
    replicated = dtensor.copy_to_mesh(tensor, dtensor.Layout.replicated(where.mesh, tensor.shape.rank))
    return dtensor.relayout(replicated, where)


def shards(x: Any) -> list[Any]:
    """Each device's share of DTensor ``x``, as NumPy arrays in mesh order (device 0 first)."""
    from tensorflow.experimental import dtensor

    return [part.numpy() for part in dtensor.unpack(x)]


def whole(x: Any) -> Any:
    """DTensor ``x`` gathered into one NumPy array (a replicated copy, read from device 0)."""
    from tensorflow.experimental import dtensor

    spec = dtensor.fetch_layout(x)
    return dtensor.unpack(dtensor.relayout(x, dtensor.Layout.replicated(spec.mesh, spec.rank)))[0].numpy()


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective in a compiled program: its op, the tensor each device puts in, and its group size."""

    op: str
    shape: tuple[int, ...]
    dtype: str
    group: int | None

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor each device puts in."""
        count = 1
        for size in self.shape:
            count *= size
        return count * _ITEMSIZE.get(self.dtype, 4)

    @property
    def sent(self) -> float | None:
        """Bytes each device sends, by lesson 12's ring formula for this collective (None if it has none)."""
        if self.op not in PHYSICAL or not self.group:
            return None
        name, from_input = PHYSICAL[self.op]
        size = self.nbytes if from_input else self.nbytes * self.group
        return collectives.formula_bytes(name, self.group, size)[0][0]


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What DTensor inserted into one compiled function: its logical and its physical collectives."""

    name: str
    logical: list[Collective]
    physical: list[Collective]
    result: Any = dataclasses.field(repr=False, default=None)
    #: the ``tf.function`` that was compiled: call it again with arguments of the same shapes and layouts
    #: and DTensor reuses the program
    function: Any = dataclasses.field(repr=False, default=None)

    @property
    def sent(self) -> float:
        """Bytes each device sends, by lesson 12's ring formulas, summed over the physical collectives in the
        program. Each collective counts once as written: one inside a loop would run once per iteration."""
        return sum(c.sent or 0.0 for c in self.physical)

    def table(self) -> str:
        """The collectives, one per line: op, tensor per device, group, bytes sent per device."""
        lines = [f"{self.name}: logical {[c.op for c in self.logical] or 'none'}"]
        for c in self.physical:
            sent = "" if c.sent is None else f", sends {c.sent:,.0f} B per device"
            lines.append(f"  {c.op}: {c.dtype}{list(c.shape)} ({c.nbytes:,} B) in groups of {c.group}{sent}")
        if not self.physical:
            lines.append("  no collective: each device computes its share from what it holds")
        return "\n".join(lines)


_OP = re.compile(r'"tf\.(\w+)"\(([^)]*)\)[^\n]*?:\s*\((tensor<[^>]*>)')
_CONST = re.compile(r'(%[\w#]+) = "tf\.Const"\(\) <\{value = dense<(-?\d+)> : tensor<i32>\}>')
_TENSOR = re.compile(r"tensor<((?:\d+x)*)(\w+)>")


def _parse(text: str, logical: bool) -> list[Collective]:
    """The collectives in one dumped MLIR module, function by function (SSA names are per function)."""
    found = []
    for function in text.split("func.func")[1:]:
        consts = dict(_CONST.findall(function))
        for op, operands, first in _OP.findall(function):
            if not (op in LOGICAL if logical else op.startswith("Collective")):
                continue
            dims, dtype = _TENSOR.match(first).groups()
            shape = tuple(int(d) for d in dims.split("x") if d)
            args = [a.strip() for a in operands.split(",")]
            group = int(consts[args[1]]) if not logical and len(args) > 1 and args[1] in consts else None
            if not logical and op in PHYSICAL and group is None:
                raise RuntimeError(f"couldn't read the group size of a {op} in DTensor's program (operand "
                                   f"{args[1:2]}); this TensorFlow's programs are written differently from the "
                                   f"2.20 and 2.21 this reader was checked on.")
            found.append(Collective(op, shape, dtype, group))
    return found


def compiled_collectives(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Compiled:
    """Compile and run ``fn(*args)`` as a new ``tf.function`` on DTensors; return what DTensor inserted.

    ``fn`` may be a plain Python function or a ``tf.function`` (its Python function is traced afresh, so
    DTensor compiles it again and writes its program; the ``tf.function``'s own options, AutoGraph
    included, are not kept). Needs :func:`record_collectives` first. It is traced without AutoGraph, the
    part of ``tf.function`` that turns Python control flow on tensors into graph ops: ``fn``'s Python runs
    as written while TensorFlow traces it. A loop over a Python ``range`` unrolls (as it would with
    AutoGraph); an ``if`` or ``while`` on a tensor's value, or a ``for`` over a tensor (``tf.range``
    included), raises ``OperatorNotAllowedInGraphError`` (write ``tf.cond`` or ``tf.while_loop``). The
    course's programs have none, and AutoGraph's rewrite of the course's functions that ``fn`` calls only
    added tracing time.

    Example:
        >>> run = compiled_collectives(lambda x: dtensor.relayout(x, replicated), x)  # doctest: +SKIP
        >>> [c.op for c in run.physical]  # doctest: +SKIP
        ['CollectiveReduceV2']
    """
    tf = quiet.import_tensorflow()
    folder = _folder()
    before = set(folder.iterdir())
    python_fn = getattr(fn, "python_function", fn)
    function = tf.function(python_fn, autograph=False)  # no AutoGraph rewrite: the docstring says why
    result = function(*args, **kwargs)
    new = sorted(set(folder.iterdir()) - before)
    passes = {name: [p for p in new if f".after_{name}." in p.name] for name in (LOGICAL_PASS, PHYSICAL_PASS)}
    if not passes[PHYSICAL_PASS]:
        raise RuntimeError(f"DTensor wrote no program for {getattr(python_fn, '__name__', fn)!r} into {folder}. Its "
                           f"inputs must be DTensors (meshes.put) for DTensor to compile it; and "
                           f"record_collectives() must run before TensorFlow starts. (This reader was checked on "
                           f"TensorFlow 2.20 and 2.21; another version may name its passes differently.)")
    # Several files per pass: the last holds the final state of the function that ran on the mesh.
    logical = _parse(passes[LOGICAL_PASS][-1].read_text(), logical=True) if passes[LOGICAL_PASS] else []
    physical = _parse(passes[PHYSICAL_PASS][-1].read_text(), logical=False)
    name = getattr(python_fn, "__name__", "function")
    return Compiled(name, logical, physical, result, function)


#: Megatron-LM's tensor parallelism as layouts (lesson 13 by hand): the query, key, value and first MLP
#: matrices (and its bias) split by columns, the attention output and second MLP matrices by rows; every
#: other weight is held whole by every device. ``TENSOR`` stands for the mesh axis that splits them.
TENSOR = "model"
MEGATRON = {"wq": (None, TENSOR), "wk": (None, TENSOR), "wv": (None, TENSOR), "wo": (TENSOR, None),
            "w1": (None, TENSOR), "b1": (TENSOR,), "w2": (TENSOR, None)}


def gpt_layouts(mesh: Any, weights: dict[str, Any], tensor_axis: str | None = None) -> dict[str, Any]:
    """A layout for each TinyGPT weight: replicated, or (with ``tensor_axis``) Megatron's split along that axis.

    Example:
        >>> layouts = gpt_layouts(mesh, model.weights_by_name(), tensor_axis="model")  # doctest: +SKIP
        >>> layouts["block0/wq"].sharding_specs  # doctest: +SKIP
        ['unsharded', 'model']
    """
    if tensor_axis is not None and tensor_axis not in mesh.dim_names:
        raise BadArgument(f"tensor_axis={tensor_axis!r} is not on this mesh, whose axes are {list(mesh.dim_names)}.")
    chosen = {}
    for name, value in weights.items():
        rank = len(value.shape)
        axes = MEGATRON.get(name.split("/")[-1]) if tensor_axis is not None else None
        axes = tuple(tensor_axis if a == TENSOR else None for a in axes) if axes else (None,) * rank
        chosen[name] = layout(mesh, *axes)
    return chosen


def variables(weights: dict[str, Any], layouts: dict[str, Any]) -> dict[str, Any]:
    """Each weight as a ``dtensor.DVariable`` with its layout: each device holds only its share."""
    from tensorflow.experimental import dtensor

    return {name: dtensor.DVariable(put(value, layouts[name])) for name, value in weights.items()}


def gpt_gradients(weights: dict[str, Any], tokens: Any, targets: Any, heads: int) -> tuple[Any, dict[str, Any]]:
    """TinyGPT's mean next-token loss and every weight's gradient (dense), written as for one device.

    With DTensor ``weights`` and ``tokens``, DTensor runs it on the mesh and inserts the collectives;
    with plain ones, it runs on one device. The same function either way.
    """
    tf = quiet.import_tensorflow()
    from mgpu_edu.workloads import gpt

    names = list(weights)
    with tf.GradientTape() as tape:
        loss = gpt.next_token_loss(gpt.forward(weights, tokens, heads), targets)
    grads = tape.gradient(loss, [weights[n] for n in names])
    return loss, {n: tf.convert_to_tensor(g) for n, g in zip(names, grads, strict=True)}


def sgd_step(weights: dict[str, Any], tokens: Any, targets: Any, heads: int, learning_rate: float) -> Any:
    """One step of plain gradient descent on ``weights`` (variables); returns the loss before the step."""
    loss, grads = gpt_gradients(weights, tokens, targets, heads)
    for name, variable in weights.items():
        variable.assign_sub(learning_rate * grads[name])
    return loss
