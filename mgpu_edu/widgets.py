"""ipywidgets front-ends for the lessons. Works with ipywidgets 7.7 (Colab) and 8 (JupyterLab 4).

Figures are drawn with matplotlib and shown in an ``Image`` widget, which behaves the same
in both versions and needs no ``Output`` capture. Only lessons import this module.
"""

from __future__ import annotations

from typing import Any

from mgpu_edu import allreduce, viz


class AllReduceStepper:
    """Step through an all-reduce: pick N and an algorithm, then move the step slider or press play.

    Each frame shows every device's chunks after step k (which devices' data each partial sum
    holds) and arrows for what moved in step k. The schedule is the one
    :mod:`mgpu_edu.allreduce` runs on real tensors, simulated here for any N up to 16.

    Example:
        >>> AllReduceStepper(n=4, algorithm="ring")  # doctest: +SKIP
    """

    def __init__(self, n: int = 4, algorithm: str = "ring", max_n: int = 16) -> None:
        import ipywidgets as w

        if algorithm not in allreduce.ALGORITHMS:
            raise ValueError(f"algorithm={algorithm!r} is not one of {', '.join(allreduce.ALGORITHMS)}.")
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= max_n:
            raise ValueError(f"n={n!r}: pick a whole number of devices from 2 to {max_n}.")
        self.n = w.IntSlider(value=n, min=2, max=max_n, description="devices N")
        self.algorithm = w.Dropdown(options=list(allreduce.ALGORITHMS), value=algorithm, description="algorithm")
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
        self.trace = allreduce.simulate(self.algorithm.value, self.n.value, length=self.n.value * 4)
        steps = len(self.trace.steps)
        self.step.value = 0
        self.step.max = self.play.max = steps
        self._draw()

    def _draw(self, change: Any = None) -> None:
        import matplotlib.pyplot as plt

        trace, k = self.trace, self.step.value
        fig, ax = plt.subplots(figsize=(1.0 * len(trace.chunk_bytes) + 2.5, 0.5 * trace.n + 1.2))
        viz.draw_allreduce_step(trace, k, ax)
        self.image.value = viz.figure_png(fig)
        sent = [0] * trace.n
        for step in trace.steps[:k]:
            for send in step.sends:
                sent[send.src] += send.nbytes
        self.info.value = (f"<p>Tensor size S = {trace.total_bytes:,} bytes per device. Bytes sent so far, "
                           f"per device: {sent}. After all {len(trace.steps)} steps: {trace.bytes_sent}.</p>")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.root)
