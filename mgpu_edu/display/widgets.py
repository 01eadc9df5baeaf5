"""ipywidgets front-ends for the lessons. Works with ipywidgets 7.7 (Colab) and 8 (JupyterLab 4).

Figures are drawn with matplotlib and shown in an ``Image`` widget, which behaves the same
in both versions and needs no ``Output`` capture. Only lessons import this module.
"""

from __future__ import annotations

import html
from typing import Any

from mgpu_edu._validate import one_of, real_number, whole_number
from mgpu_edu.analysis import costmodel, memory
from mgpu_edu.display import viz
from mgpu_edu.parallelism import allreduce, collectives, mirrored, pipeline
from mgpu_edu.runtime import devices as _devices
from mgpu_edu.runtime import quiet


class _Displayed:
    """A widget front-end that shows its ``root`` box when it is a cell's result."""

    root: Any

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.root)


class AllReduceStepper(_Displayed):
    """Step through an all-reduce: pick N and an algorithm, then move the step slider or press play.

    Each frame shows every device's chunks after step k (which devices' data each chunk holds:
    a partial sum, a copy, or nothing yet) and arrows for what moved in step k (black: added,
    grey: copied). The schedule is the one :mod:`mgpu_edu.allreduce` runs on real tensors,
    simulated here for any N up to 16. :class:`CollectiveStepper` adds the other collectives.

    Example:
        >>> AllReduceStepper(n=4, algorithm="ring")  # doctest: +SKIP
    """

    PATTERNS: tuple[str, ...] = allreduce.ALGORITHMS
    LABEL = "algorithm"

    def __init__(self, n: int = 4, algorithm: str = "ring", max_n: int = 16) -> None:
        import ipywidgets as w

        one_of("algorithm", algorithm, self.PATTERNS)
        whole_number("n", n, minimum=2, maximum=max_n, hint="It is the number of devices.")
        self.n = w.IntSlider(value=n, min=2, max=max_n, description="devices N")
        self.algorithm = w.Dropdown(options=list(self.PATTERNS), value=algorithm, description=self.LABEL)
        self.step = w.IntSlider(value=0, min=0, max=1, description="step")
        self.play = w.Play(value=0, min=0, max=1, interval=900, description="play")
        w.jslink((self.play, "value"), (self.step, "value"))
        self.image = w.Image(format="png")
        self.info = w.HTML()
        self.root = w.VBox([w.HBox([self.n, self.algorithm]), w.HBox([self.play, self.step]), self.image, self.info])
        self.root.add_class("mgpu-allreduce")
        self.trace: allreduce.Trace | None = None
        self.n.observe(self._rebuild, names="value")
        self.algorithm.observe(self._rebuild, names="value")
        self.step.observe(self._draw, names="value")
        self._rebuild()

    def _rebuild(self, change: Any = None) -> None:
        n, pattern = self.n.value, self.algorithm.value
        if pattern in allreduce.ALGORITHMS:
            self.trace = allreduce.simulate(pattern, n, length=n * 4)
        else:
            self.trace = collectives.simulate(pattern, n, rows=n * 4)
        steps = len(self.trace.steps)
        self.step.value = 0
        self.step.max = self.play.max = steps
        self._draw()

    def _draw(self, change: Any = None) -> None:
        trace, k = self.trace, self.step.value
        fig = viz.new_figure(1.0 * len(trace.chunk_bytes) + 2.5, 0.5 * trace.n + 1.2)
        viz.draw_allreduce_step(trace, k, fig.add_subplot())
        self.image.value = viz.figure_png(fig)
        sent = trace.bytes_sent_until(k)
        self.info.value = (f"<p>Tensor size S = {trace.total_bytes:,} bytes per device. Bytes sent so far, "
                           f"per device: {sent}. After all {len(trace.steps)} steps: sent {trace.bytes_sent}, "
                           f"received {trace.bytes_received}.</p>")



class CollectiveStepper(AllReduceStepper):
    """Lesson 03's stepper with every collective of :mod:`mgpu_edu.collectives` beside the all-reduce algorithms.

    Broadcast, reduce, reduce-scatter, all-gather, all-to-all and send/receive, simulated for any N
    up to 16 with the schedules the collectives run on real tensors (lesson 12).

    Example:
        >>> CollectiveStepper(n=4, algorithm="all_to_all")  # doctest: +SKIP
    """

    PATTERNS = (*allreduce.ALGORITHMS, *(c for c in collectives.COLLECTIVES if c != "all_reduce"))
    LABEL = "pattern"


