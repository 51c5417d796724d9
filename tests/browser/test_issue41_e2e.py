"""Issue 41 in a real JupyterLab: what a user meets, item by item.

1. Every list of kernels names each kernel by its notebook (the panel, its
   notices, ``%hami status``, ``AdminPanel()``, ``hami-jupyter status``, the REST
   answers), the kernel id in a tooltip.
2. A kernel with 2.6 GiB over two GPUs of 2.0 GiB caps is charted against their
   4.0 GiB (65 %), never "over" one GPU's cap; its row says each GPU's share.
3. At 360, 1024 and 1440 px the page is no wider than the window with the panel
   open, the right tab bar (whose tab closes the panel) and the status item in
   view; at 1024 px the panel is as wide as the file browser.
4. ``AdminPanel()`` beside both side panels at 1024 px and at 360 px: nothing
   scrolls sideways or is cut, its words are plain, its rows JupyterLab's 24 px.
5. A refused allocation says in plain words first that another notebook's kernel
   holds the slice's memory, then the technical line.
6. ``%hami status``'s every text at 4.5:1 on JupyterLab's shaded rows, light and
   dark; the status item's tooltip says "over the cap" when a GPU is; a chart's
   scale at a round figure, a time axis, and the figures under the pointer.
7. The whole GPU beside the slice: utilization, memory (this slice, another slice
   of the user by name, everyone else as a total), power and temperature, charted.

Screenshots of each state, light and dark, at 360 and 1440 px:
``test-artifacts/issue41-<state>-<theme>-<width>.png``.
"""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from hami_jupyter import native
from hami_jupyter.slice.change import set_limits, set_memory_limit
from lab_server import running_lab
from test_jupyterlab_e2e import (ALLOCATE, ADMIN_CELL, ARTIFACTS, CELL_TIMEOUT_MS, CHART_HEIGHT,
                                 STATUS_CELL, STATUS_TIMEOUT_MS, TWO_GPU_KERNEL, _expect, chart,
                                 last_point, limit_y, open_notebook, sample_line, shut_down_kernels)

@pytest.fixture(scope="module")
def lab(chromium, run_tag, tmp_path_factory):
    """This module's JupyterLab: its kernels forward the library's stderr lines to the
    notebook, as they do outside pytest (item 5 reads them there)."""
    yield from running_lab(run_tag, tmp_path_factory, kernel_stderr=True)


MiB = 1 << 20
GiB = 1 << 30
CONTEXT = 64 * MiB
WIDTHS = (1440, 1024, 360)
HEIGHT = 800
MIN_CONTRAST = 4.5

CELLS = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell"


# ---- the page -----------------------------------------------------------------------------------

def run_cell(page, lab, index, expected_output):
    """Runs the notebook's cell *index* as a user does and waits for *expected_output*
    in it. Here the kernels forward the library's stderr lines (its notes, its
    refusals) to the notebook: only a traceback fails the cell."""
    cell = page.locator(CELLS).nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    output = cell.locator(".jp-OutputArea-output")
    deadline = time.monotonic() + CELL_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        texts = [output.nth(i).inner_text() for i in range(output.count())]
        if any("Traceback" in t for t in texts):
            pytest.fail(f"cell {index} failed:\n{texts}\n{lab.log_tail(3000)}", pytrace=False)
        if any(expected_output in t for t in texts):
            return
        page.wait_for_timeout(200)
    pytest.fail(f"cell {index} did not print {expected_output!r} within {CELL_TIMEOUT_MS} ms; "
                f"its output: {texts}\n{lab.log_tail(3000)}", pytrace=False)


def theme(page, name):
    """JupyterLab Light or Dark, by JupyterLab's own command (no reload: outputs stay)."""
    label = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}[name]
    page.evaluate("t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", label)
    page.wait_for_function(f"document.body.dataset.jpThemeLight === '{str(name == 'light').lower()}'",
                           timeout=30_000)
    page.wait_for_timeout(300)  # the theme's stylesheet applied


