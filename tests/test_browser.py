"""Widgets in a real browser: JupyterLab 4 + headless Chromium (Debian's package) via Playwright.

Each test opens, in JupyterLab, the part of a lesson its widget needs (the widget's cell and every
earlier cell it depends on: see ``widget_notebook``), runs it all, and drives the widget as a
learner would. Lesson 03: steps the all-reduce stepper and adds a device. Lesson 05: moves the
replicas slider (timing the diagram's redraw) and clicks Train, and waits for a new row in the
results table. Lesson 07: adds a pipeline stage. Lesson 08: moves a slider and clicks a toggle of
the scaling simulator. Lesson 10: moves the memory calculator's ZeRO-stage slider. Each checks the
redrawn figure and numbers. The whole lessons run under nbval in the Colab-like and Binder-like
environments; running them here again would cost a third run of each (beside the student
version's). Chromium comes from apt (``make test`` installs it when it can); Playwright's own
browser downloads are not used.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # JupyterLab in Chromium: make test runs them, make check doesn't

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MGPU_EDU_CHROMIUM", "/usr/bin/chromium")
#: Set MGPU_EDU_RESULTS_DIR to keep the measurements (browser.json) and a screenshot of the explorer.
RESULTS_DIR = os.environ.get("MGPU_EDU_RESULTS_DIR")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell reads and doesn't assign itself, names it assigns or imports); builtins left out, IPython
    magics and shell lines read as ``pass``."""
    lines = [line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!")) else line
             for line in source.splitlines()]
    stored, loaded = set(), set()
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.Name):
            (stored if isinstance(node.ctx, ast.Store | ast.Del) else loaded).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stored.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            stored.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
    return loaded - stored - set(dir(builtins)), stored


