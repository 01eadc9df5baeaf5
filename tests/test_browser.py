"""Lesson 04 in a real browser: JupyterLab 4 + headless Chromium (Debian's package) via Playwright.

Runs the whole notebook, moves the replicas slider (timing the diagram's redraw), clicks Train,
and waits for a new row in the results table. Chromium comes from apt (``make test`` installs
it when it can); Playwright's own browser downloads are not used.
"""

from __future__ import annotations

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
def lab(tmp_path):
    """JupyterLab 4 on 127.0.0.1 with a token and a free port, serving a copy of lesson 04."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}. Install Debian's package (sudo apt-get install chromium) "
                    "or set MGPU_EDU_CHROMIUM to its path; `make test` installs it when it can.")
    shutil.copy(ROOT / "lessons" / "04_mirrored_fit.ipynb", tmp_path / "04_mirrored_fit.ipynb")
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


def test_explorer_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    url, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/lab/tree/04_mirrored_fit.ipynb?token={token}")
        page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook')", timeout=60_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
        # Wait until the notebook's kernel is connected and idle, then start "Run All" without
        # awaiting its promise (it settles only when every cell has run).
        page.evaluate("""async () => {
            const panel = window.jupyterapp.shell.currentWidget;
            await panel.sessionContext.ready;
            for (let i = 0; i < 600; i++) {
                const kernel = panel.sessionContext.session?.kernel;
                if (kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle') break;
                await new Promise(resolve => setTimeout(resolve, 100));
            }
            window.jupyterapp.commands.execute('notebook:run-all-cells');
        }""")
        explorer = page.locator(".mgpu-explorer")
        try:
            explorer.wait_for(state="attached", timeout=120_000)
        except Exception:
            errors = page.evaluate("Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
                                   ".map(e => e.innerText).filter(t => /Error|Traceback/.test(t)).join('\\n---\\n')")
            page.screenshot(path=str(Path(RESULTS_DIR or tmp_path) / "browser-failure.png"))
            pytest.fail(f"the explorer never appeared; error outputs in the notebook:\n{errors[-3000:]}")
        # the lesson's own runs fill the table (3 rows); wait for the whole notebook to finish
        page.wait_for_function("document.querySelectorAll('.mgpu-results tbody tr').length >= 3", timeout=120_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        rows_before = page.locator(".mgpu-results tbody tr").count()
        explorer.scroll_into_view_if_needed()  # JupyterLab 4 renders only the cells in view
        explorer.wait_for(state="visible", timeout=30_000)

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
        browser.close()

    assert last_row.split()[0] == replicas.strip()  # the new run used the slider's value
    median = sorted(latencies)[len(latencies) // 2]
    if RESULTS_DIR:
        Path(RESULTS_DIR, "browser.json").write_text(json.dumps(
            {"redraw_ms": [round(v, 1) for v in latencies], "median_redraw_ms": round(median, 1),
             "results_table": table}, indent=1) + "\n")
    print(f"slider → diagram redraw: median {median:.0f} ms over {len(latencies)} changes (goal ≤ 100 ms)")