def open_path(page, lab, path, workspace=None):
    """Opens notebook *path* (in a folder of the root, say): by its address when
    *workspace* is given, else by JupyterLab's command, as the file browser does.
    Its kernel id once the kernel is idle."""
    expect = _expect()
    if workspace is not None:
        page.goto(lab.url_for(f"tree/{path}", workspace), wait_until="domcontentloaded")
    else:
        page.evaluate("p => window.jupyterapp.commands.execute('docmanager:open', {path: p})", path)
    current = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")
    expect(current).to_contain_text(os.path.basename(path), timeout=30_000)
    expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")).to_be_visible(timeout=30_000)
    kernel_id = lab.session_kernel(path)
    lab.wait_kernel_state(kernel_id, "idle")
    return kernel_id


def show_panel(page):
    """Opens the slice panel (if closed) from its tab in the right bar."""
    panel = page.locator("#hami-slice-panel")
    if not panel.is_visible():
        page.locator('.lm-TabBar-tab[data-id="hami-slice-panel"]').click()
    _expect()(panel).to_be_visible()
    return panel


def left_closed(page):
    """The left area (the file browser) closed, as a narrow-screen user keeps it."""
    if page.locator("#jp-left-stack").is_visible():
        page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current').click()
    _expect()(page.locator("#jp-left-stack")).to_be_hidden()


def left_open(page):
    if not page.locator("#filebrowser").is_visible():
        page.locator('.lm-TabBar-tab[data-id="filebrowser"]').click()
    _expect()(page.locator("#filebrowser")).to_be_visible()


def shoot(page, state, widths=(360, 1440), narrow=None):
    """Screenshots of *state* light and dark at *widths* (the page's own size after);
    *narrow(page)* readies the page for a width under 1024 px (the left area closed)."""
    ARTIFACTS.mkdir(exist_ok=True)
    before = page.viewport_size
    page.mouse.move(2, 2)
    for width in widths:
        page.set_viewport_size({"width": width, "height": HEIGHT})
        if width < 1024 and narrow is not None:
            narrow(page)
        page.wait_for_timeout(500)
        for name in ("light", "dark"):
            theme(page, name)
            page.screenshot(path=str(ARTIFACTS / f"issue41-{state}-{name}-{width}.png"))
    theme(page, "light")
    page.set_viewport_size(before)
    page.wait_for_timeout(300)


WIDTH_JS = """
() => {
  const box = sel => { const n = document.querySelector(sel); if (!n) return null;
    const r = n.getBoundingClientRect(); return {left: r.left, right: r.right, width: r.width,
      shown: !!n.offsetParent && r.width > 0}; };
  return {inner: window.innerWidth, page: document.documentElement.scrollWidth,
          body: document.body.scrollWidth,
          tabs: box('.jp-SideBar.jp-mod-right'), panel: box('#hami-slice-panel'),
          files: box('#filebrowser'), dock: box('#jp-main-dock-panel'),
          item: box('#jp-main-statusbar .hami-statusbar'), meter: box('#hami-slice-panel .hami-meter'),
          panelScroll: (n => n ? n.scrollWidth - n.clientWidth : null)(document.querySelector('#hami-slice-panel'))};
}
"""