class ReplicaBatchExplorer(_Displayed):
    """Choose replicas and batch size, see how a batch splits, then press Train to really train.

    Live (no training): how TensorFlow splits one global batch over the replicas
    (:func:`mgpu_edu.mirrored.replica_shares`, checked against TensorFlow), per-replica batch,
    steps per epoch, the linearly scaled learning rate, and how ``fit`` weights the short last
    batch. **Train** trains ``build_model()`` with MirroredStrategy over exactly that many
    logical devices, behind a progress bar, and adds a row to the results table (class
    ``mgpu-results``) and a bar to the chart. The root widget has the CSS class ``mgpu-explorer``.

    Choices ``fit`` can't train (a global batch smaller than the replicas, or a first batch
    that splits unevenly) are explained in the widget, naming what to choose instead, and
    disable Train; a click while a run is going is ignored. Works with ipywidgets 7.7 and 8.
    No GPU: the replicas are logical CPUs sharing the cores, so examples/s won't grow.

    Example:
        >>> explorer = ReplicaBatchExplorer(models.small_cnn, data.digits(images=True))  # doctest: +SKIP
        >>> explorer  # doctest: +SKIP
    """

    def __init__(self, build_model: Any, split: Any, devices: list[str] | None = None, batch: int = 32,
                 base_lr: float = 0.05, base_batch: int = 32, epochs: int = 2, background: bool = True,
                 drop_remainder: bool = True) -> None:
        import ipywidgets as w

        self.build_model, self.split = build_model, split
        self.devices = list(devices) if devices is not None else _devices.logical_devices()
        self.base_lr, self.base_batch, self.background = base_lr, base_batch, background
        self.results: list[Any] = []
        self.busy = False
        self.replicas = w.IntSlider(value=1, min=1, max=len(self.devices), description="replicas")
        self.batch = w.IntSlider(value=batch, min=1, max=512, description="batch size")
        self.mode = w.ToggleButtons(options=[("per replica", "per_replica"), ("global", "global")],
                                    value="per_replica", description="batch is")
        self.epochs = w.IntSlider(value=epochs, min=1, max=10, description="epochs")
        self.drop_remainder = w.Checkbox(value=drop_remainder, description="drop the short last batch",
                                         indent=False)
        self.diagram = w.HTML()  # HTML, not a matplotlib PNG: it redraws in a few ms as sliders move
        self.diagram.add_class("mgpu-split-diagram")
        self.numbers = w.HTML()
        self.train_button = w.Button(description="Train", button_style="primary", icon="play")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="progress")
        self.status = w.HTML()
        self.table = w.HTML()
        self.table.add_class("mgpu-results")
        self.chart = w.Image(format="png")
        controls = w.VBox([self.replicas, self.mode, self.batch, self.epochs, self.drop_remainder])
        self.root = w.VBox([w.HBox([controls, self.diagram]), self.numbers,
                            w.HBox([self.train_button, self.progress]), self.status, self.table, self.chart])
        self.root.add_class("mgpu-explorer")
        for control in (self.replicas, self.batch, self.mode, self.epochs, self.drop_remainder):
            control.observe(self._update, names="value")
        self.train_button.on_click(self._clicked)
        self._render_results()
        self._update()

    # ------------------------------------------------------------------ live part
    def plan(self) -> Any:
        """The batch plan for the current controls (raises ValueError for an invalid choice)."""
        return mirrored.batch_plan(len(self.split.x_train), self.batch.value, self.replicas.value,
                                   mode=self.mode.value, base_lr=self.base_lr, base_batch=self.base_batch,
                                   drop_remainder=self.drop_remainder.value)

    def _update(self, change: Any = None) -> None:
        try:
            plan = self.plan()
        except ValueError as error:
            self.numbers.value = f"<p style='color:#b00'>⚠ {html.escape(str(error))}</p>"
            self.train_button.disabled = True
            return
        self.diagram.value = viz.split_diagram_html(plan)
        shares = ", ".join(map(str, plan.shares))
        text = (f"<p>{plan.replicas} replica(s): global batch <b>{plan.global_batch}</b>, split {shares} · "
                f"<b>{plan.steps_per_epoch}</b> steps per epoch over {plan.examples:,} examples")
        if plan.dropped:
            text += f" ({plan.dropped} dropped)"
        text += (f" · learning rate {self.base_lr:g} × {plan.global_batch}/{self.base_batch} = "
                 f"<b>{plan.learning_rate:.4g}</b> (linear scaling)</p>")
        weights = {round(v, 3) for v in plan.last_step_weights if v is not None}
        if weights != {1.0}:
            last = ", ".join(map(str, plan.last_shares))
            scale = " and ".join(f"{v:g}×" for v in sorted(weights))
            text += (f"<p>The last batch ({plan.last_batch}, split {last}) gets {scale} its right weight in "
                     "fit: Keras divides each replica's mean loss by the number of replicas. Tick "
                     "<i>drop the short last batch</i> to skip it.</p>")
        if plan.fit_error:
            text += f"<p style='color:#b00'>⚠ {html.escape(plan.fit_error)}</p>"
        self.numbers.value = text
        self.train_button.disabled = self.busy or plan.fit_error is not None

    # ------------------------------------------------------------------ training
    def _clicked(self, button: Any = None) -> None:
        if self.busy:
            return
        if self.background:
            import threading

            self.busy = True
            self.train_button.disabled = True
            threading.Thread(target=self.train, kwargs={"claimed": True}, daemon=True).start()
        else:
            self.train()

    def train(self, claimed: bool = False) -> Any:
        """Train once with the current controls, in this thread; returns the RunResult (None if busy/invalid)."""
        if self.busy and not claimed:
            return None
        self.busy = True
        self.train_button.disabled = True
        result = None
        try:
            plan = self.plan()  # inside the try: the sliders may have moved since the click
            epochs = self.epochs.value  # read once, for the progress bar and the run alike
            self.progress.value, self.progress.max = 0, plan.steps_per_epoch * epochs
            self.status.value = f"<p>Training on {', '.join(self.devices[:plan.replicas])} …</p>"
            result = mirrored.train_mirrored(
                self.build_model, self.split, plan.replicas, plan.global_batch, epochs=epochs,
                learning_rate=plan.learning_rate, devices=self.devices, on_batch=self._on_batch,
                drop_remainder=plan.drop_remainder)
            self.results.append(result)
            self._render_results()
            self.status.value = (f"<p>Done: {result.replicas} replica(s), {result.seconds_per_epoch:.2f} s per "
                                 f"epoch, test accuracy {result.accuracy:.3f}.</p>")
        except Exception as error:  # shown in the widget, never a traceback in the notebook
            self.status.value = f"<p style='color:#b00'>⚠ {html.escape(str(error) or repr(error))}</p>"
        finally:
            self.busy = False  # only after the results are in, so a quick second click can't interleave
            self._update()
        return result

    def _on_batch(self, done: int, total: int) -> None:
        if done == total or done % max(1, total // 50) == 0:
            self.progress.value = done

    def _render_results(self) -> None:
        if not self.results:
            self.table.value = "<p><i>No runs yet: press Train.</i></p>"
            return
        rows = [r.row() for r in self.results]
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row.values()) + "</tr>" for row in rows)
        self.table.value = (f"<table class='mgpu-results-table'><thead><tr>{head}</tr></thead>"
                            f"<tbody>{body}</tbody></table>")
        fig = viz.new_figure(8, 2.3)
        viz.draw_runs(self.results, (fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)))
        fig.tight_layout()
        self.chart.value = viz.figure_png(fig)