def widget_notebook(lesson: Path, widget: str):
    """The lesson cut down to what its widget needs: the code cell that builds ``widget`` and, walking back,
    the last earlier cell that assigns each name it reads, and so on (a backward slice by names). Fails if a
    name is left that no earlier cell assigns."""
    import nbformat

    nb = nbformat.read(lesson, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    [target] = [i for i, cell in enumerate(code) if f"{widget}(" in cell.source]
    names = [_names(cell.source) for cell in code]
    keep, wanted = {target}, set(names[target][0])
    for i in range(target - 1, -1, -1):
        reads, writes = names[i]
        if writes & wanted:
            keep.add(i)
            wanted = (wanted - writes) | reads
    assert not wanted, f"{lesson.name}: no cell before the {widget} assigns {sorted(wanted)}"
    nb.cells = [code[i] for i in sorted(keep)]
    return nb


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """JupyterLab 4 on 127.0.0.1 with a token and a free port, serving a temporary folder: one server for this
    module's tests (each starts its own kernel, shut down when the test ends)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}. Install Debian's package (sudo apt-get install chromium) "
                    "or set MGPU_EDU_CHROMIUM to its path; `make test` installs it when it can.")
    root = tmp_path_factory.mktemp("lab")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "MGPU_EDU_PLATFORM": "local", "JUPYTER_CONFIG_DIR": str(root / ".jupyter"),
           "JUPYTER_RUNTIME_DIR": str(root / ".runtime")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
         "--LabApp.expose_app_in_browser=True", "--ServerApp.disable_check_xsrf=False"],
        cwd=root, env=env, stdout=(root / "lab.log").open("w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start within 60 s")
        yield url, token, root
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def _shut_down_kernels(url: str, token: str) -> None:
    """Shut down every kernel the server runs (what a test's notebook started), through its REST API."""
    with urllib.request.urlopen(f"{url}/api/kernels?token={token}", timeout=10) as answer:
        kernels = json.load(answer)
    for kernel in kernels:
        request = urllib.request.Request(f"{url}/api/kernels/{kernel['id']}?token={token}", method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()


@pytest.fixture
def lab(lab_server, request, executions):
    """The module's JupyterLab, serving what one lesson's widget needs (default lesson 05) under the lesson's own
    file name; the kernel it runs in is shut down when the test ends."""
    import nbformat

    from mgpu_edu import course

    url, token, root = lab_server
    lesson = getattr(request, "param", "05_batch_scaling.ipynb")
    [widget] = course.load(ROOT / "lessons").lesson(lesson).widgets
    nbformat.write(widget_notebook(ROOT / "lessons" / lesson, widget), root / lesson)
    executions("widget's cells", lesson)
    try:
        yield url, token
    finally:
        _shut_down_kernels(url, token)


def _open_and_run_all(page, url: str, token: str, lesson: str) -> None:
    """Open a lesson in JupyterLab and start Run All once its kernel is connected and idle.

    A fresh environment can take long to start its first kernel, and a Run All sent before the
    kernel is connected is dropped (every cell stays "[ ]"). So wait until it is connected and
    idle, fail clearly if it never is, and check that Run All really started cells."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{url}/lab/tree/{lesson}?reset&token={token}")  # reset: not the last test's tabs
    page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook')", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    ready = page.evaluate("""async () => {
        const panel = window.jupyterapp.shell.currentWidget;
        await panel.sessionContext.ready;
        for (let i = 0; i < 1800; i++) {
            const kernel = panel.sessionContext.session?.kernel;
            if (kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle') return true;
            await new Promise(resolve => setTimeout(resolve, 100));
        }
        return false;
    }""")
    if not ready:
        pytest.fail(f"{lesson}: its kernel was not connected and idle within 180 s, so Run All could not start.")
    started = "Array.from(document.querySelectorAll('.jp-InputPrompt')).some(p => /\\[(\\*|\\d+)\\]/.test(p.innerText))"
    for _ in range(2):  # Run All's promise settles only when every cell has run: start it, don't await it
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        try:
            page.wait_for_function(started, timeout=60_000)
            return
        except PlaywrightTimeout:
            continue
    pytest.fail(f"{lesson}: Run All was sent twice but no cell started running.")


def _appear(page, widget, name: str, tmp_path: Path) -> None:
    """Wait for a widget to be in the page; on a timeout, fail with the notebook's error outputs."""
    try:
        widget.wait_for(state="attached", timeout=120_000)
    except Exception:
        errors = page.evaluate("Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
                               ".map(e => e.innerText).filter(t => /Error|Traceback/.test(t)).join('\\n---\\n')")
        page.screenshot(path=str(Path(RESULTS_DIR or tmp_path) / "browser-failure.png"))
        pytest.fail(f"the {name} never appeared; error outputs in the notebook:\n{errors[-3000:]}")


@pytest.fixture(scope="module")
def chromium(lab_server):
    """One headless Chromium for this module's tests, and one browser context in it: each test opens a tab of its
    own, and the tabs share the context's cache, so JupyterLab's scripts are fetched and compiled once, not once
    per test (a browser context per test made Chromium work several times as hard). It needs the server (which
    says where Chromium must be when it isn't there), and closes before the server stops."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser.new_context(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


@contextlib.contextmanager
def _lesson_widget(lab, chromium, lesson: str, selector: str, name: str, tmp_path: Path):
    """Run a notebook (a lesson cut down to its widget) in JupyterLab in a new tab of ``chromium``; yield
    (page, widget) once it has finished, widget in view. The tab is closed afterwards."""
    url, token = lab
    page = chromium.new_page()
    try:
        _open_and_run_all(page, url, token, lesson)
        widget = page.locator(selector)
        _appear(page, widget, name, tmp_path)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=180_000)
        widget.scroll_into_view_if_needed()  # JupyterLab 4 renders only the cells in view
        widget.wait_for(state="visible", timeout=30_000)
        yield page, widget
    finally:
        page.close()


def test_explorer_in_jupyterlab(lab, chromium, tmp_path):
    with _lesson_widget(lab, chromium, "05_batch_scaling.ipynb", ".mgpu-explorer", "explorer", tmp_path) as (
            page, explorer):
        rows_before = page.locator(".mgpu-results tbody tr").count()

        # move the replicas slider and time the diagram's redraw, in the browser
        latencies = []
        handle = explorer.locator(".widget-slider .noUi-handle").first
        diagram = explorer.locator(".mgpu-split-diagram")
        for key in ("ArrowRight", "ArrowRight", "ArrowLeft", "ArrowRight"):  # replicas 1 → 2 → 3 → 2 → 3
            diagram.evaluate("""el => { window._mgpuChanged = null;
                new MutationObserver((m, o) => { window._mgpuChanged = performance.now(); o.disconnect(); })
                    .observe(el, {childList: true, subtree: true, characterData: true}); }""")
            handle.focus()
            start = page.evaluate("performance.now()")
            page.keyboard.press(key)
            page.wait_for_function("window._mgpuChanged !== null", timeout=10_000)
            latencies.append(page.evaluate("window._mgpuChanged") - start)
        replicas = explorer.locator(".widget-slider .widget-readout").first.inner_text()

        explorer.locator("button", has_text="Train").click()
        page.wait_for_function(f"document.querySelectorAll('.mgpu-results tbody tr').length > {rows_before}",
                               timeout=120_000)
        last_row = page.locator(".mgpu-results tbody tr").last.inner_text()
        if RESULTS_DIR:
            explorer.screenshot(path=str(Path(RESULTS_DIR) / "explorer.png"))
        table = page.locator(".mgpu-results").inner_text()

    assert last_row.split()[0] == replicas.strip()  # the new run used the slider's value
    median = sorted(latencies)[len(latencies) // 2]
    if RESULTS_DIR:
        Path(RESULTS_DIR, "browser.json").write_text(json.dumps(
            {"redraw_ms": [round(v, 1) for v in latencies], "median_redraw_ms": round(median, 1),
             "results_table": table}, indent=1) + "\n")
    print(f"slider → diagram redraw: median {median:.0f} ms over {len(latencies)} changes (goal ≤ 100 ms)")


@pytest.mark.parametrize("lab", ["10_memory_zero.ipynb"], indirect=True)
def test_memory_calculator_redraws_in_jupyterlab(lab, chromium, tmp_path):
    """Lesson 10's memory calculator: move the ZeRO-stage slider; the bars and the numbers redraw."""
    with _lesson_widget(lab, chromium, "10_memory_zero.ipynb", ".mgpu-memory", "memory calculator", tmp_path) as (
            page, calculator):
        image = calculator.locator("img").first
        before = (image.get_attribute("src"), calculator.inner_text())
        zero = calculator.locator(".widget-slider").filter(has_text="ZeRO stage")
        readout = zero.locator(".widget-readout").inner_text().strip()
        zero.locator(".noUi-handle").focus()
        page.keyboard.press("ArrowLeft" if readout == "3" else "ArrowRight")
        page.wait_for_function("([el, src]) => el.getAttribute('src') !== src", arg=[image.element_handle(), before[0]],
                               timeout=30_000)
        after = (image.get_attribute("src"), calculator.inner_text())
        if RESULTS_DIR:
            calculator.screenshot(path=str(Path(RESULTS_DIR) / "memory-calculator.png"))
    assert after[0] and after[0] != before[0]  # a new image: the bars were redrawn
    assert after[1] != before[1]  # and the numbers with them



def _readout(widget, description: str) -> str:
    """The value of the slider named ``description``, as its handle tells assistive technology."""
    handle = widget.locator(".widget-slider").filter(has_text=description).locator(".noUi-handle")
    return handle.get_attribute("aria-valuetext").strip()


def _redraw(page, widget, act) -> tuple[str, str]:
    """Do ``act()`` and wait until the widget's figure (its first image) and its text have both changed (the
    kernel sends them one after the other); return (new src, new text)."""
    image = widget.locator("img").first
    src, text = image.get_attribute("src"), widget.inner_text()
    act()
    page.wait_for_function("([img, src, box, text]) => img.getAttribute('src') !== src && box.innerText !== text",
                           arg=[image.element_handle(), src, widget.element_handle(), text], timeout=30_000)
    return image.get_attribute("src"), widget.inner_text()


def _press(page, widget, description: str, key: str):
    """An action: focus the slider named ``description`` and press ``key`` (as a learner drags by keyboard)."""
    def act():
        widget.locator(".widget-slider").filter(has_text=description).locator(".noUi-handle").focus()
        page.keyboard.press(key)
    return act


def _shows(page, widget, expected: str) -> str:
    """Wait until the widget's text holds ``expected`` (what the package computes for the controls' new
    values); fail with what it shows instead. Returns the text."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("([box, expected]) => box.innerText.includes(expected)",
                               arg=[widget.element_handle(), expected], timeout=30_000)
    except PlaywrightTimeout:
        pytest.fail(f"the widget never showed {expected!r}; it shows:\n{widget.inner_text()}")
    return widget.inner_text()


@pytest.mark.parametrize("lab", ["03_allreduce.ipynb"], indirect=True)
def test_allreduce_stepper_in_jupyterlab(lab, chromium, tmp_path):
    """Lesson 03's stepper: a step forward redraws the chunks and the bytes sent; more devices start over."""
    from mgpu_edu import allreduce

    with _lesson_widget(lab, chromium, "03_allreduce.ipynb", ".mgpu-allreduce", "all-reduce stepper", tmp_path) as (
            page, stepper):
        n, step = int(_readout(stepper, "devices N")), int(_readout(stepper, "step"))
        trace = allreduce.simulate("ring", n, length=n * 4)
        assert 0 <= step < len(trace.steps) - 1  # there is a next step
        _redraw(page, stepper, _press(page, stepper, "step", "ArrowRight"))
        assert int(_readout(stepper, "step")) == step + 1
        _shows(page, stepper, f"Bytes sent so far, per device: {trace.bytes_sent_until(step + 1)}")

        # a new N builds a new schedule and goes back to step 0
        _redraw(page, stepper, _press(page, stepper, "devices N", "ArrowRight"))
        assert (int(_readout(stepper, "devices N")), int(_readout(stepper, "step"))) == (n + 1, 0)
        bigger = allreduce.simulate("ring", n + 1, length=(n + 1) * 4)
        _shows(page, stepper, f"Tensor size S = {bigger.total_bytes:,} bytes per device. Bytes sent so far, per "
                              f"device: {bigger.bytes_sent_until(0)}. After all {len(bigger.steps)} steps")
        if RESULTS_DIR:
            stepper.screenshot(path=str(Path(RESULTS_DIR) / "allreduce-stepper.png"))


@pytest.mark.parametrize("lab", ["12_collectives.ipynb"], indirect=True)
def test_collective_stepper_in_jupyterlab(lab, chromium, tmp_path):
    """Lesson 12's stepper on the all-to-all: a step forward redraws the chunks and the bytes sent."""
    from mgpu_edu import collectives

    with _lesson_widget(lab, chromium, "12_collectives.ipynb", ".mgpu-allreduce", "collective stepper", tmp_path) as (
            page, stepper):
        n, step = int(_readout(stepper, "devices N")), int(_readout(stepper, "step"))
        trace = collectives.simulate("all_to_all", n, rows=n * 4)
        assert 0 <= step < len(trace.steps) - 1  # there is a next step
        _redraw(page, stepper, _press(page, stepper, "step", "ArrowRight"))
        assert int(_readout(stepper, "step")) == step + 1
        _shows(page, stepper, f"Bytes sent so far, per device: {trace.bytes_sent_until(step + 1)}. After all "
                              f"{len(trace.steps)} steps: sent {trace.bytes_sent}, received {trace.bytes_received}")
        if RESULTS_DIR:
            stepper.screenshot(path=str(Path(RESULTS_DIR) / "collective-stepper.png"))


@pytest.mark.parametrize("lab", ["07_model_parallel.ipynb"], indirect=True)
def test_pipeline_explorer_in_jupyterlab(lab, chromium, tmp_path):
    """Lesson 07's explorer: one more stage redraws both schedules and the bubble it states."""
    from mgpu_edu import pipeline

    with _lesson_widget(lab, chromium, "07_model_parallel.ipynb", ".mgpu-pipeline", "pipeline explorer", tmp_path) as (
            page, explorer):
        p, m = int(_readout(explorer, "stages P")), int(_readout(explorer, "micro-batches M"))
        p_next = 7 if p == 8 else p + 1
        _redraw(page, explorer, _press(page, explorer, "stages P", "ArrowLeft" if p == 8 else "ArrowRight"))
        assert (int(_readout(explorer, "stages P")), int(_readout(explorer, "micro-batches M"))) == (p_next, m)
        _shows(page, explorer, f"{p_next - 1}/{m + p_next - 1} = {pipeline.bubble_fraction(p_next, m):.1%}")
        if RESULTS_DIR:
            explorer.screenshot(path=str(Path(RESULTS_DIR) / "pipeline-explorer.png"))


@pytest.mark.parametrize("lab", ["08_performance.ipynb"], indirect=True)
def test_scaling_simulator_in_jupyterlab(lab, chromium, tmp_path):
    """Lesson 08's simulator: a slider and a toggle button each redraw the curves and the numbers."""
    with _lesson_widget(lab, chromium, "08_performance.ipynb", ".mgpu-scaling", "scaling simulator", tmp_path) as (
            page, simulator):
        replicas = int(_readout(simulator, "replicas up to"))
        _redraw(page, simulator, _press(page, simulator, "replicas up to", "ArrowRight"))
        assert int(_readout(simulator, "replicas up to")) == replicas + 1
        after_slider = _shows(page, simulator, f"{replicas + 1} replicas: compute")
        mixed = simulator.locator(".widget-toggle-buttons button", has_text="mixed")
        _, after_toggle = _redraw(page, simulator, mixed.click)  # mixed precision's higher peak: new numbers
        if RESULTS_DIR:
            simulator.screenshot(path=str(Path(RESULTS_DIR) / "scaling-simulator.png"))
    assert after_toggle != after_slider and f"{replicas + 1} replicas: compute" in after_toggle


#: Each widget the manifest lists, and the browser test above that drives it in its lesson.
@pytest.mark.parametrize("lab", ["14_context_expert.ipynb"], indirect=True)
def test_expert_load_in_jupyterlab(lab, chromium, tmp_path):
    """Lesson 14's expert load: the capacity-factor slider and the top-k toggle each redraw the bars and restate
    the capacity, as experts.capacity computes it for the lesson's 64 tokens and 8 experts."""
    from mgpu_edu import experts

    with _lesson_widget(lab, chromium, "14_context_expert.ipynb", ".mgpu-experts", "expert load", tmp_path) as (
            page, load):
        factor = float(_readout(load, "capacity factor"))
        _redraw(page, load, _press(page, load, "capacity factor", "ArrowRight"))
        assert float(_readout(load, "capacity factor")) == factor + 0.25
        _shows(page, load, f"⌈{factor + 0.25:g} · 1 · 64 / 8⌉ = {experts.capacity(64, 8, 1, factor + 0.25)}")
        two = load.locator(".widget-toggle-buttons button", has_text="2")
        _redraw(page, load, two.click)
        after = _shows(page, load, f"⌈{factor + 0.25:g} · 2 · 64 / 8⌉ = {experts.capacity(64, 8, 2, factor + 0.25)}")
        if RESULTS_DIR:
            load.screenshot(path=str(Path(RESULTS_DIR) / "expert-load.png"))
    assert "of 128 token choices dropped" in after


@pytest.mark.parametrize("lab", ["16_capstone_3d.ipynb"], indirect=True)
def test_planner_in_jupyterlab(lab, chromium, tmp_path):
    """Lesson 16's planner: the cap slider and the job menu each recount the layouts that fit, as planner.plan
    counts them."""
    from mgpu_edu import planner

    with _lesson_widget(lab, chromium, "16_capstone_3d.ipynb", ".mgpu-planner", "planner", tmp_path) as (page, widget):
        cap = int(_readout(widget, "GB sent ≤"))
        _redraw(page, widget, _press(page, widget, "GB sent ≤", "ArrowRight"))
        assert int(_readout(widget, "GB sent ≤")) == cap + 10
        model, cluster, batch, _ = planner.PUZZLES["65B on 64 H100s"]
        count = len(planner.plan(model, cluster, batch, max_sent=(cap + 10) * 1e9))
        fit = "1 layout fits" if count == 1 else f"{count} layouts fit"
        _shows(page, widget, f"at most {cap + 10:,} GB sent per device per step: {fit}")
        _redraw(page, widget, lambda: widget.locator("select").select_option("1.4B on 4 T4s"))
        after = _shows(page, widget, "1.4 B parameters on 4 devices of 15 GiB")
        if RESULTS_DIR:
            widget.screenshot(path=str(Path(RESULTS_DIR) / "planner.png"))
    assert f"{planner.PUZZLES['1.4B on 4 T4s'][2]} sequences per step" in after


@pytest.mark.parametrize("lab", ["17_reading_published_runs.ipynb"], indirect=True)
def test_run_explorer_in_jupyterlab(lab, chromium, tmp_path):
    """Lesson 17's run explorer: choosing another tensor degree recounts the layout (fewer GPUs per replica, more
    replicas) as planner.predict counts it."""
    import dataclasses

    from mgpu_edu import planner

    with _lesson_widget(lab, chromium, "17_reading_published_runs.ipynb", ".mgpu-run-explorer", "run explorer",
                        tmp_path) as (page, widget):
        run = planner.PUBLISHED["GPT-3 175B on 64 A100s (Megatron-LM)"]
        _shows(page, widget, f"~{run.predict().seconds:,.1f} s")
        tensor = widget.locator(".widget-dropdown").filter(has_text="tensor").locator("select")
        _redraw(page, widget, lambda: tensor.select_option("4"))
        layout = dataclasses.replace(run.layout, data=2, tensor=4, micro_batches=32, sequence_parallel=None)
        after = _shows(page, widget, f"{run.predict(layout).held_total / 2**30:,.1f} GiB")
        if RESULTS_DIR:
            widget.screenshot(path=str(Path(RESULTS_DIR) / "run-explorer.png"))
    assert "DP 2 × TP 4 (SP)" in after and f"~{run.predict(layout).seconds:,.1f} s" in after


@pytest.mark.parametrize("lab", ["18_overlap.ipynb"], indirect=True)
def test_overlap_explorer_in_jupyterlab(lab, chromium, tmp_path):
    """Lesson 18's overlap explorer: the size slider and the axis toggle each recount the compute, the
    communication and the threshold, as roofline counts them."""
    from mgpu_edu import roofline

    with _lesson_widget(lab, chromium, "18_overlap.ipynb", ".mgpu-overlap", "overlap explorer", tmp_path) as (
            page, widget):
        size = int(_readout(widget, "size").replace(",", ""))
        _redraw(page, widget, _press(page, widget, "size", "ArrowRight"))
        assert int(_readout(widget, "size").replace(",", "")) == size + 64
        h100 = roofline.DEVICES["H100"]
        compute, comm = roofline.axis_seconds("fsdp", h100, 8, size + 64, 4096, 16384)
        _shows(page, widget, f"tokens per device {size + 64:,}: compute {compute * 1e6:,.1f} µs")
        tensor = widget.locator(".widget-toggle-buttons button", has_text="tensor")
        _redraw(page, widget, tensor.click)
        after = _shows(page, widget, f"≈ {roofline.tensor_parallel_width(h100, 8):,.0f}")
        if RESULTS_DIR:
            widget.screenshot(path=str(Path(RESULTS_DIR) / "overlap-explorer.png"))
    assert f"MLP width {size + 64:,}" in after


DRIVEN = {"AllReduceStepper": test_allreduce_stepper_in_jupyterlab,
          "CollectiveStepper": test_collective_stepper_in_jupyterlab,
          "ReplicaBatchExplorer": test_explorer_in_jupyterlab,
          "PipelineExplorer": test_pipeline_explorer_in_jupyterlab,
          "ScalingSimulator": test_scaling_simulator_in_jupyterlab,
          "MemoryCalculator": test_memory_calculator_redraws_in_jupyterlab,
          "ExpertLoad": test_expert_load_in_jupyterlab,
          "Planner": test_planner_in_jupyterlab,
          "RunExplorer": test_run_explorer_in_jupyterlab,
          "OverlapExplorer": test_overlap_explorer_in_jupyterlab}


def test_every_widget_a_lesson_shows_is_driven_in_the_browser():
    from mgpu_edu import course

    shown = {name for lesson in course.load(ROOT / "lessons").lessons for name in lesson.widgets}
    assert shown == set(DRIVEN), f"widgets without a browser test: {sorted(shown - set(DRIVEN))}"


def test_widget_notebook_keeps_the_cells_a_widget_needs(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell('import sys\nif "google.colab" in sys.modules:\n    %pip install x'),
        nbformat.v4.new_code_cell("from toys import Stepper\nn = 4"),
        nbformat.v4.new_markdown_cell("Some text."),
        nbformat.v4.new_code_cell("unrelated = 1\nassert unrelated"),
        nbformat.v4.new_code_cell("def size(k):\n    return k * n"),
        nbformat.v4.new_code_cell("m = size(2)"),
        nbformat.v4.new_code_cell("stepper = Stepper(n=m)\nstepper"),
        nbformat.v4.new_code_cell("stepper.step()"),
    ])
    nbformat.write(nb, tmp_path / "lesson.ipynb")
    kept = [cell.source.splitlines()[0] for cell in widget_notebook(tmp_path / "lesson.ipynb", "Stepper").cells]
    assert kept == ["from toys import Stepper", "def size(k):", "m = size(2)", "stepper = Stepper(n=m)"]
    nb.cells[5].source = "m = size(2) + missing"
    nbformat.write(nb, tmp_path / "lesson.ipynb")
    with pytest.raises(AssertionError, match=r"assigns \['missing'\]"):
        widget_notebook(tmp_path / "lesson.ipynb", "Stepper")
    # every lesson's widget: its own cell and the lesson's set-up cell at least (devices, or for a lesson whose
    # kernel never imports TensorFlow, its imports)
    from mgpu_edu import course

    for lesson in course.load(ROOT / "lessons").lessons:
        for widget in lesson.widgets:
            cells = widget_notebook(ROOT / "lessons" / lesson.file, widget).cells
            setup = "setup_devices" if lesson.tensorflow else "from mgpu_edu import"
            assert setup in cells[0].source and f"{widget}(" in cells[-1].source, (lesson.file, widget)