# In the page: every text piece of the panel that is cut (wider than its box), and
# each piece that must keep to one line but does not.
PANEL_CUT_JS = """
panel => {
  // (A legend entry is nowrap by its CSS; its swatch, an empty box in the middle of
  // the line, would count as a line of its own here.)
  const whole = ['.hami-part', '.hami-chart-caption', '.hami-chart-scale', '.hami-chart-tick',
                 '.hami-kernel-memory', '.hami-kernel-sm', '.hami-panel-title'];
  const lines = node => {
    const r = document.createRange(); r.selectNodeContents(node);
    const tops = [...r.getClientRects()].filter(x => x.width > 0).map(x => Math.round(x.top));
    return new Set(tops).size;
  };
  const right = panel.getBoundingClientRect().right;
  const bad = [];
  for (const node of panel.querySelectorAll('*')) {
    if (!node.offsetParent || node.closest('[hidden]') || node.closest('svg')) continue;
    const r = node.getBoundingClientRect();
    if (r.width === 0) continue;
    if (node.scrollWidth > node.clientWidth + 1 && getComputedStyle(node).overflow !== 'visible')
      bad.push(['cut', node.className, node.textContent.slice(0, 40)]);
    if (r.right > right + 1) bad.push(['outside', node.className, node.textContent.slice(0, 40)]);
    if (whole.some(s => node.matches(s)) && node.textContent.trim() && lines(node) > 1)
      bad.push(['wraps', node.className, node.textContent.slice(0, 40)]);
  }
  return bad;
}
"""


# ---- item 3: 360, 1024, 1440 px ------------------------------------------------------------------

def test_the_panel_fits_every_window_and_the_status_item_stays(browser, lab):
    """The open panel widened a 360 px page to 400 px (its right tab bar off-screen,
    the meter cut), the status item vanished under 630 px, and at 1024 px the panel
    was 320 px beside JupyterLab's 250 px side panels."""
    expect = _expect()
    shut_down_kernels(lab)
    lab.write_notebook("fit.ipynb", "hami-python3", "Python 3 (HAMi vGPU)", [ALLOCATE])
    failures = []
    for width in WIDTHS:
        context = browser.new_context(viewport={"width": width, "height": HEIGHT})
        context.set_default_timeout(15_000)
        page = context.new_page()
        try:
            open_notebook(page, lab, "fit.ipynb", f"fit-{width}")
            if width == 1440:
                run_cell(page, lab, 0, "allocated 2 buffers of 300 MiB")
            # As a user opens it: the GPU tab in the right bar, the file browser open.
            page.locator('.lm-TabBar-tab[data-id="hami-slice-panel"]').click()
            panel = page.locator("#hami-slice-panel")
            expect(panel).to_be_visible()
            expect(panel.locator(".hami-kernel-row").first).to_be_visible(timeout=STATUS_TIMEOUT_MS)
            page.wait_for_timeout(800)
            seen = page.evaluate(WIDTH_JS)
            tag = f"{width} px"
            if seen["page"] > seen["inner"] or seen["body"] > seen["inner"]:
                failures.append(f"{tag}: the page is {seen['page']} px wide in a {seen['inner']} px window")
            if not seen["tabs"] or seen["tabs"]["right"] > seen["inner"] + 0.5:
                failures.append(f"{tag}: the right tab bar lies off-screen: {seen['tabs']}")
            if seen["panel"]["right"] > seen["inner"] + 0.5 or seen["panelScroll"] > 1:
                failures.append(f"{tag}: the panel is cut: {seen['panel']}, scrolls {seen['panelScroll']}")
            if not seen["item"] or not seen["item"]["shown"] or seen["item"]["right"] > seen["inner"] + 0.5:
                failures.append(f"{tag}: the status item is not all in view: {seen['item']}")
            if not seen["meter"] or seen["meter"]["right"] > seen["panel"]["right"] + 0.5:
                failures.append(f"{tag}: the meter is cut: {seen['meter']}")
            if width == 1024:
                # As wide as JupyterLab's own side panels: the notebook keeps its room.
                if seen["panel"]["width"] > seen["files"]["width"] + 0.5:
                    failures.append(f"{tag}: the panel is {seen['panel']['width']} px beside a "
                                    f"{seen['files']['width']} px file browser")
                if seen["dock"]["width"] < 444:
                    failures.append(f"{tag}: the notebook has {seen['dock']['width']} px")
            bad = panel.evaluate(PANEL_CUT_JS)
            if bad:
                failures.append(f"{tag}: in the panel: {bad[:6]}")
            if width == 360:
                # The status item shows the memory alone; its tooltip the rest.
                expect(page.locator("#jp-main-statusbar .hami-statusbar")).to_contain_text("vGPU 0.6 / 1.0 GiB")
        finally:
            context.close()
    assert not failures, "\n".join(failures)