class PipelineExplorer(_Displayed):
    """Sliders for stages P and micro-batches M; draws the ideal GPipe and 1F1B schedules, their bubble,
    and how many micro-batches' activations each stage holds at once under each.

    Example:
        >>> PipelineExplorer(stages=4, micro_batches=4)  # doctest: +SKIP
    """

    def __init__(self, stages: int = 4, micro_batches: int = 4) -> None:
        import ipywidgets as w

        pipeline.bubble_fraction(stages, micro_batches)  # validates both
        self.stages = w.IntSlider(value=stages, min=1, max=8, description="stages P")
        self.micro_batches = w.IntSlider(value=micro_batches, min=1, max=32, description="micro-batches M")
        self.image = w.Image(format="png")
        self.info = w.HTML()
        self.root = w.VBox([w.HBox([self.stages, self.micro_batches]), self.info, self.image])
        self.root.add_class("mgpu-pipeline")
        self.stages.observe(self._draw, names="value")
        self.micro_batches.observe(self._draw, names="value")
        self._draw()

    def schedules(self) -> dict[str, list]:
        """The ideal GPipe and 1F1B schedules for the sliders' P and M."""
        p, m = self.stages.value, self.micro_batches.value
        return {"GPipe": pipeline.gpipe_schedule(p, m), "1F1B": pipeline.one_f_one_b_schedule(p, m)}

    def in_flight(self) -> dict[str, list[int]]:
        """For each schedule, each stage's most micro-batches in flight (from the drawn schedules)."""
        return {name: pipeline.in_flight_peaks(events) for name, events in self.schedules().items()}

    def _draw(self, change: Any = None) -> None:
        p, m = self.stages.value, self.micro_batches.value
        schedules = self.schedules()
        held = {name: pipeline.in_flight_peaks(events) for name, events in schedules.items()}
        fig = viz.new_figure(11, 0.7 * p + 1.6)
        grid = fig.add_gridspec(2, 2, width_ratios=[3, 1])
        for row, (name, events) in enumerate(schedules.items()):
            viz.draw_schedule(events, fig.add_subplot(grid[row, 0]), title=f"{name}, P={p}, M={m}")
        viz.draw_in_flight(held, fig.add_subplot(grid[:, 1]))
        fig.tight_layout()
        self.image.value = viz.figure_png(fig, tight=False)
        bubble = pipeline.bubble_fraction(p, m)
        self.info.value = (f"<p>bubble = (P−1)/(M+P−1) = {p - 1}/{m + p - 1} = <b>{bubble:.1%}</b> of stage-time "
                           f"idle under both schedules; a step takes {2 * (m + p - 1)} slots for {2 * m} slots of "
                           f"work per stage. Micro-batches whose activations stage 0 holds at once: "
                           f"GPipe <b>{held['GPipe'][0]}</b>, 1F1B <b>{held['1F1B'][0]}</b>.</p>")


