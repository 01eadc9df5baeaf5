"""Lessons in a real browser: JupyterLab 4 + headless Chromium (Debian's package) via Playwright.

Lesson 05: runs the whole notebook, moves the replicas slider (timing the diagram's redraw),
clicks Train, and waits for a new row in the results table. Lesson 10: moves the memory
calculator's ZeRO-stage slider and waits for the bars to redraw. Chromium comes from apt
(``make test`` installs it when it can); Playwright's own browser downloads are not used.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MGPU_EDU_CHROMIUM", "/usr/bin/chromium")
#: Set MGPU_EDU_RESULTS_DIR to keep the measurements (browser.json) and a screenshot of the explorer.
RESULTS_DIR = os.environ.get("MGPU_EDU_RESULTS_DIR")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path, request):
    """JupyterLab 4 on 127.0.0.1 with a token and a free port, serving a copy of one lesson (default 05)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}. Install Debian's package (sudo apt-get install chromium) "
                    "or set MGPU_EDU_CHROMIUM to its path; `make test` installs it when it can.")
    lesson = getattr(request, "param", "05_batch_scaling.ipynb")
    shutil.copy(ROOT / "lessons" / lesson, tmp_path / lesson)
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "MGPU_EDU_PLATFORM": "local", "JUPYTER_CONFIG_DIR": str(tmp_path / ".jupyter"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / ".runtime")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}", "--allow-root",
         "--LabApp.expose_app_in_browser=True", "--ServerApp.disable_check_xsrf=False"],
        cwd=tmp_path, env=env, stdout=(tmp_path / "lab.log").open("w"), stderr=subprocess.STDOUT,
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
        yield url, token
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def _open_and_run_all(page, url: str, token: str, lesson: str) -> None:
    """Open a lesson in JupyterLab and start Run All once its kernel is connected and idle.

    A fresh environment can take long to start its first kernel, and a Run All sent before the
    kernel is connected is dropped (every cell stays "[ ]"). So wait until it is connected and
    idle, fail clearly if it never is, and check that Run All really started cells."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{url}/lab/tree/{lesson}?token={token}")
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


@contextlib.contextmanager
def _lesson_widget(lab, lesson: str, selector: str, name: str, tmp_path: Path, ready: str = ""):
    """Run a whole lesson in JupyterLab in Chromium; yield (page, widget) once it has finished, widget in view.

    ``ready`` is a JavaScript condition to wait for too before the notebook counts as finished."""
    from playwright.sync_api import sync_playwright

    url, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _open_and_run_all(page, url, token, lesson)
            widget = page.locator(selector)
            _appear(page, widget, name, tmp_path)
            if ready:
                page.wait_for_function(ready, timeout=120_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=180_000)
            widget.scroll_into_view_if_needed()  # JupyterLab 4 renders only the cells in view
            widget.wait_for(state="visible", timeout=30_000)
            yield page, widget
        finally:
            browser.close()


def test_explorer_in_jupyterlab(lab, tmp_path):
    # the lesson's own runs fill the table (3 rows) before the explorer is used
    with _lesson_widget(lab, "05_batch_scaling.ipynb", ".mgpu-explorer", "explorer", tmp_path,
                        ready="document.querySelectorAll('.mgpu-results tbody tr').length >= 3") as (page, explorer):
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
def test_memory_calculator_redraws_in_jupyterlab(lab, tmp_path):
    """Lesson 10's memory calculator: move the ZeRO-stage slider; the bars and the numbers redraw."""
    with _lesson_widget(lab, "10_memory_zero.ipynb", ".mgpu-memory", "memory calculator", tmp_path) as (
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