# ---- items 1, 6 and 7: the panel ----------------------------------------------------------------

HOLD_300 = ("from hami_jupyter import driver_memory as c\nc.init()\n"
            "held = c.DeviceBuffer(300 << 20)\nprint('held 300 MiB')")
HOLD_100 = ("from hami_jupyter import driver_memory as c\nc.init()\n"
            "held = c.DeviceBuffer(100 << 20)\nprint('held 100 MiB')")
TRY_700 = ("from hami_jupyter import driver_memory as c\nc.init()\n"
           "try:\n    more = c.DeviceBuffer(700 << 20)\n    print('700 MiB: allocated')\n"
           "except c.CudaError:\n    print('700 MiB: refused')")
CLI_STATUS = ("import subprocess, sys\n"
              "print(subprocess.run([sys.executable, '-m', 'hami_jupyter', 'status'], capture_output=True,"
              " text=True).stdout)")


def holder_env(lab, slice_path):
    """A process of slice *slice_path* on the lab's simulated GPU, under the library."""
    return native.sim_env(lab.tmp / "sim-state", LD_PRELOAD=str(native.library_path()),
                          HAMI_SIM_DEVICES="1", HAMI_SIM_MEMORY="16g", HAMI_SIM_CONTEXT_BYTES="64m",
                          HAMI_SLICE=str(slice_path), HAMI_MEMORY_LIMIT="1g", HAMI_BROWSER_E2E_TAG=lab.tag)