class ScalingSimulator(_Displayed):
    """The scaling model (:mod:`mgpu_edu.costmodel`) with controls: model size, batch, device, link, algorithm.

    Shows each step's compute and all-reduce time for 1 … N replicas, and the scaling
    efficiency. The device's rate is its datasheet peak × ``utilisation``, the share of peak
    training really reaches (1.0 = the peak itself; lesson 08 derives one from a measured
    run). Pure arithmetic: it runs instantly, with or without a GPU.

    Example:
        >>> ScalingSimulator()  # doctest: +SKIP
    """

    def __init__(self, params_millions: float = 25.6, gflops_per_example: float = 24.6, batch: int = 64,
                 device: str = "T4", link: str = "PCIe 3", max_replicas: int = 16, utilisation: float = 1.0) -> None:
        import ipywidgets as w

        style = {"description_width": "150px"}
        self.params = w.FloatLogSlider(value=params_millions, base=10, min=-1, max=4, description="params (M)",
                                       style=style)
        self.flops = w.FloatLogSlider(value=gflops_per_example, base=10, min=-2, max=3,
                                      description="GFLOPs / example", style=style)
        self.batch = w.IntSlider(value=batch, min=1, max=1024, description="batch per replica", style=style)
        real_number("utilisation", utilisation, minimum=0, maximum=1, above=True,
                    hint="It is the share of the device's peak that training reaches.")
        self.device = w.Dropdown(options=list(costmodel.PEAK_TFLOPS), value=device, description="device (peak)",
                                 style=style)
        self.utilisation = w.FloatSlider(value=utilisation, min=0.01, max=1, step=0.01, readout_format=".0%",
                                         description="share of peak", style=style)
        self.precision = w.ToggleButtons(options=["fp32", "tf32", "mixed"], value="fp32", description="precision",
                                         style=style)
        self.link = w.Dropdown(options=list(costmodel.LINKS), value=link, description="link", style=style)
        self.algorithm = w.Dropdown(options=list(allreduce.ALGORITHMS), value="ring", description="all-reduce",
                                    style=style)
        self.overlap = w.FloatSlider(value=0.0, min=0, max=1, step=0.05, description="overlap", style=style)
        self.max_replicas = w.IntSlider(value=max_replicas, min=2, max=64, description="replicas up to", style=style)
        self.image = w.Image(format="png")
        self.info = w.HTML()
        controls = [self.params, self.flops, self.batch, self.device, self.utilisation, self.precision, self.link,
                    self.algorithm, self.overlap, self.max_replicas]
        self.root = w.VBox([w.HBox([w.VBox(controls[:6]), w.VBox(controls[6:])]), self.info, self.image])
        self.root.add_class("mgpu-scaling")
        for control in controls:
            control.observe(self._draw, names="value")
        self._draw()

    def options(self) -> dict[str, Any]:
        """The current controls as costmodel keyword arguments."""
        peaks = costmodel.PEAK_TFLOPS[self.device.value]
        peak = peaks.get(self.precision.value, peaks["fp32"])  # no TF32 on a T4: float32 runs as fp32
        # Keras's mixed precision keeps float32 variables, so gradients are all-reduced in float32
        return {"device_tflops": peak * self.utilisation.value,
                "link_gbytes_per_s": costmodel.LINKS[self.link.value], "algorithm": self.algorithm.value,
                "overlap": self.overlap.value, "bytes_per_param": 4}

    def _draw(self, change: Any = None) -> None:
        params, flops = self.params.value * 1e6, self.flops.value * 1e9
        options = self.options()
        ns = list(range(1, self.max_replicas.value + 1))
        steps = [costmodel.step_time(params, flops, self.batch.value, n, **options) for n in ns]
        curve = costmodel.scaling(params, flops, self.batch.value, ns[-1], **options)
        fig = viz.new_figure(10, 3)
        viz.draw_scaling(steps, curve, (fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)))
        fig.tight_layout()
        self.image.value = viz.figure_png(fig, tight=False)
        last = steps[-1]
        self.info.value = (f"<p>{ns[-1]} replicas: compute {last.compute_s * 1e3:.1f} ms + all-reduce "
                           f"{last.comm_s * 1e3:.1f} ms ({last.hidden_s * 1e3:.1f} ms hidden) per step → speed-up "
                           f"<b>{curve['speedup'][-1]:.1f}×</b>, efficiency <b>{curve['efficiency'][-1]:.0%}</b>.</p>")


