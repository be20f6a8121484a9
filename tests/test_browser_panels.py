"""The lessons' ipywidgets panels work in a real browser (issue 13 item 11).

nbval compares stored outputs; it cannot tell whether a student's JupyterLab renders a panel. A version
mismatch between ipywidgets and its JupyterLab extension shows "Error displaying widget" (or the widget's
text repr) and nothing else. This test starts JupyterLab the way students do (``make lab``, headless, on
127.0.0.1, a free port, a token), drives Debian's Chromium through Playwright's Python API (the system
browser: no browser download), and for every lesson that imports ipywidgets: runs all its cells, moves
the panel's first slider, presses the panel's button if it has one (``interact_manual``), and checks that
the panel's plot changed and that no widget error shows. Screenshots go to ``build/browser/``.

The lesson is opened as a copy under ``build/browser/`` so that JupyterLab's autosave never touches the
committed notebook. Skipped, with the reason, only where Chromium or Playwright is missing
(``make system-deps`` installs Chromium from Debian's packages), and failed instead under ``COURSE_CI=1``
(``tests/components.py``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from components import CHROMIUM, require_component

from course_lib.core.guard import guard_command
from course_lib.core.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "build" / "browser"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
]
#: A lesson's "Run All" on a loaded 2-core runner (Lesson 3 runs load tests) plus a margin.
RUN_ALL_TIMEOUT_S = 420
PLOT_TIMEOUT_S = 120


def lessons_with_panels() -> list[Path]:
    """Every lesson whose code imports ipywidgets (lessons 6-10 join automatically when they add a panel)."""
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        if any(re.search(r"^\s*(import|from) ipywidgets", "".join(c["source"]), re.M) for c in cells):
            found.append(path)
    return found


PANEL_LESSONS = lessons_with_panels()


def test_the_panel_lessons_are_found():
    names = [p.name for p in PANEL_LESSONS]
    assert "03_dynamic_batching.ipynb" in names and "05_cpu_gpu_cost.ipynb" in names


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """``make lab`` on a free loopback port with a token; yields (base URL, token); stopped at the end."""
    require_component("chromium")
    require_component("playwright")
    settings = tmp_path_factory.mktemp("lab-settings")
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    # Render every cell (no windowing), so the test can read each cell's prompt; no autosave surprises.
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path_factory.mktemp("lab-workspaces")),
    }
    args = f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"
    log = (tmp_path_factory.mktemp("lab-log") / "lab.log").open("w")
    proc = subprocess.Popen(
        # under the course's guard, in a group of its own: make, jupyter and its kernels stop together,
        # also when pytest itself is killed (this fixture's finally never runs then; a lab and three
        # kernels outlived a killed run)
        guard_command(["make", "-s", "lab", f"LAB_ARGS={args}"], group=True, stop_timeout_s=30),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"make lab exited with {proc.returncode}; see {log.name}")
        try:
            return httpx.get(f"{base}/api/status", params={"token": token}, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout_s=180, interval_s=0.5, what="JupyterLab did not answer on /api/status")
        yield base, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser():
    require_component("chromium")
    require_component("playwright")
    from playwright import sync_api  # here, not at the top: a missing Playwright skips (CI: fails) above

    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


#: The notebook on screen (another lesson's tab may still exist in the page).
PANEL = ".jp-NotebookPanel:visible"


def _prompts(page) -> list[str]:
    return page.locator(f"{PANEL} .jp-CodeCell .jp-InputPrompt").all_inner_texts()


def _kernel_idle(page) -> bool:
    indicator = page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator")
    return indicator.count() > 0 and indicator.first.get_attribute("data-status") == "idle"


def _run_all_and_wait(page, name: str, n_code_cells: int) -> None:
    # Wait until every cell is rendered and the kernel is idle; a Run All sent while the kernel is still
    # connecting can be dropped, so it is sent again until a cell starts.
    wait_until(
        lambda: len(_prompts(page)) == n_code_cells and _kernel_idle(page),
        timeout_s=180,
        interval_s=0.5,
        what=f"{name}: the notebook to render and its kernel to start",
    )
    for _attempt in range(5):
        page.locator(f"{PANEL} .jp-InputPrompt").first.click()  # make the notebook the current widget
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
        try:
            wait_until(
                lambda: any(p.strip() != "[ ]:" for p in _prompts(page)), timeout_s=15, interval_s=0.25
            )
            break
        except TimeoutError:
            continue
    deadline = time.monotonic() + RUN_ALL_TIMEOUT_S
    while time.monotonic() < deadline:
        errors = page.locator(
            f'{PANEL} .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
        )
        tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
        assert not tracebacks, f"{name}: a cell failed in the browser:\n{tracebacks[0][-2000:]}"
        prompts = _prompts(page)
        if prompts and all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts):
            return
        page.wait_for_timeout(1000)
    pytest.fail(f"{name}: Run All did not finish within {RUN_ALL_TIMEOUT_S} s; prompts: {_prompts(page)}")


def _panel_image(panel) -> str:
    images = panel.locator("img")
    return images.last.get_attribute("src") if images.count() else ""


@pytest.mark.parametrize("lesson", PANEL_LESSONS, ids=lambda p: p.name)
def test_panel_renders_and_redraws_in_a_real_browser(lab, browser, lesson):
    base, token = lab
    SHOTS.mkdir(parents=True, exist_ok=True)
    copy = SHOTS / lesson.name  # JupyterLab autosaves what it runs: never the committed lesson
    shutil.copyfile(lesson, copy)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        # A workspace of its own, reset: no tab of an earlier lesson is restored next to this one.
        url = f"{base}/lab/workspaces/{lesson.stem}/tree/{copy.relative_to(ROOT).as_posix()}"
        page.goto(f"{url}?reset&token={token}", timeout=120_000)
        page.locator(f"{PANEL} .jp-Cell").first.wait_for(timeout=120_000)
        n_code = sum(c["cell_type"] == "code" for c in json.loads(copy.read_text())["cells"])
        _run_all_and_wait(page, lesson.name, n_code)
        slider = page.locator(f"{PANEL} .jp-OutputArea-output .jupyter-widgets .noUi-handle").first
        slider.wait_for(timeout=60_000)
        panel = page.locator(f"{PANEL} .jp-OutputArea-output", has=page.locator(".noUi-handle")).last
        button = panel.locator("button.jupyter-button")
        if button.count():  # interact_manual: the plot appears on the first press
            button.first.click()
        wait_until(
            lambda: bool(_panel_image(panel)),
            timeout_s=PLOT_TIMEOUT_S,
            interval_s=0.5,
            what=f"{lesson.name}: the panel drew no plot",
        )
        before = _panel_image(panel)
        panel.screenshot(path=str(SHOTS / f"{lesson.stem}-before.png"))
        slider.focus()
        for _ in range(10):
            slider.press("ArrowRight")
        if button.count():
            button.first.click()
        wait_until(
            lambda: _panel_image(panel) not in ("", before),
            timeout_s=PLOT_TIMEOUT_S,
            interval_s=0.5,
            what=f"{lesson.name}: moving the slider did not redraw the plot",
        )
        panel.screenshot(path=str(SHOTS / f"{lesson.stem}-after.png"))
        page.screenshot(path=str(SHOTS / f"{lesson.stem}-page.png"), full_page=False)
        for text in ("Error displaying widget", "Loading widget..."):
            assert page.get_by_text(text).count() == 0, f"{lesson.name}: the page shows {text!r}"
    finally:
        page.close()