class Holder:
    """A process of slice *slice_path* holding *mib* MiB on the lab's simulated GPU."""

    def __init__(self, lab, slice_path, mib):
        self.proc = subprocess.Popen([str(native.cudrive_path()), "stdin"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=holder_env(lab, slice_path))
        for line in ("init", "ctx 0", f"alloc {mib}m"):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            assert json.loads(self.proc.stdout.readline())["rc"] == 0, line

    def stop(self):
        self.proc.kill()
        self.proc.wait(10)


CONTRAST_JS = """
root => {
  const parse = c => { const m = (c || '').match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; };
  const over = (t, b) => ({r: t.r * t.a + b.r * (1 - t.a), g: t.g * t.a + b.g * (1 - t.a),
                           b: t.b * t.a + b.b * (1 - t.a), a: 1});
  const behind = node => { const chain = []; for (let n = node; n; n = n.parentElement) chain.push(n);
    let bg = {r: 255, g: 255, b: 255, a: 1};
    for (const n of chain.reverse()) { const c = parse(getComputedStyle(n).backgroundColor);
      if (c && c.a > 0) bg = over(c, bg); } return bg; };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
    return Math.round((x + 0.05) / (y + 0.05) * 1000) / 1000; };
  const seen = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const node = t.parentElement;
    if (!t.textContent.trim() || !node.offsetParent) continue;
    const bg = behind(node);
    seen.push({text: t.textContent.trim().slice(0, 30), ratio: ratio(over(parse(getComputedStyle(node).color), bg), bg)});
  }
  return seen;
}
"""


def test_notebook_names_the_whole_gpu_and_the_charts(browser, lab):
    """Items 1, 6 and 7 in one slice: two notebooks (one in a folder), another slice
    of the user (named in the whole GPU's holders) and another user's process (in
    the total of the others)."""
    expect = _expect()
    shut_down_kernels(lab)
    (lab.root / "work").mkdir(exist_ok=True)
    analysis = lab.write_notebook("work/analysis.ipynb", "hami-python3", "Python 3 (HAMi vGPU)",
                                  [HOLD_300, STATUS_CELL, ADMIN_CELL, CLI_STATUS])
    other = lab.write_notebook("other.ipynb", "hami-python3", "Python 3 (HAMi vGPU)", [HOLD_100, TRY_700])
    context = browser.new_context(viewport={"width": 1440, "height": HEIGHT})
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # carol: another user's process, whose slice file this user cannot list (a folder of its own).
    (lab.tmp / "elsewhere").mkdir(exist_ok=True)
    carol = Holder(lab, lab.tmp / "elsewhere" / "carol.slice", 200)
    try:
        kernel = open_path(page, lab, analysis, "names")
        run_cell(page, lab, 0, "held 300 MiB")
        other_kernel = open_path(page, lab, other)
        run_cell(page, lab, 0, "held 100 MiB")

        # Item 5: the refusal in other.ipynb names work/analysis.ipynb, plain words first
        # (the library's lines reach the notebook as the kernel's stderr).
        cell = page.locator(CELLS).nth(1)
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        expect(cell.locator(".jp-OutputArea-output").filter(has_text="700 MiB: refused")).to_have_count(
            1, timeout=30_000)
        said = cell.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
        expect(said.first).to_contain_text("another kernel of the slice: work/analysis.ipynb",
                                           timeout=STATUS_TIMEOUT_MS)
        text = "\n".join(said.nth(i).inner_text() for i in range(said.count()))
        plain = text.index("hami: not enough GPU memory: this notebook's slice")
        technical = text.index("hami: out of memory on GPU 0: cuMemAlloc asked for 700.0 MiB")
        assert plain < text.index("hami: To go on:") < technical, text
        assert "364.0 MiB of it by another kernel of the slice: work/analysis.ipynb" in text, text
        assert "or shut down or park work/analysis.ipynb's kernel" in text, text
        shoot(page, "out-of-memory", narrow=left_closed)

        # Item 1: the panel names both kernels by their notebooks, the id in the tooltip.
        panel = show_panel(page)
        names = panel.locator(".hami-kernel-name")
        expect(names).to_have_count(2, timeout=STATUS_TIMEOUT_MS)
        expect(panel.locator(f'.hami-kernel-row[data-kernel-id="{kernel}"] .hami-kernel-name')).to_have_text(
            "work/analysis.ipynb")
        expect(panel.locator(f'.hami-kernel-row[data-kernel-id="{other_kernel}"] .hami-kernel-name')).to_have_text(
            "other.ipynb")
        expect(panel.locator(f'.hami-kernel-row[data-kernel-id="{kernel}"] .hami-kernel-name')).to_have_attribute(
            "title", f"kernel {kernel}: work/analysis.ipynb")
        body = lab.slice_status(other_kernel)
        assert body["notebook"] == "other.ipynb"
        assert {k["kernel_id"]: k["notebook"] for k in body["kernels"]} == \
            {kernel: "work/analysis.ipynb", other_kernel: "other.ipynb"}

        # Item 7: the whole GPU: NVML's figures, this slice, another slice of this user by
        # name (bob, in the same folder), everyone else as one total (carol's 264 MiB).
        bob = Holder(lab, lab.slice_root / "bob.slice", 50)
        try:
            whole = panel.locator('.hami-panel-whole[data-gpu="0"]')
            mine = CONTEXT * 2 + 400 * MiB
            expect(whole.locator(".hami-panel-whole-holders")).to_have_text(
                "this slice 528 MiB · bob 114 MiB · others 264 MiB", timeout=STATUS_TIMEOUT_MS)
            expect(whole.locator(".hami-panel-whole-text")).to_have_text(
                re.compile(r"^Whole GPU 0 · \d+ % busy · 0\.9 / 16\.0 GiB · \d+ / 700 W · \d+ °C$"))
            (w,) = lab.slice_status(kernel)["whole_gpus"]
            assert (w["slice_used"], w["memory_used"], w["others_used"]) == \
                (mine, mine + 114 * MiB + 264 * MiB, 264 * MiB), w
            assert w["slices"] == [{"slice": "bob", "memory_used": 114 * MiB}], w
            for kind in ("util", "memory", "power", "temp"):
                c = whole.locator(f'.hami-chart-whole-{kind}[data-chart="whole-0"]')
                expect(c.locator("path.hami-chart-line")).to_have_attribute("d", re.compile("L"),
                                                                            timeout=STATUS_TIMEOUT_MS)
            memory_chart = whole.locator('.hami-chart-whole-memory')
            assert float(memory_chart.locator("svg").get_attribute("data-max")) == 16 * GiB
            expect(memory_chart.locator("path.hami-chart-second")).to_have_attribute("d", re.compile("L"))
            power = whole.locator('.hami-chart-whole-power')
            assert power.locator("path.hami-chart-limit").get_attribute("data-value") == "700"
            assert "power, last 5 min: 70 W of its 700 W limit" in power.locator("svg").get_attribute("aria-label")
            shoot(page, "panel-names-whole-gpu", narrow=left_closed)
        finally:
            bob.stop()

        # Item 6: the chart's scale tops at a round figure (1.2 GiB for the 1.0 GiB cap),
        # a time axis, and the figures under the pointer.
        kernel_memory = chart(panel, f"kernel-{kernel}", "memory")
        expect(kernel_memory.locator(".hami-chart-scale")).to_have_text("0–1.2 GiB")
        expect(kernel_memory.locator(".hami-chart-axis")).to_have_text("−5 minnow")
        label = kernel_memory.locator("svg").get_attribute("aria-label")
        assert label.startswith("Kernel work/analysis.ipynb memory, last 5 min: 364 MiB in use of the "
                                "1.0 GiB cap (36 %)"), label
        box = kernel_memory.locator("svg").bounding_box()
        page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
        caption = kernel_memory.locator(".hami-chart-caption")
        expect(caption).to_have_class(re.compile("hami-chart-readout"))
        expect(caption).to_have_text(re.compile(r"^\d\d:\d\d:\d\d · 364 MiB of the 1\.0 GiB cap$"))
        assert kernel_memory.locator("line.hami-chart-cursor").count() == 1
        page.mouse.move(2, 2)
        expect(caption).to_have_text("memory 364 MiB")

        # Item 6: the status item's tooltip says "over the cap" when a GPU is.
        item = page.locator("#jp-main-statusbar .hami-statusbar")
        path = Path(body["path"])
        set_memory_limit(path, None, 256 * MiB)
        try:
            expect(item).to_have_attribute("title", re.compile(
                r"Over the cap on GPU 0: 528 MiB in use of the 256 MiB cap; new allocations are refused"),
                timeout=STATUS_TIMEOUT_MS)
        finally:
            set_memory_limit(path, None, GiB)
        expect(item).not_to_have_attribute("title", re.compile("Over the cap"), timeout=STATUS_TIMEOUT_MS)

        # Item 1 in the notebook's outputs: %hami status, AdminPanel(), hami-jupyter status.
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="analysis.ipynb").click()
        run_cell(page, lab, 1, "hami slice")
        status = page.locator(CELLS).nth(1).locator(".jp-OutputArea-output").first
        for notebook, kid in (("work/analysis.ipynb", kernel), ("other.ipynb", other_kernel)):
            shown = status.locator(".hami-kernel-notebook", has_text=notebook)
            expect(shown).to_have_attribute("title", f"kernel {kid}")
        # Item 6: every text of it at 4.5:1 on JupyterLab's shaded rows, light and dark.
        low = []
        for name in ("light", "dark"):
            theme(page, name)
            low += [f"{name}: {t}" for t in status.evaluate(CONTRAST_JS) if t["ratio"] < MIN_CONTRAST]
        theme(page, "light")
        assert not low, low
        run_cell(page, lab, 2, "HAMi slices")
        admin = page.locator(CELLS).nth(2).locator(".jp-OutputArea-output").first
        for notebook in ("work/analysis.ipynb", "other.ipynb"):
            expect(admin.locator(".widget-html", has_text=notebook).first).to_be_visible()
        run_cell(page, lab, 3, "hami slice")
        cli = page.locator(CELLS).nth(3).locator(".jp-OutputArea-output").first.inner_text()
        assert f"    work/analysis.ipynb  ({kernel}, " in cli and f"    other.ipynb  ({other_kernel}, " in cli, cli
    finally:
        carol.stop()
        context.close()
    assert not errors, errors