class MemoryCalculator(_Displayed):
    """How much memory each device needs to train a model: weights, gradients, optimizer state, activations.

    Controls: the model (the course's MLP and CNN, ResNet-50, or a 7B or 70B transformer), the
    data × tensor × pipeline layout, the ZeRO stage, micro-batch, micro-batches per step
    (gradient accumulation, or a pipeline's micro-batches), precision, optimizer and, for
    transformers, activation recomputation and sequence parallelism. It draws a stacked bar per
    pipeline stage (devices within a stage hold the same) against 90 % of the memory of a T4,
    an A100 and an H100 (:data:`mgpu_edu.memory.USABLE_FRACTION`). Keras models are counted
    layer by layer (:func:`mgpu_edu.memory.layer_activations`), with model states for their
    trainable weights in float32, as Keras keeps them under mixed precision too; transformers
    with Korthikanti et al.'s formulas. Pure arithmetic once a preset is built: it runs without
    a GPU. The root widget has the CSS class ``mgpu-memory``.

    Example:
        >>> MemoryCalculator(course_model=models.mlp(64, 10))  # doctest: +SKIP
    """

    def __init__(self, course_model: Any = None, devices: int = 4, micro_batch: int = 32,
                 preset: str | None = None) -> None:
        import ipywidgets as w

        self._keras: dict[str, Any] = {}
        if course_model is not None:
            self._keras[f"course model ({course_model.name}, {course_model.count_params():,} weights)"] = course_model
        self._keras["ResNet-50 (224 × 224 images)"] = None  # built when first chosen
        options = [*self._keras, *memory.TRANSFORMERS]
        preset = preset or options[0]
        one_of("preset", preset, options)
        style = {"description_width": "140px"}
        self.preset = w.Dropdown(options=options, value=preset, description="model", style=style,
                                 layout=w.Layout(width="420px"))
        self.data = w.IntSlider(value=devices, min=1, max=64, description="data parallel", style=style)
        self.tensor = w.IntSlider(value=1, min=1, max=8, description="tensor parallel", style=style)
        self.pipeline = w.IntSlider(value=1, min=1, max=16, description="pipeline stages", style=style)
        self.zero = w.IntSlider(value=0, min=0, max=3, description="ZeRO stage", style=style)
        self.micro_batch = w.IntSlider(value=micro_batch, min=1, max=512, description="micro-batch", style=style)
        self.accumulation = w.IntSlider(value=1, min=1, max=64, description="micro-batches/step",
                                        style=style)  # gradient accumulation, or a pipeline's micro-batches
        self.precision = w.ToggleButtons(options=["fp32", "mixed"], value="fp32", description="precision",
                                         style=style)
        self.optimizer = w.ToggleButtons(options=["adam", "momentum", "sgd"], value="adam", description="optimizer",
                                         style=style)
        self.recompute = w.ToggleButtons(options=list(memory.RECOMPUTE), value="none", description="recompute",
                                         style=style)
        self.sequence_parallel = w.Checkbox(value=False, description="sequence parallel", indent=False)
        self.image = w.Image(format="png")
        self.info = w.HTML()
        controls = [self.preset, self.data, self.tensor, self.pipeline, self.zero, self.micro_batch,
                    self.accumulation, self.precision, self.optimizer, self.recompute, self.sequence_parallel]
        self.root = w.VBox([w.HBox([w.VBox(controls[:6]), w.VBox(controls[6:])]), self.info, self.image])
        self.root.add_class("mgpu-memory")
        for control in controls:
            control.observe(self._draw, names="value")
        self._draw()

    def _model(self) -> Any:
        name = self.preset.value
        if self._keras.get(name) is None and name in self._keras:  # ResNet-50: built once, weights not loaded
            quiet.import_tensorflow()
            import keras

            self._keras[name] = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
        return self._keras.get(name, memory.TRANSFORMERS.get(name))

    def stages(self) -> list[Any]:
        """A DeviceMemory per pipeline stage for the current controls (one when there is no pipeline)."""
        model = self._model()
        common = {"data_parallel": self.data.value, "zero_stage": self.zero.value,
                  "accumulation": self.accumulation.value, "optimizer": self.optimizer.value,
                  "precision": self.precision.value}
        if isinstance(model, memory.Transformer):
            return [memory.transformer_memory(
                model, self.micro_batch.value, tensor_parallel=self.tensor.value,
                pipeline_parallel=self.pipeline.value, recompute=self.recompute.value,
                sequence_parallel=self.sequence_parallel.value, pipeline_stage=s, **common)
                for s in range(self.pipeline.value)]
        kept = memory.activations(model, self.micro_batch.value, 4 if self.precision.value == "fp32" else 2)
        common["precision"] = "fp32"  # Keras's mixed precision keeps float32 weights: 4 + 4 + 8 bytes with Adam
        return [memory.per_device(memory.trainable_params(model), kept, **common)]

    def _draw(self, change: Any = None) -> None:
        transformer = self.preset.value in memory.TRANSFORMERS
        for control in (self.tensor, self.pipeline, self.recompute, self.sequence_parallel):
            control.disabled = not transformer  # tensor and pipeline splits are for transformer layers here
        if not transformer:
            self.tensor.value = self.pipeline.value = 1
        try:
            stages = self.stages()
        except ValueError as error:
            self.info.value = f"<p style='color:#b00'>⚠ {html.escape(str(error))}</p>"
            return
        devices = self.data.value * self.tensor.value * self.pipeline.value
        per_stage = self.data.value * self.tensor.value
        labels = ([f"each of {devices}"] if len(stages) == 1 else
                  [f"stage {s} ({per_stage})" for s in range(len(stages))])
        marks = {f"{name} × {memory.USABLE_FRACTION:.0%}": memory.USABLE_FRACTION * mib * 2**20
                 for name, mib in memory.GPU_MEMORY_MIB.items()}
        fig = viz.new_figure(7, 3)
        viz.draw_memory_bars(list(zip(labels, stages, strict=True)), marks, fig.add_subplot())
        fig.tight_layout()
        self.image.value = viz.figure_png(fig, tight=False)
        worst = max(stages, key=lambda m: m.total)
        fits = ", ".join(f"{name} {'yes' if memory.fits(worst.total, name) else 'no'}"
                         for name in memory.GPU_MEMORY_MIB)
        size = viz.bytes_text
        self.info.value = (f"<p>{devices} device(s); the fullest holds <b>{size(worst.total)}</b>: weights "
                           f"{size(worst.params)}, gradients {size(worst.grads)}, optimizer {size(worst.optimizer)}, "
                           f"activations {size(worst.activations)}. "
                           f"Fits in {memory.USABLE_FRACTION:.0%} of the card (the rest: CUDA context, logits, "
                           f"buffers, fragmentation): {fits}.</p>")