# ---- item 2: a kernel on two GPUs ---------------------------------------------------------------

# 0.8 GiB on GPU 0 and 1.8 GiB on GPU 1, the 64 MiB contexts included: 2.6 GiB in all.
TWO_GPU_ALLOCATE = ("from hami_jupyter import driver_memory as c\n"
                    "c.init(0)\na = c.DeviceBuffer((819 - 64) << 20)\n"
                    "c.init(1)\nb = c.DeviceBuffer((1843 - 64) << 20)\n"
                    "print('2.6 GiB over two GPUs')")


def test_a_two_gpu_kernel_is_never_over_a_cap_no_gpu_is_over(browser, lab):
    """Its chart compared its 2.6 GiB with one GPU's 2.0 GiB cap: "2.6 GiB in use of the
    2.0 GiB cap (131 %)", its line above the cap line, beside a row tooltip of 91 %."""
    expect = _expect()
    shut_down_kernels(lab)
    name = lab.write_notebook("two-gpu-kernel.ipynb", TWO_GPU_KERNEL, "Python 3 (HAMi vGPU, two GPUs)",
                              [TWO_GPU_ALLOCATE])
    context = browser.new_context(viewport={"width": 1440, "height": HEIGHT})
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        kernel = open_notebook(page, lab, name, "two-gpu-kernel")
        status = lab.slice_status(kernel)
        set_limits(status["path"], None, memory_limit=2 * GiB)
        run_cell(page, lab, 0, "2.6 GiB over two GPUs")
        panel = show_panel(page)
        memory = chart(panel, f"kernel-{kernel}", "memory")
        limit = memory.locator("path.hami-chart-limit")
        expect(limit).to_have_attribute("data-value", str(4 * GiB), timeout=STATUS_TIMEOUT_MS)
        label = memory.locator("svg").get_attribute("aria-label")
        assert ("2.6 GiB in use on GPU 0 and GPU 1, of their 4.0 GiB of caps (65 %): GPU 0 819 MiB of its "
                "2.0 GiB cap (40 %), GPU 1 1.8 GiB of its 2.0 GiB cap (90 %)") in label, label
        assert not re.search(r"\b(1\d\d|[2-9]\d\d) %", label), label
        # The line of use below the cap line, as high as 2.6 of 4.0.
        d, top = sample_line(memory)
        _, y_used = last_point(d)
        # (The line steps up to the two caps where the kernel's memory reached GPU 1: its right end.)
        y_cap = limit_y(memory, since_x=300)
        assert y_used > y_cap, (d, y_cap)
        assert (CHART_HEIGHT - y_used) / (CHART_HEIGHT - y_cap) == pytest.approx(2662 / 4096, abs=0.01)
        # The row's tooltip: each GPU against its own cap, the same figures.
        cell = panel.locator(f'.hami-kernel-row[data-kernel-id="{kernel}"] .hami-kernel-memory')
        expect(cell).to_have_text("2.6 GiB")
        expect(cell).to_have_attribute("title", "GPU 0: 819 MiB, 40 % of its cap · GPU 1: 1.8 GiB, 90 % of its cap")
        # No word anywhere says over: the status item's tooltip, the panel's notices.
        item = page.locator("#jp-main-statusbar .hami-statusbar")
        assert "over" not in (item.get_attribute("title") or "").lower()
        expect(panel.locator(".hami-panel-held")).to_be_hidden()
        shoot(page, "two-gpu-kernel", narrow=left_closed)
    finally:
        context.close()


# ---- item 4: the admin panel --------------------------------------------------------------------

ADMIN_FIT_JS = """
out => {
  const right = out.getBoundingClientRect().right;
  const bad = [];
  for (const node of out.querySelectorAll('*')) {
    if (!node.offsetParent) continue;
    const r = node.getBoundingClientRect();
    if (r.width === 0) continue;
    if (r.right > right + 1) bad.push(['outside', node.tagName, node.className, node.textContent.slice(0, 50)]);
    const style = getComputedStyle(node);
    if (node.scrollWidth > node.clientWidth + 1 && ['auto', 'scroll', 'hidden'].includes(style.overflowX))
      bad.push(['scrolls or cut', node.tagName, node.className, node.textContent.slice(0, 50)]);
  }
  const heights = [...out.querySelectorAll('input[type=text], select, button')]
    .filter(e => e.offsetParent).map(e => Math.round(e.getBoundingClientRect().height));
  const values = [...out.querySelectorAll('input[type=text]')].map(e => e.value);
  return {bad, heights, text: [out.innerText, ...values].join(' | '), width: out.getBoundingClientRect().width};
}
"""


def test_the_admin_panel_wraps_and_speaks_plainly(browser, lab):
    """It scrolled sideways at 1024 px with both sidebars open and at 360 px (529 px of
    content in 270 px), cut its guard notice mid-word, and needed a manual for its words."""
    expect = _expect()
    shut_down_kernels(lab)
    name = lab.write_notebook("admin.ipynb", "hami-python3", "Python 3 (HAMi vGPU)", [ALLOCATE, ADMIN_CELL])
    context = browser.new_context(viewport={"width": 1024, "height": HEIGHT})
    context.set_default_timeout(15_000)
    page = context.new_page()
    failures = []
    try:
        open_notebook(page, lab, name, "admin")
        run_cell(page, lab, 0, "allocated 2 buffers of 300 MiB")
        run_cell(page, lab, 1, "HAMi slices")
        out = page.locator(CELLS).nth(1).locator(".jp-OutputArea-output").first
        expect(out).to_contain_text("limits for")
        for width, layout in ((1024, "both side panels open"), (360, "the left area closed")):
            page.set_viewport_size({"width": width, "height": HEIGHT})
            if width == 1024:
                left_open(page)
                show_panel(page)
            else:
                left_closed(page)
                if page.locator("#hami-slice-panel").is_visible():
                    page.locator('.lm-TabBar-tab[data-id="hami-slice-panel"]').click()
            page.wait_for_timeout(800)
            seen = out.evaluate(ADMIN_FIT_JS)
            if seen["bad"]:
                failures.append(f"{width} px, {layout}, {seen['width']:.0f} px wide: {seen['bad'][:5]}")
            if any(h > 24 for h in seen["heights"]):
                failures.append(f"{width} px: rows of {sorted(set(seen['heights']))} px, not 24")
        text = seen["text"]
        for jargon in ("kept for slices", "the guard sees", "overcommit", "default", "mode"):
            if jargon in text:
                failures.append(f"the words need a manual: {jargon!r}")
        for plain in ("guaranteed to users", "not measured", "always kept", "whole cap", "above the share",
                      "allow promising more memory than a GPU has", "No guard is running"):
            if plain not in text:
                failures.append(f"missing: {plain!r}")
        note = out.locator(".hami-guard-note")
        if not note.inner_text().rstrip().endswith("(as root)."):
            failures.append(f"the notice ends in {note.inner_text()[-40:]!r}")
        if "guard.json" not in (note.get_attribute("title") or ""):
            failures.append("the notice's technical note (the report's path) is not its tooltip")
        shoot(page, "admin-panel", narrow=left_closed)
    finally:
        context.close()
    assert not failures, "\n".join(failures)