class ExpertLoad(_Displayed):
    """A capacity-factor slider and a top-k toggle over one batch's router ``logits`` [tokens, experts]: draws
    the token choices each expert is sent and keeps against its capacity, and counts what is dropped
    (:func:`mgpu_edu.experts.route`, one group).

    Example:
        >>> ExpertLoad(logits)  # doctest: +SKIP
    """

    def __init__(self, logits: Any, capacity_factor: float = 1.25, top_k: int = 1) -> None:
        import ipywidgets as w

        from mgpu_edu.parallelism import experts

        self._route = experts.route
        self.logits = logits
        experts.capacity(int(logits.shape[0]), int(logits.shape[1]), top_k, capacity_factor)  # validates
        self.capacity_factor = w.FloatSlider(value=capacity_factor, min=0.25, max=3.0, step=0.25,
                                             description="capacity factor")
        self.top_k = w.ToggleButtons(options=[1, 2], value=top_k, description="top-k")
        self.image = w.Image(format="png")
        self.info = w.HTML()
        self.root = w.VBox([w.HBox([self.capacity_factor, self.top_k]), self.info, self.image])
        self.root.add_class("mgpu-experts")
        self.capacity_factor.observe(self._draw, names="value")
        self.top_k.observe(self._draw, names="value")
        self._draw()

    def routing(self) -> Any:
        """The routing for the current capacity factor and top-k."""
        return self._route(self.logits, top_k=self.top_k.value, capacity_factor=self.capacity_factor.value)

    def _draw(self, change: Any = None) -> None:
        routing = self.routing()
        wanted, kept = routing.wanted.numpy()[0], routing.kept.numpy()[0]
        tokens, k = int(self.logits.shape[0]), self.top_k.value
        fig = viz.new_figure(7, 3)
        viz.draw_expert_load(wanted, kept, routing.capacity, fig.add_subplot(1, 1, 1),
                             title=f"{tokens} tokens, top-{k}, capacity factor {self.capacity_factor.value:g}")
        fig.tight_layout()
        self.image.value = viz.figure_png(fig, tight=False)
        slots = routing.capacity * len(wanted)
        self.info.value = (f"<p>capacity = ⌈{self.capacity_factor.value:g} · {k} · {tokens} / {len(wanted)}⌉ = "
                           f"<b>{routing.capacity}</b> slots per expert; <b>{routing.dropped}</b> of "
                           f"{tokens * k} token choices dropped; {int(kept.sum())} of {slots} slots filled "
                           f"({kept.sum() / slots:.0%}); auxiliary loss {float(routing.aux_loss):.2f} "
                           "(1 when even).</p>")


class Planner(_Displayed):
    """Choose a job (a model, a cluster and a global batch, ``planner.WIDGET_JOBS``) and a cap on the bytes each
    device may send per step; shows how many layouts fit, the fastest five by the cost model, and what each
    of them holds on its fullest device (:func:`mgpu_edu.planner.plan`). No TensorFlow: it only counts.

    Example:
        >>> Planner("65B on 64 H100s")  # doctest: +SKIP
    """

    def __init__(self, job: str = "65B on 64 H100s", max_sent_gb: int = 0) -> None:
        import ipywidgets as w

        from mgpu_edu.analysis import planner

        self._planner = planner
        one_of("job", job, planner.WIDGET_JOBS)
        self.job = w.Dropdown(options=list(planner.WIDGET_JOBS), value=job, description="job")
        self.max_sent = w.IntSlider(value=max_sent_gb, min=0, max=2000, step=10, description="GB sent ≤",
                                    continuous_update=False)
        self.image = w.Image(format="png")
        self.info = w.HTML()
        self.root = w.VBox([w.HBox([self.job, self.max_sent]), self.info, self.image])
        self.root.add_class("mgpu-planner")
        self.job.observe(self._draw, names="value")
        self.max_sent.observe(self._draw, names="value")
        self._draw()

    def options(self) -> list[Any]:
        """The layouts that fit the chosen job under the cap, fastest first."""
        model, cluster, batch, _ = self._planner.PUZZLES[self.job.value]
        cap = self.max_sent.value * 1e9 if self.max_sent.value else None
        return self._planner.plan(model, cluster, batch, max_sent=cap)

    def _draw(self, change: Any = None) -> None:
        found = self.options()
        model, cluster, batch, _ = self._planner.PUZZLES[self.job.value]
        cap = f"at most {self.max_sent.value:,} GB sent per device per step" if self.max_sent.value else "no cap"
        rows = "".join(f"<tr><td>{p.layout.describe()}</td><td>{p.held_total / 2**30:,.1f} GiB</td>"
                       f"<td>{p.sent_total / 1e9:,.1f} GB</td><td>{p.seconds:,.1f} s</td></tr>" for p in found[:5])
        self.info.value = (f"<p>{model.params / 1e9:,.1f} B parameters on {cluster.devices} devices of "
                           f"{cluster.memory_bytes / 2**30:,.0f} GiB, {batch:,} sequences per step, {cap}: "
                           f"<b>{len(found)}</b> {'layout fits' if len(found) == 1 else 'layouts fit'}.</p>"
                           + ("<table><tr><th>layout</th><th>held (fullest device)</th><th>sent (busiest)</th>"
                              f"<th>step (model)</th></tr>"
                              f"{rows}</table>" if found else "<p>None fits: raise the cap.</p>"))
        fig = viz.new_figure(7, 2.6)
        ax = fig.add_subplot(1, 1, 1)
        kinds = ("weights", "gradients", "optimizer", "activations", "working")
        bottom = [0.0] * len(found[:5])
        for i, kind in enumerate(kinds):
            values = [p.held[kind] / 2**30 for p in found[:5]]
            ax.barh(range(len(values)), values, left=bottom, color=viz.PALETTE[i], label=kind)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.axvline(cluster.memory_bytes / 2**30, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(found[:5])), [f"#{i + 1}" for i in range(len(found[:5]))])
        ax.invert_yaxis()
        ax.set_xlabel("GiB held on the fullest device (dashed: the device's memory)")
        ax.set_title(f"{self.job.value}, {cap}: the fastest {min(len(found), 5)} of {len(found)}", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        fig.tight_layout()
        self.image.value = viz.figure_png(fig, tight=False)


class RunExplorer(_Displayed):
    """Change the layout of a published run (``planner.PUBLISHED``) one axis at a time, and see what the fullest
    device holds, what the planner predicts a step costs and where that time goes, beside the paper's step.

    The run's devices and global batch stay fixed: more tensor, pipeline or context parallelism leaves fewer
    data-parallel replicas, and the micro-batches per step follow from the global batch. No TensorFlow: it
    only counts (:func:`mgpu_edu.planner.predict`).

    Example:
        >>> RunExplorer("GPT-3 175B on 64 A100s (Megatron-LM)")  # doctest: +SKIP
    """

    AXES = ("tensor", "pipeline", "context", "virtual_stages", "micro_batch", "zero", "recompute")

    def __init__(self, run: str = "GPT-3 175B on 64 A100s (Megatron-LM)") -> None:
        import ipywidgets as w

        from mgpu_edu.analysis import planner

        self._planner = planner
        one_of("run", run, planner.PUBLISHED)
        style, wide = {"description_width": "110px"}, w.Layout(width="230px")
        self.run = w.Dropdown(options=list(planner.PUBLISHED), value=run, description="published run", style=style,
                              layout=w.Layout(width="470px"))
        choices = {"tensor": (1, 2, 4, 8), "pipeline": (1, 2, 4, 8, 16, 32), "context": (1, 2, 4, 8, 16),
                   "virtual_stages": (1, 2, 3, 4), "micro_batch": (1, 2, 4, 8), "zero": (0, 1, 2, 3),
                   "recompute": ("none", "selective", "full")}
        self.controls = {axis: w.Dropdown(options=options, description=axis.replace("_", " "), style=style,
                                          layout=wide) for axis, options in choices.items()}
        self.sequence_parallel = w.Checkbox(description="sequence parallel", indent=False)
        self.image = w.Image(format="png")
        self.info = w.HTML()
        boxes = list(self.controls.values()) + [self.sequence_parallel]
        self.root = w.VBox([self.run, w.HBox([w.VBox(boxes[:4]), w.VBox(boxes[4:])]), self.info, self.image])
        self.root.add_class("mgpu-run-explorer")
        self._quiet = False
        self._reset()
        self.run.observe(self._reset, names="value")
        for control in boxes:
            control.observe(self._draw, names="value")

    def _reset(self, change: Any = None) -> None:
        """Set every control to the chosen run's own layout."""
        layout = self._planner.PUBLISHED[self.run.value].layout
        self._quiet = True
        for axis, control in self.controls.items():
            control.value = getattr(layout, axis)
        self.sequence_parallel.value = bool(layout.sequence_parallel)
        self._quiet = False
        self._draw()

    def layout(self) -> Any:
        """The layout the controls describe, on the run's devices and global batch (ValueError if none can)."""
        run = self._planner.PUBLISHED[self.run.value]
        v = {axis: control.value for axis, control in self.controls.items()}
        split = v["tensor"] * v["pipeline"] * v["context"]
        if run.cluster.devices % split:
            raise ValueError(f"tensor × pipeline × context = {split} doesn't divide the run's {run.cluster.devices} "
                             "devices: pick degrees whose product does.")
        data = run.cluster.devices // split
        if run.global_batch % (data * v["micro_batch"]):
            raise ValueError(f"{data} replicas × micro-batch {v['micro_batch']} don't divide the global batch of "
                             f"{run.global_batch} sequences: pick a smaller micro-batch or fewer replicas.")
        micro_batches = run.global_batch // (data * v["micro_batch"])
        return self._planner.Layout(data, v["tensor"], v["pipeline"], v["context"], 1, v["zero"], v["micro_batch"],
                                    micro_batches, v["recompute"], self.sequence_parallel.value,
                                    v["virtual_stages"], run.layout.reshard or v["zero"] != 3)

    def _draw(self, change: Any = None) -> None:
        if self._quiet:
            return
        run = self._planner.PUBLISHED[self.run.value]
        try:
            layout = self.layout()
            p = run.predict(layout)
        except ValueError as error:
            self.info.value = f"<p style='color:#b00'>⚠ {html.escape(str(error))}</p>"
            return
        limit = memory.USABLE_FRACTION * run.cluster.memory_bytes
        fits = "fits" if p.fits else f"<b>doesn't fit</b> (more than {limit / 2**30:,.0f} GiB)"
        self.info.value = (f"<p>{html.escape(layout.describe())}: the fullest device holds "
                           f"<b>{p.held_total / 2**30:,.1f} GiB</b>, {fits}; the busiest sends "
                           f"{p.sent_total / 1e9:,.1f} GB per step. Predicted step ~{p.seconds:,.1f} s (MFU "
                           f"{p.mfu:.0%}); the paper's: {run.reported_seconds:,.1f} s"
                           f"{'' if run.step_seconds else ' (implied by its FLOP/s per GPU)'} (MFU {run.mfu:.0%}).</p>")
        fig = viz.new_figure(8, 2.4)
        held, spent = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        left = 0.0
        for i, (kind, nbytes) in enumerate(p.held.items()):
            held.barh(0, nbytes / 2**30, left=left, color=viz.PALETTE[i], label=kind)
            left += nbytes / 2**30
        held.axvline(limit / 2**30, color="black", linestyle="--", linewidth=1)
        held.set_yticks([])
        held.set_xlabel("GiB on the fullest device (dashed: 90 % of its memory)")
        held.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, frameon=False)
        left = 0.0
        for i, (part, seconds) in enumerate(p.time.items()):  # a colour per part, whichever are zero
            if not seconds:
                continue
            spent.barh(0, seconds, left=left, color=viz.PALETTE[i], label=part)
            left += seconds
        spent.axvline(run.reported_seconds, color="black", linestyle="--", linewidth=1)
        spent.set_yticks([])
        spent.set_xlabel("seconds per step, predicted (dashed: the paper's)")
        spent.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, frameon=False)
        fig.tight_layout()
        self.image.value = viz.figure_png(fig, tight=False)


class OverlapExplorer(_Displayed):
    """Pick an axis (data, FSDP, tensor), a device (``roofline.DEVICES``) and a size (tokens per device, or the MLP
    width for tensor parallelism): draws the compute against the communication it could hide behind, for one
    4,096-wide weight matrix by lesson 03's α-β model, and says whether overlap can hide it all and where the
    axis stops being communication-bound (:mod:`mgpu_edu.roofline`). No TensorFlow: it only counts.

    Example:
        >>> OverlapExplorer("fsdp", "H100")  # doctest: +SKIP
    """

    def __init__(self, axis: str = "fsdp", device: str = "H100", size: int = 1024, devices: int = 8) -> None:
        import ipywidgets as w

        from mgpu_edu.analysis import roofline

        self._roofline = roofline
        one_of("axis", axis, roofline.AXES)
        one_of("device", device, tuple(roofline.DEVICES))
        self.n = devices
        self.axis = w.ToggleButtons(options=list(roofline.AXES), value=axis, description="axis")
        self.device = w.Dropdown(options=list(roofline.DEVICES), value=device, description="device")
        self.size = w.IntSlider(value=size, min=64, max=65536, step=64, description="size")
        self.image = w.Image(format="png")
        self.info = w.HTML()
        self.root = w.VBox([w.HBox([self.axis, self.device]), self.size, self.info, self.image])
        self.root.add_class("mgpu-overlap")
        for control in (self.axis, self.device, self.size):
            control.observe(self._draw, names="value")
        self._draw()

    def seconds(self) -> tuple[float, float]:
        """(compute, communication) seconds for the current choice."""
        device = self._roofline.DEVICES[self.device.value]
        if self.axis.value == "tensor":
            return self._roofline.axis_seconds("tensor", device, self.n, 2048, 4096, self.size.value)
        return self._roofline.axis_seconds(self.axis.value, device, self.n, self.size.value, 4096, 16384)

    def threshold(self) -> float:
        """The size at which the current axis stops being communication-bound on the current device."""
        device = self._roofline.DEVICES[self.device.value]
        if self.axis.value == "tensor":
            return self._roofline.tensor_parallel_width(device, self.n)
        return self._roofline.data_parallel_tokens(device, self.n)

    def _draw(self, change: Any = None) -> None:
        compute, comm = self.seconds()
        exposed = max(comm - compute, 0.0)
        fig = viz.new_figure(6.5, 2.2)
        ax = fig.add_subplot(1, 1, 1)
        ax.barh(1, compute * 1e6, color=viz.PALETTE[0], label="compute")
        ax.barh(0, min(comm, compute) * 1e6, color=viz.PALETTE[1], label="communication, hidden")
        ax.barh(0, exposed * 1e6, left=min(comm, compute) * 1e6, color=viz.PALETTE[3], label="communication, exposed")
        ax.set_yticks([0, 1], ["communication", "compute"], fontsize=8)
        ax.set_xlabel("µs per weight matrix", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        self.image.value = viz.figure_png(fig, tight=False)
        what = "MLP width" if self.axis.value == "tensor" else "tokens per device"
        verdict = ("<b>communication-bound</b>: overlap hides at most the compute's length" if comm > compute
                   else "<b>compute-bound</b>: overlap can hide all of it")
        self.info.value = (f"<p>{self.axis.value} on {self.n} × {self.device.value}, {what} {self.size.value:,}: "
                           f"compute {compute * 1e6:,.1f} µs, communication {comm * 1e6:,.1f} µs; {verdict}. "
                           f"The axis turns at {what} ≈ <b>{self.threshold():,.0f}</b>.</p>")
