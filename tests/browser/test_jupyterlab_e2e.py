"""The JupyterLab extension in a real browser (issue 6).

Headless Chromium opens a notebook on the ``hami-python3`` kernel in a real
JupyterLab whose kernels run in a 1 GiB, SM 25 % slice of the simulated GPU
(conftest.py). The notebook allocates 600 MiB (664 MiB with the 64 MiB
context, 65 %): the status bar item appears, "ok"; then 200 MiB more
(864 MiB, 84 %): it turns "warning", in another colour. The slice panel,
opened from the item, lists the kernel with its 864 MiB; the screenshot
``test-artifacts/jupyterlab-slice.png`` shows that moment. Restarting the
kernel from the panel (after its confirmation dialog) gives the memory back:
a new kernel process, 0 B, the item "ok" again. A notebook on the plain
``python3`` kernel has no status item, and switching tabs shows and hides it.

The panel's live charts (issue 16): while a kernel allocates 50 MiB at a time
the memory charts of its GPU and of the kernel draw, and two samples of their
lines some seconds apart differ, the later one ending higher; the cap line
lies at the 1 GiB cap and the SM share line at 25 %; each chart's label says
the latest figures in words; and at JupyterLab's default layout the panel
opens wide enough that none of its text rows wraps or is cut. The screenshot
``test-artifacts/jupyterlab-slice-charts.png`` shows the charts.
"""

import json
import re
import time
from pathlib import Path

import pytest
from fake_guard import write_guard

from hami_jupyter.slice.change import set_memory_limit
from hami_jupyter.slice.guard_report import report_path, write_report

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

CELL_TIMEOUT_MS = 30_000
# The item polls every 500 ms: a few polls, with room for a slow machine.
STATUS_TIMEOUT_MS = 10_000
SCREENSHOT = ARTIFACTS / "jupyterlab-slice.png"
CHARTS_SCREENSHOT = ARTIFACTS / "jupyterlab-slice-charts.png"

ALLOCATE = ("from hami_jupyter import driver_memory as c\n"
            "c.init()\n"
            "b = [c.DeviceBuffer(300 << 20) for _ in range(2)]\n"
            "print('allocated', len(b), 'buffers of 300 MiB')")
ALLOCATE_MORE = ("b.append(c.DeviceBuffer(200 << 20))\n"
                 "print('allocated 200 MiB more')")
# 12 x 50 MiB, one every 0.6 s: about 7 s of memory use going up.
ALLOCATE_STEPS = ("import time\n"
                  "from hami_jupyter import driver_memory as c\n"
                  "c.init()\n"
                  "b = []\n"
                  "for _ in range(12):\n"
                  "    b.append(c.DeviceBuffer(50 << 20))\n"
                  "    time.sleep(0.6)\n"
                  "print('allocated 12 buffers of 50 MiB')")
STEPS_TOTAL = 64 * (1 << 20) + 12 * 50 * (1 << 20)  # the context and the buffers: 664 MiB

# chartview.ts / chart.ts: every chart's viewBox, and how far apart two samples of a line are taken.
CHART_HEIGHT = 40
# style/base.css: the panel's minimum width; it may be dragged wider (issue 35, item 3).
# Issue 41, item 3: as wide as JupyterLab's own side panels (--jp-sidebar-min-width).
PANEL_MIN_WIDTH = 250
SAMPLE_GAP_MS = 2_500

# statusText() in labextension/src/format.ts: GiB with one decimal, SM in whole percent.
OK_TEXT = re.compile(r"^vGPU 0\.6 / 1\.0 GiB · SM \d+ % / 25 %$")  # 664 MiB
WARNING_TEXT = re.compile(r"^vGPU 0\.8 / 1\.0 GiB · SM \d+ % / 25 %$")  # 864 MiB
EMPTY_TEXT = re.compile(r"^vGPU 0\.0 / 1\.0 GiB · SM \d+ % / 25 %$")
ANY_SLICE_TEXT = re.compile(r"^vGPU \d+\.\d / 1\.0 GiB · SM \d+ % / 25 %$")

MiB = 1 << 20
GiB = 1 << 30
PARKED_WHY = "held 1.5 GiB past the slice's cap without the preload library"


def _expect():
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect


def level_class(level):
    return re.compile(rf"(^|\s)hami-level-{level}(\s|$)")


def background(locator):
    return locator.evaluate("node => getComputedStyle(node).backgroundColor")


def open_notebook(page, lab, name, workspace):
    """Opens notebook *name* in JupyterLab; its kernel id once the kernel is idle."""
    expect = _expect()
    page.goto(lab.url_for(f"tree/{name}", workspace), wait_until="domcontentloaded")
    current_tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")
    expect(current_tab).to_contain_text(name, timeout=30_000)
    expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")).to_be_visible(
        timeout=30_000)
    kernel_id = lab.session_kernel(name)
    lab.wait_kernel_state(kernel_id, "idle")
    return kernel_id


def run_cell(page, lab, index, expected_output):
    """Runs the notebook's cell *index* the way a user does (click, Shift+Enter)
    and waits for *expected_output* in it; fails with the cell's output on an error."""
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    output = cell.locator(".jp-OutputArea-output")
    error = cell.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    deadline = time.monotonic() + CELL_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        if error.count():
            pytest.fail(f"cell {index} failed:\n{error.first.inner_text()}\n{lab.log_tail(3000)}",
                        pytrace=False)
        if output.count() and expected_output in output.first.inner_text():
            return
        page.wait_for_timeout(200)
    texts = [output.nth(i).inner_text() for i in range(output.count())]
    pytest.fail(f"cell {index} did not print {expected_output!r} within {CELL_TIMEOUT_MS} ms; "
                f"its output: {texts}\n{lab.log_tail(3000)}", pytrace=False)


def test_hami_notebook_status_bar_warning_panel_and_restart(page, lab):
    expect = _expect()
    name = lab.write_notebook("slice.ipynb", "hami-python3", "Python 3 (HAMi vGPU)",
                              [ALLOCATE, ALLOCATE_MORE])
    kernel_id = open_notebook(page, lab, name, "slice")
    item = page.locator("#jp-main-statusbar .hami-statusbar")

    # 600 MiB + the 64 MiB context: 65 % of the 1 GiB cap, "ok".
    run_cell(page, lab, 0, "allocated 2 buffers of 300 MiB")
    expect(item).to_be_visible(timeout=STATUS_TIMEOUT_MS)
    expect(item).to_have_text(OK_TEXT, timeout=STATUS_TIMEOUT_MS)
    expect(item).to_have_class(level_class("ok"))
    status = lab.slice_status(kernel_id)
    assert status["in_slice"] and status["memory_used"] == 664 * MiB, status
    ok_colour = background(item)

    # 200 MiB more: 864 MiB, 84 %, past the 80 % warning threshold.
    run_cell(page, lab, 1, "allocated 200 MiB more")
    expect(item).to_have_class(level_class("warning"), timeout=STATUS_TIMEOUT_MS)
    expect(item).to_have_text(WARNING_TEXT)
    warning_colour = background(item)
    assert warning_colour != ok_colour, (ok_colour, warning_colour)
    assert warning_colour not in ("rgba(0, 0, 0, 0)", "transparent"), warning_colour

    # A click on the item opens the panel; it lists this kernel with its memory.
    item.click()
    panel = page.locator("#hami-slice-panel")
    expect(panel).to_be_visible()
    row = panel.locator(f'.hami-kernel-row[data-kernel-id="{kernel_id}"]')
    expect(row).to_be_visible(timeout=STATUS_TIMEOUT_MS)
    expect(row).to_have_class(re.compile(r"(^|\s)hami-kernel-current(\s|$)"))
    expect(row.locator(".hami-kernel-memory")).to_have_text("864 MiB", timeout=STATUS_TIMEOUT_MS)
    expect(panel.locator(".hami-panel-usage")).to_have_text(WARNING_TEXT)
    expect(panel.locator(".hami-panel-usage")).to_have_class(level_class("warning"))
    old_pid = lab.slice_status(kernel_id)["kernels"][0]["pid"]
    expect(row.locator(".hami-kernel-meta")).to_contain_text(f"pid {old_pid}")

    # The screenshot: notebook with its outputs, the orange status item, the panel.
    page.mouse.move(700, 450)  # over the notebook: no hover highlight on the item or a button
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 10_000

    # Issue 27: an administrator lowers the cap below the 864 MiB in use, and the
    # guard parked a process of the slice: the panel says both, in plain words.
    slice_file = Path(status["path"])
    set_memory_limit(slice_file, None, 512 * MiB)
    report = write_guard(slice_file.parent, {}, action="park")
    write_report({**report, "parked": [{"pid": 4242, "slice": slice_file.stem, "user": "tester",
                                        "command": "python train.py", "process_bytes": 1536 * MiB,
                                        "unix": report["written_unix"], "why": PARKED_WHY}]},
                 slice_file.parent)
    expect(panel.locator(".hami-panel-held")).to_contain_text(
        "over its new 512 MiB cap since", timeout=STATUS_TIMEOUT_MS)
    expect(panel.locator(".hami-panel-held")).to_contain_text("held before the change")
    parked_note = panel.locator(".hami-panel-guard-parked")
    expect(parked_note).to_contain_text("pid 4242 (python train.py) parked by the guard")
    expect(parked_note).to_contain_text(PARKED_WHY)
    set_memory_limit(slice_file, None, GiB)
    report_path(slice_file.parent).unlink()
    expect(parked_note).to_be_hidden(timeout=STATUS_TIMEOUT_MS)
    expect(panel.locator(".hami-panel-held")).to_be_hidden()

    # Restart from the panel, after the confirmation dialog.
    row.locator(".hami-kernel-restart").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Restart kernel")
    dialog.locator(".jp-mod-accept").click()
    expect(dialog).to_be_hidden()

    # A new kernel process under the same id; the old one's 864 MiB went back to the slice.
    expect(row.locator(".hami-kernel-memory")).to_have_text("0 B", timeout=STATUS_TIMEOUT_MS)
    expect(row.locator(".hami-kernel-meta")).not_to_contain_text(f"pid {old_pid}",
                                                                 timeout=STATUS_TIMEOUT_MS)
    expect(item).to_have_text(EMPTY_TEXT, timeout=STATUS_TIMEOUT_MS)
    expect(item).to_have_class(level_class("ok"))
    assert background(item) == ok_colour
    lab.wait_kernel_state(kernel_id, "idle")
    status = lab.slice_status(kernel_id)
    assert status["memory_used"] == 0, status
    (entry,) = [k for k in status["kernels"] if k["kernel_id"] == kernel_id]
    assert entry["pid"] and entry["pid"] != old_pid, (old_pid, entry)
    assert not page.page_errors, page.page_errors


def test_plain_python3_notebook_has_no_status_item(page, lab):
    expect = _expect()
    lab.write_notebook("in-slice.ipynb", "hami-python3", "Python 3 (HAMi vGPU)")
    plain = lab.write_notebook("plain.ipynb", "python3", "Python 3 (ipykernel)")
    open_notebook(page, lab, "in-slice.ipynb", "plain")
    item = page.locator("#jp-main-statusbar .hami-statusbar")
    expect(item).to_be_visible(timeout=STATUS_TIMEOUT_MS)
    expect(item).to_have_text(ANY_SLICE_TEXT)

    # Open the plain notebook from the file browser, as a user does.
    page.locator(".jp-DirListing-item", has_text=plain).dblclick()
    expect(page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")).to_contain_text(plain)
    plain_kernel = lab.session_kernel(plain)
    lab.wait_kernel_state(plain_kernel, "idle")
    assert lab.slice_status(plain_kernel)["in_slice"] is False
    expect(item).to_be_hidden(timeout=STATUS_TIMEOUT_MS)
    # Still hidden after a few polls of the plain kernel's (empty) slice status.
    page.wait_for_timeout(4 * 500)
    expect(item).to_be_hidden()

    # Back on the slice's notebook the item shows again, and hides again on the plain one.
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="in-slice.ipynb").click()
    expect(item).to_be_visible(timeout=STATUS_TIMEOUT_MS)
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=plain).click()
    expect(item).to_be_hidden(timeout=STATUS_TIMEOUT_MS)
    assert not page.page_errors, page.page_errors


def start_cell(page, index):
    """Starts the notebook's cell *index* the way a user does, without waiting for it."""
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    return cell


def chart(panel, key, kind):
    """The chart ``data-chart=key`` (``gpu-0``, ``kernel-<id>``) of *kind* (memory or sm)."""
    return panel.locator(f'.hami-chart-{kind}[data-chart="{key}"]')


LAST_POINT = re.compile(r"(-?[\d.]+) (-?[\d.]+)$")


def last_point(d):
    """The last (x, y) of an SVG path's ``d`` (chart.ts writes "M x y L x y …")."""
    match = LAST_POINT.search(d or "")
    assert match, f"no point in the path {d!r}"
    return float(match.group(1)), float(match.group(2))


def sample_line(locator):
    """``(d, scale top)`` of a chart's line now."""
    d = locator.locator("path.hami-chart-line").get_attribute("d")
    top = float(locator.locator("svg.hami-chart-svg").get_attribute("data-max"))
    return d, top


def limit_y(locator, since_x=0.0):
    """The y of a chart's cap or share line, which must be level from *since_x*
    to the chart's right edge (0: across the whole chart, "M0 yH300"). Where the
    history has another limit earlier, chart.ts steps: "M0 y1H x V y2 H300"."""
    d = locator.locator("path.hami-chart-limit").get_attribute("d") or ""
    steps = re.findall(r"([MHV])(-?[\d.]+)(?: (-?[\d.]+))?", d)
    assert steps and steps[0][0] == "M" and steps[-1][:2] == ("H", "300"), f"no limit line: {d!r}"
    x, y = float(steps[0][1]), float(steps[0][2])
    for cmd, value, _ in steps[1:-1]:
        if cmd == "H":
            x = float(value)
        else:
            assert cmd == "V", f"a limit line is level steps: {d!r}"
            y = float(value)
    assert x <= since_x, f"the limit line is not level from x {since_x} on: {d!r}"
    return y


# In the page: every text row of the panel, whether it is cut (its text wider
# than its box), and every piece that must stay on one line (a part of a row
# between its " · ", a figure, a caption, a name), with the number of line
# boxes it lays out in; the panel's width and minimum width and whether it
# scrolls sideways. A row may wrap between its parts at 250 px, never inside one.
ROWS_JS = """
panel => {
  const selectors = ['.hami-panel-title', '.hami-panel-usage', '.hami-panel-gpu-text',
    '.hami-chart-legend', '.hami-chart-caption', '.hami-chart-scale', '.hami-kernel-table th',
    '.hami-kernel-name', '.hami-kernel-meta', '.hami-kernel-memory', '.hami-kernel-sm',
    '.hami-part', '.hami-legend-entry'];
  // Each on one line (a legend entry is nowrap by its CSS; its swatch, an empty
  // box set in the middle of the line, would count as a line of its own here).
  const whole = new Set(['.hami-chart-caption', '.hami-chart-scale', '.hami-kernel-table th',
    '.hami-kernel-name', '.hami-kernel-memory', '.hami-kernel-sm', '.hami-part',
    '.hami-panel-title']);
  const lines = node => {
    const range = document.createRange();
    range.selectNodeContents(node);
    const tops = [...range.getClientRects()].filter(r => r.width > 0).map(r => r.top);
    // Line boxes: tops further apart than half a line are different lines.
    const height = parseFloat(getComputedStyle(node).fontSize) || 13;
    const distinct = [];
    for (const top of tops.sort((a, b) => a - b)) {
      if (!distinct.length || top - distinct[distinct.length - 1] > height / 2) distinct.push(top);
    }
    return distinct.length;
  };
  const rows = [];
  for (const selector of selectors) {
    for (const node of panel.querySelectorAll(selector)) {
      if (node.closest('[hidden]') || node.textContent.trim() === '') continue;
      rows.push({selector, text: node.textContent, lines: whole.has(selector) ? lines(node) : 1,
                 cut: node.scrollWidth > node.clientWidth + 1});
    }
  }
  // A row's buttons lie side by side.
  for (const cell of panel.querySelectorAll('.hami-kernel-actions')) {
    const tops = [...cell.querySelectorAll('button:not([hidden])')]
      .map(b => Math.round(b.getBoundingClientRect().top));
    rows.push({selector: '.hami-kernel-actions', text: `${tops.length} buttons`,
               lines: new Set(tops).size, cut: false});
  }
  const style = getComputedStyle(panel);
  return {rows, width: panel.getBoundingClientRect().width, minWidth: parseFloat(style.minWidth),
          scrolls: panel.scrollWidth > panel.clientWidth + 1};
}
"""


def test_panel_charts_draw_move_and_rows_fit(page, lab):
    expect = _expect()
    name = lab.write_notebook("charts.ipynb", "hami-python3", "Python 3 (HAMi vGPU)",
                              [ALLOCATE_STEPS])
    kernel_id = open_notebook(page, lab, name, "charts")

    # The panel, from the status bar item, at JupyterLab's default layout.
    item = page.locator("#jp-main-statusbar .hami-statusbar")
    expect(item).to_be_visible(timeout=STATUS_TIMEOUT_MS)
    item.click()
    panel = page.locator("#hami-slice-panel")
    expect(panel).to_be_visible()
    expect(panel.locator(f'.hami-kernel-row[data-kernel-id="{kernel_id}"]')).to_be_visible(
        timeout=STATUS_TIMEOUT_MS)
    gpu_memory = chart(panel, "gpu-0", "memory")
    kernel_memory = chart(panel, f"kernel-{kernel_id}", "memory")
    # The kernel's charts at once; its GPU's once a kernel of the slice used one.
    for locator in (kernel_memory, chart(panel, f"kernel-{kernel_id}", "sm")):
        expect(locator.locator("svg.hami-chart-svg")).to_be_visible()
    expect(panel.locator(".hami-chart-legend")).to_contain_text("Last 5 min")

    # While the kernel allocates, two samples of each memory line some seconds apart.
    cell = start_cell(page, 0)
    deadline = time.monotonic() + CELL_TIMEOUT_MS / 1000
    while lab.slice_status(kernel_id)["kernel"]["memory_used"] < 200 * MiB:
        assert time.monotonic() < deadline, lab.slice_status(kernel_id)
        page.wait_for_timeout(200)
    for locator in (gpu_memory, chart(panel, "gpu-0", "sm")):
        expect(locator.locator("svg.hami-chart-svg")).to_be_visible(timeout=STATUS_TIMEOUT_MS)
    expect(gpu_memory.locator("path.hami-chart-line")).to_have_attribute("d", re.compile("L"))
    first = {"gpu": sample_line(gpu_memory), "kernel": sample_line(kernel_memory)}
    used_at_first = lab.slice_status(kernel_id)["kernel"]["memory_used"]
    page.wait_for_timeout(SAMPLE_GAP_MS)
    second = {"gpu": sample_line(gpu_memory), "kernel": sample_line(kernel_memory)}
    used_at_second = lab.slice_status(kernel_id)["kernel"]["memory_used"]
    # The kernel was still allocating between the two samples (else nothing had to move).
    assert used_at_second >= used_at_first + 100 * MiB, (used_at_first, used_at_second)
    for which in ("gpu", "kernel"):
        (d1, top1), (d2, top2) = first[which], second[which]
        assert d1 and d2 and d1 != d2, (which, d1, d2)
        # The same scale (the cap's) both times, so a smaller y is more memory: higher up.
        assert top1 == top2, (which, top1, top2)
        (_, y1), (_, y2) = last_point(d1), last_point(d2)
        assert y2 < y1, f"the {which} chart's last point did not rise: {y1} -> {y2}"

    output = cell.locator(".jp-OutputArea-output")
    expect(output.first).to_contain_text("allocated 12 buffers of 50 MiB", timeout=CELL_TIMEOUT_MS)
    status = lab.slice_status(kernel_id)
    cap = status["gpus"][0]["memory_limit"]
    assert cap == 1 << 30 and status["memory_limit"] == cap, status
    assert status["kernel"]["memory_used"] == STEPS_TOTAL, status
    expect(kernel_memory.locator(".hami-chart-caption")).to_have_text("memory 664 MiB",
                                                                      timeout=STATUS_TIMEOUT_MS)

    # The cap line lies at the cap on both memory charts: in the SVG's units, and on the screen.
    # The kernel's, level across its chart; the GPU's, from this kernel's first sample on (the
    # module's lab lowered the cap to 512 MiB in an earlier test, which the GPU's history keeps).
    kernel_start = float(re.match(r"M(-?[\d.]+)", sample_line(kernel_memory)[0]).group(1))
    for locator, since_x in ((gpu_memory, kernel_start), (kernel_memory, 0.0)):
        assert locator.locator("path.hami-chart-limit").get_attribute("data-value") == str(cap)
        _, top = sample_line(locator)
        y_cap = limit_y(locator, since_x)
        assert y_cap == pytest.approx(CHART_HEIGHT * (1 - cap / top), abs=0.01), (y_cap, top)
        box = locator.locator("svg.hami-chart-svg").bounding_box()
        line = locator.locator("path.hami-chart-limit").bounding_box()
        drawn = (box["y"] + box["height"] - line["y"]) / box["height"]
        assert drawn == pytest.approx(cap / top, abs=0.03), (box, line, top)
        # And the line of use against it: 664 MiB of the 1 GiB cap, as high as that.
        d, _ = sample_line(locator)
        _, y_used = last_point(d)
        ratio = (CHART_HEIGHT - y_used) / (CHART_HEIGHT - y_cap)
        assert ratio == pytest.approx(STEPS_TOTAL / cap, abs=0.01), (d, y_cap)
    # The SM share line at 25 % of the whole GPU.
    for key in ("gpu-0", f"kernel-{kernel_id}"):
        sm = chart(panel, key, "sm")
        assert sm.locator("path.hami-chart-limit").get_attribute("data-value") == "25"
        assert limit_y(sm) == pytest.approx(CHART_HEIGHT * 0.75, abs=0.01)

    # Each chart says its latest figures in words (title and aria-label).
    svg = kernel_memory.locator("svg.hami-chart-svg")
    label = svg.get_attribute("aria-label")
    assert svg.get_attribute("role") == "img"
    assert label.startswith(f"Kernel {name} memory, last 5 min: 664 MiB in use of the "
                            "1.0 GiB cap (65 %)"), label
    assert svg.locator("title").text_content() == label
    sm_label = chart(panel, "gpu-0", "sm").locator("svg").get_attribute("aria-label")
    assert re.fullmatch(r"GPU 0 SM, last 5 min: \d+ % in use of a 25 % share; highest \d+ %",
                        sm_label), sm_label

    # Captions readable (not 9 px), each chart's scale said (issue 35, item 6).
    caption = kernel_memory.locator(".hami-chart-caption")
    assert float(caption.evaluate("n => getComputedStyle(n).fontSize")[:-2]) >= 10
    _, top = sample_line(kernel_memory)
    expect(kernel_memory.locator(".hami-chart-scale")).to_have_text(
        re.compile(r"^0–\d+(\.\d)? (MiB|GiB)$"))
    unit = GiB if top >= GiB else MiB
    shown = float(kernel_memory.locator(".hami-chart-scale").text_content()[2:-4])
    assert abs(shown - top / unit) <= 0.05 * top / unit, (shown, top)
    expect(chart(panel, "gpu-0", "sm").locator(".hami-chart-scale")).to_have_text("0–100 %")

    # No text row of the panel is cut, no part of one wraps inside, and the panel
    # does not scroll sideways.
    layout = panel.evaluate(ROWS_JS)
    assert layout["minWidth"] == PANEL_MIN_WIDTH and layout["width"] >= PANEL_MIN_WIDTH, layout
    assert not layout["scrolls"], layout
    checked = {row["selector"] for row in layout["rows"]}
    assert {".hami-panel-usage", ".hami-panel-gpu-text", ".hami-kernel-meta", ".hami-part",
            ".hami-chart-legend", ".hami-kernel-actions"} <= checked, checked
    bad = [row for row in layout["rows"] if row["lines"] != 1 or row["cut"]]
    assert not bad, f"panel rows that are cut or parts that wrap at {layout['width']}px: {bad}"

    page.mouse.move(700, 450)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(CHARTS_SCREENSHOT), full_page=True)

    # A page opened later draws the minutes before it: the server kept them
    # (issue 35, item 6; the charts started over at every page load).
    reloaded = time.monotonic()
    page.reload(wait_until="domcontentloaded")
    expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")).to_be_visible(
        timeout=30_000)
    if not panel.is_visible():
        item.click()
    expect(kernel_memory.locator("path.hami-chart-line")).to_have_attribute(
        "d", re.compile("L"), timeout=STATUS_TIMEOUT_MS)
    page.wait_for_function(
        """([sel, seconds]) => {
             const d = document.querySelector(sel)?.getAttribute('d') || '';
             const xs = [...d.matchAll(/[ML](-?[\\d.]+) /g)].map(m => parseFloat(m[1]));
             return xs.length > 1 && Math.max(...xs) - Math.min(...xs) > seconds;
           }""",
        arg=[f'.hami-chart-memory[data-chart="kernel-{kernel_id}"] path.hami-chart-line',
             time.monotonic() - reloaded + 10], timeout=STATUS_TIMEOUT_MS)
    assert not page.page_errors, page.page_errors


# ---- a slice on two GPUs (issue 26, item 4) ----------------------------------------------------

# conftest.py's kernelspec on two simulated GPUs, and its slice.
TWO_GPU_KERNEL = "hami-two-gpus"
TWO_GPU_SLICE = "two-gpus"
GiB = 1 << 30
TWO_GPU_CAP = 4 * GiB  # per GPU; the slice's two caps add up to 8 GiB, which nothing may show
# 3.5 GiB on GPU 0 with its 64 MiB context; then 1 GiB more does not fit GPU 0's 4 GiB.
ALLOCATE_TWO_GPUS = ("from hami_jupyter import driver_memory as c\n"
                     "c.init(0)\n"
                     "held = [c.DeviceBuffer((3584 - 64) << 20)]\n"
                     "try:\n"
                     "    held.append(c.DeviceBuffer(1 << 30))\n"
                     "    print('1 GiB more: allocated')\n"
                     "except c.CudaError:\n"
                     "    print('1 GiB more: refused')")
STATUS_CELL = "%hami status"
ADMIN_CELL = "from hami_jupyter.admin import AdminPanel\nAdminPanel()"
TWO_GPU_TEXT = re.compile(r"^vGPU 3\.5 / 4\.0 GiB \(GPU 0\) · SM \d+ % / 25 %$")
TWO_GPU_SCREENSHOT = ARTIFACTS / "jupyterlab-two-gpus.png"

# In the page: how many lines a piece of text lays out in (its line boxes' distinct tops).
LINES_JS = """
const lineCount = range => {
  const tops = [...range.getClientRects()].filter(r => r.width > 0).map(r => r.top).sort((a, b) => a - b);
  const distinct = [];
  for (const top of tops) {
    if (!distinct.length || top - distinct[distinct.length - 1] > 4) distinct.push(top);
  }
  return distinct.length;
};
const nodeLines = node => { const r = document.createRange(); r.selectNodeContents(node); return lineCount(r); };
// Each figure with its unit under root ("3.5 GiB", "0 %") that lays out on more than one
// line; notices' prose aside. Returns [split ones, how many figures].
const splitFigures = root => {
  const split = [];
  const figure = /\\d+(?:\\.\\d+)?[ \\u00a0](?:B|KiB|MiB|GiB|TiB|%|SMs)(?!\\w)/g;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  let figures = 0;
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest('.hami-warning, .hami-critical, .hami-guard-over')) continue;
    for (const m of n.textContent.matchAll(figure)) {
      figures++;
      const r = document.createRange();
      r.setStart(n, m.index);
      r.setEnd(n, m.index + m[0].length);
      if (lineCount(r) !== 1) split.push(m[0]);
    }
  }
  return [split, figures];
};
"""

# `%hami status` laid out: every figure and its unit on one line (notices' prose aside),
# the names of the kernels' table whole, a kernel named by its notebook (or its short id)
# with the whole id in the tooltip.
STATUS_TABLE_JS = "out => {" + LINES_JS + """
  const root = out.querySelector('.hami-status');
  const [split, figures] = splitFigures(root);
  // Whole: a kernel's name, user and kernelspec; a process's pid and command.
  const names = [];
  for (const row of root.querySelectorAll('table.hami-processes tr')) {
    const cells = row.querySelectorAll('td');
    if (cells.length < 3) continue;
    const id = cells[0].querySelector('code, .hami-kernel-notebook');
    const who = [...cells[0].querySelectorAll('.hami-kernel-who > span')];
    for (const node of id ? [id, ...who] : [...cells[0].querySelectorAll(':scope > span')]) {
      if (node.textContent.trim()) names.push({text: node.textContent, lines: nodeLines(node)});
    }
  }
  const ids = [...root.querySelectorAll('table.hami-processes code, table.hami-processes .hami-kernel-notebook')]
    .map(c => ({text: c.textContent, title: c.title}));
  return {split, figures, names, ids, width: out.getBoundingClientRect().width};
}
"""

# AdminPanel() laid out: labels and the chosen entries of selects that are cut, where each
# form's Apply lies against its first input, and the text a reader sees.
ADMIN_JS = "out => {" + LINES_JS + """
  const cut = [];
  for (const el of out.querySelectorAll('.widget-label, .widget-label-basic, .widget-label-basic span')) {
    if (!el.offsetParent || el.clientWidth === 0 || !el.textContent.trim()) continue;
    if (el.scrollWidth > el.clientWidth + 1) cut.push(el.textContent);
  }
  const ctx = document.createElement('canvas').getContext('2d');
  for (const select of out.querySelectorAll('select')) {
    if (!select.offsetParent) continue;
    const st = getComputedStyle(select);
    ctx.font = `${st.fontStyle} ${st.fontWeight} ${st.fontSize} ${st.fontFamily}`;
    const text = select.options[select.selectedIndex]?.text ?? '';
    const room = select.clientWidth - parseFloat(st.paddingLeft) - parseFloat(st.paddingRight);
    if (ctx.measureText(text).width > room + 1) cut.push(text);
  }
  const middle = el => { const b = el.getBoundingClientRect(); return b.top + b.height / 2; };
  const rows = [];
  for (const button of out.querySelectorAll('button')) {
    if (button.textContent.trim() !== 'Apply' || !button.offsetParent) continue;
    const row = button.closest('.widget-hbox');
    const inputs = [...row.children].filter(c => c !== button && c.offsetParent);
    rows.push({apply: middle(button), inputs: inputs.map(middle),
               right: button.getBoundingClientRect().right});
  }
  const [split] = splitFigures(out);
  return {cut, rows, split, text: out.innerText, right: out.getBoundingClientRect().right};
}
"""


def boxes_overlap(a, b):
    return not (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])


def test_two_gpu_slice_shows_its_fullest_gpu_and_its_tables_fit(page, lab):
    """A slice on two GPUs, 4 GiB each, GPU 0 at 3.5 GiB (its next 1 GiB refused): the
    status bar, the panel's headline and meter, and the kernel's cap line say 3.5 of
    4 GiB on GPU 0, never of the 8 GiB the caps add up to; the legend lists no parked
    memory; no chart caption lies on its cap line. Beside the 500 px panel
    `%hami status` keeps every figure with its unit and ids short, and AdminPanel()
    cuts no label and keeps each form's Apply on its row."""
    from hami_jupyter.slice.change import set_limits

    expect = _expect()
    name = lab.write_notebook("two-gpus.ipynb", TWO_GPU_KERNEL, "Python 3 (HAMi vGPU, two GPUs)",
                              [ALLOCATE_TWO_GPUS, STATUS_CELL, ADMIN_CELL])
    kernel_id = open_notebook(page, lab, name, "two-gpus")
    status = lab.slice_status(kernel_id)
    assert status["slice"] == TWO_GPU_SLICE, status
    # The slice's cap per GPU to 4 GiB, live, as an administrator would set it.
    set_limits(status["path"], None, memory_limit=TWO_GPU_CAP)
    run_cell(page, lab, 0, "1 GiB more: refused")

    # The status bar: GPU 0's 3.5 of 4 GiB, 88 %: a warning.
    item = page.locator("#jp-main-statusbar .hami-statusbar")
    expect(item).to_have_text(TWO_GPU_TEXT, timeout=STATUS_TIMEOUT_MS)
    expect(item).to_have_class(level_class("warning"))
    # The REST answer's top line is GPU 0's too; each GPU's own figures in gpus[].
    status = lab.slice_status(kernel_id)
    g0, g1 = status["gpus"]
    assert (g0["memory_used"], g0["memory_limit"]) == (3584 * MiB, TWO_GPU_CAP), status["gpus"]
    assert (g1["memory_used"], g1["memory_limit"]) == (0, TWO_GPU_CAP), status["gpus"]
    assert (status["memory_used"], status["memory_limit"], status.get("memory_gpu")) == \
        (3584 * MiB, TWO_GPU_CAP, 0), status

    # The panel: the same headline, a meter at 87.5 %, the charts against 4 GiB.
    item.click()
    panel = page.locator("#hami-slice-panel")
    expect(panel.locator(f'.hami-kernel-row[data-kernel-id="{kernel_id}"]')).to_be_visible(
        timeout=STATUS_TIMEOUT_MS)
    expect(panel.locator(".hami-panel-usage")).to_have_text(TWO_GPU_TEXT)
    expect(panel.locator(".hami-panel-usage")).to_have_class(level_class("warning"))
    assert panel.locator(".hami-meter-fill").evaluate("n => n.style.width") == "87.5%"
    kernel_memory = chart(panel, f"kernel-{kernel_id}", "memory")
    gpu_memory = chart(panel, "gpu-0", "memory")
    for locator in (kernel_memory, gpu_memory, chart(panel, "gpu-1", "memory")):
        expect(locator.locator("path.hami-chart-limit")).to_have_attribute(
            "data-value", str(TWO_GPU_CAP), timeout=STATUS_TIMEOUT_MS)
    # The legend lists what the charts draw: the cap, no parked memory (none was parked).
    legend = panel.locator(".hami-chart-legend")
    expect(legend.locator(".hami-legend-limit")).to_be_visible()
    expect(legend.locator(".hami-legend-parked")).to_be_hidden()
    expect(legend).not_to_contain_text("parked", use_inner_text=True)
    # A caption never lies on its chart's cap line.
    for locator in (kernel_memory, gpu_memory):
        expect(locator.locator("path.hami-chart-limit")).to_have_attribute("d", re.compile("H"))
        caption = locator.locator(".hami-chart-caption").bounding_box()
        line = locator.locator("path.hami-chart-limit").bounding_box()
        assert caption and line and not boxes_overlap(caption, line), (caption, line)

    # `%hami status` beside the open panel: no figure parts from its unit, names whole,
    # the kernel named by its notebook with the whole id as the tooltip (issue 41, item 1).
    run_cell(page, lab, 1, f"hami slice {TWO_GPU_SLICE}")
    cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell")
    table = cells.nth(1).locator(".jp-OutputArea-output").first.evaluate(STATUS_TABLE_JS)
    assert table["figures"] >= 6 and not table["split"], table
    assert not [n for n in table["names"] if n["lines"] != 1], table
    assert {"text": name, "title": f"kernel {kernel_id}"} in table["ids"], table

    # AdminPanel() in the notebook at JupyterLab's default layout (the slice panel closed
    # again): nothing cut, Apply on its form's row, ids as short as the panel's.
    page.locator('.lm-TabBar-tab[data-id="hami-slice-panel"]').click()
    expect(panel).to_be_hidden()
    run_cell(page, lab, 2, "HAMi slices")
    admin = cells.nth(2).locator(".jp-OutputArea-output").first
    expect(admin.locator(".widget-vbox").first).to_contain_text(f"slice {TWO_GPU_SLICE}")
    expect(admin).to_contain_text("GPU 0: 3.5 GiB · GPU 1: 0 B")
    layout = admin.evaluate(ADMIN_JS)
    assert not layout["cut"], f"cut in AdminPanel(): {layout['cut']}"
    assert not layout["split"], f"figures split from their units: {layout['split']}"
    assert layout["rows"], layout
    for row in layout["rows"]:
        assert all(abs(middle - row["apply"]) < 4 for middle in row["inputs"]), row
        assert row["right"] <= layout["right"] + 1, row
    assert kernel_id not in layout["text"] and name in layout["text"]
    assert g0["uuid"] not in layout["text"]

    page.mouse.move(700, 450)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(TWO_GPU_SCREENSHOT), full_page=True)
    assert not page.page_errors, page.page_errors


# ---- issue 35: what users see -------------------------------------------------------------------

THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
MIN_CONTRAST = 4.5  # text against what lies behind it, in every state and theme (WCAG AA)
MIN_BAND_CONTRAST = 1.5  # the parked band against its chart: visible


def shut_down_kernels(lab):
    """No kernel of earlier tests holds memory in the lab's slices: each test here starts clean."""
    for kernel in lab.api("GET", "api/kernels"):
        lab.api("DELETE", f"api/kernels/{kernel['id']}", expect=(204, 404))


def set_theme(lab, theme):
    """The lab's theme (by its settings, as the theme menu sets them) for pages loaded next."""
    status, reply = lab.request("PUT", "lab/api/settings/@jupyterlab/apputils-extension:themes",
                                {"raw": json.dumps({"theme": theme})})
    assert status in (200, 204), (status, reply)


# In the page: one element per state of the status bar item and of the panel (the
# extension's classes, in the real status bar and panel, so JupyterLab's theme and the
# extension's CSS apply as to the real ones), and the levels' colours of a notebook
# output; the contrast of each text against what lies behind it (backgrounds composited
# from the page down), any fading (opacity), and the parked band against its chart.
CONTRAST_JS = """
() => {
  const parse = c => {
    const m = (c || '').match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1};
  };
  const over = (top, base) => ({r: top.r * top.a + base.r * (1 - top.a),
    g: top.g * top.a + base.g * (1 - top.a), b: top.b * top.a + base.b * (1 - top.a), a: 1});
  const behind = node => {
    const chain = [];
    for (let n = node; n; n = n.parentElement) chain.push(n);
    let bg = {r: 255, g: 255, b: 255, a: 1};
    for (const n of chain.reverse()) {
      const c = parse(getComputedStyle(n).backgroundColor);
      if (c && c.a > 0) bg = over(c, bg);
    }
    return bg;
  };
  const lum = c => {
    const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b);
  };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
                            return Math.round((x + 0.05) / (y + 0.05) * 100) / 100; };
  const fading = node => { let o = 1; for (let n = node; n; n = n.parentElement) o *= parseFloat(getComputedStyle(n).opacity); return o; };

  const made = [];
  const statusbar = document.querySelector('#jp-main-statusbar .jp-StatusBar-Left');
  const states = {ok: 'hami-level-ok', warning: 'hami-level-warning', critical: 'hami-level-critical',
    parked: 'hami-parked', resuming: 'hami-resuming', 'guard over': 'hami-level-warning hami-guard-over',
    stale: 'hami-level-warning hami-stale'};
  for (const [name, cls] of Object.entries(states)) {
    const item = document.createElement('div');
    item.className = `hami-statusbar jp-StatusBar-GroupItem ${cls}`;
    item.innerHTML = '<span class="hami-statusbar-text jp-StatusBar-TextItem">vGPU 0.8 / 1.0 GiB</span>';
    item.firstChild.dataset.check = `status bar ${name}`;
    statusbar.appendChild(item);
    made.push(item);
  }
  const panel = document.querySelector('#hami-slice-panel');
  const box = document.createElement('div');
  box.innerHTML = `
    <div class="hami-panel-summary">
      <div class="hami-panel-usage hami-level-ok" data-check="headline ok">vGPU 0.2 / 1.0 GiB</div>
      <div class="hami-panel-usage hami-level-warning" data-check="headline warning">vGPU 0.8 / 1.0 GiB</div>
      <div class="hami-panel-usage hami-level-critical" data-check="headline critical">vGPU 1.0 / 1.0 GiB</div>
      <div class="hami-panel-usage hami-parked" data-check="headline parked">vGPU parked</div>
      <div class="hami-panel-usage hami-resuming" data-check="headline resuming">vGPU resuming</div>
      <div class="hami-panel-slice-usage" data-check="slice line">The slice: vGPU 0.2 / 1.0 GiB</div>
      <ul class="hami-panel-gpus">
        <li class="hami-panel-gpu hami-level-ok"><div class="hami-panel-gpu-text" data-check="GPU ok">GPU 0</div></li>
        <li class="hami-panel-gpu hami-level-warning"><div class="hami-panel-gpu-text" data-check="GPU warning">GPU 0</div></li>
        <li class="hami-panel-gpu hami-level-critical"><div class="hami-panel-gpu-text" data-check="GPU critical">GPU 0</div></li>
        <li class="hami-panel-gpu hami-guard-over"><div class="hami-panel-gpu-text" data-check="GPU guard over">GPU 0</div></li>
      </ul>
    </div>
    <div class="hami-panel-notice" data-check="notice">Parked 0f3c2a9e</div>
    <div class="hami-panel-notice hami-panel-notice-error" data-check="notice error">Cannot park</div>
    <div class="hami-panel-guard hami-guard-over" data-check="guard notice">Over the memory cap</div>
    <div class="hami-panel-guard-parked" data-check="guard parked notice">Parked by the guard</div>
    <div class="hami-panel-held" data-check="over a lowered cap">over its new 512 MiB cap</div>
    <div class="hami-panel-message" data-check="message">Reading the slice</div>
    <div class="hami-chart-legend"><span class="hami-legend-entry" data-check="legend">in use</span></div>
    <div class="hami-chart"><div class="hami-chart-head"><span class="hami-chart-caption" data-check="caption">memory 664 MiB</span>
      <span class="hami-chart-scale" data-check="scale">0–1.1 GiB</span></div>
      <svg class="hami-chart-svg" viewBox="0 0 300 40"><rect class="hami-chart-span" x="0" y="0" width="300" height="40"/></svg></div>
    <table class="hami-kernel-table"><tbody class="hami-kernel">
      <tr class="hami-kernel-row hami-kernel-current"><td class="hami-kernel-cell-name">
        <div class="hami-kernel-name" data-check="kernel name">0f3c2a9e</div>
        <div class="hami-kernel-meta" data-check="kernel details">this notebook</div>
        <div class="hami-kernel-park" data-check="park line">parked while idle</div></td>
        <td class="hami-kernel-memory hami-level-ok" data-check="kernel memory ok">100 MiB</td>
        <td class="hami-kernel-memory hami-level-warning" data-check="kernel memory warning">900 MiB</td>
        <td class="hami-kernel-memory hami-level-critical" data-check="kernel memory critical">990 MiB</td>
        <td class="hami-kernel-sm" data-check="kernel SM">3 %</td></tr>
      <tr class="hami-kernel-row hami-kernel-other-server"><td class="hami-kernel-cell-name">
        <div class="hami-kernel-name" data-check="another server's kernel">1a2b3c4d</div>
        <div class="hami-kernel-meta" data-check="another server's details">another server</div></td></tr>
      <tr class="hami-kernel-row hami-kernel-parked"><td class="hami-kernel-cell-name">
        <div class="hami-kernel-name" data-check="parked kernel">5e6f7a8b</div></td></tr>
    </tbody></table>`;
  panel.appendChild(box);
  made.push(box);
  const notebook = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell-outputArea')
    || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  const out = document.createElement('div');
  out.className = 'jp-OutputArea-output';
  // The colours of status_html.py's LEVEL_COLOUR and its muted text.
  out.innerHTML = `
    <span style="color: var(--hami-ok-fg, #1b5e20)" data-check="%hami status ok">ok</span>
    <span style="color: var(--hami-warn-fg, #a84300)" data-check="%hami status warning">Warning</span>
    <span style="color: var(--hami-error-fg, #c62828)" data-check="%hami status critical">Critical</span>
    <span style="color: var(--hami-muted-fg, #616161)" data-check="%hami status muted">/run/hami</span>`;
  notebook.appendChild(out);
  made.push(out);

  const texts = [...document.querySelectorAll('[data-check]')].map(node => {
    const fg = parse(getComputedStyle(node).color);
    const bg = behind(node);
    return {name: node.dataset.check, ratio: ratio(over(fg, bg), bg), opacity: fading(node),
            color: getComputedStyle(node).color};
  });
  const band = box.querySelector('rect.hami-chart-span');
  const svg = box.querySelector('svg.hami-chart-svg');
  const behindBand = behind(svg);
  const fill = parse(getComputedStyle(band).fill);
  const caption = parseFloat(getComputedStyle(box.querySelector('.hami-chart-caption')).fontSize);
  const result = {theme: document.body.dataset.jpThemeLight, texts,
                  band: fill ? ratio(over(fill, behindBand), behindBand) : 0, caption};
  for (const node of made) node.remove();
  return result;
}
"""


def test_every_state_reads_in_light_and_dark(page, lab):
    """Issue 35, item 2 (and the parked band and captions of item 6): the panel's
    over-cap notice was white on light cyan in JupyterLab Dark (1.3:1), the status
    bar's warning white on #e65100 in Light (3.8:1). Every state of the status bar
    item and the panel, and the levels of `%hami status`, read at 4.5:1 or more in
    both themes; nothing is faded; the parked band shows on its chart in both."""
    expect = _expect()
    shut_down_kernels(lab)
    lab.write_notebook("colours.ipynb", "hami-python3", "Python 3 (HAMi vGPU)")
    open_notebook(page, lab, "colours.ipynb", "colours")
    item = page.locator("#jp-main-statusbar .hami-statusbar").first
    expect(item).to_be_visible(timeout=STATUS_TIMEOUT_MS)
    item.click()
    expect(page.locator("#hami-slice-panel")).to_be_visible()
    failures = []
    try:
        for name, theme in THEMES.items():
            set_theme(lab, theme)
            page.reload(wait_until="domcontentloaded")
            light = "true" if name == "light" else "false"
            page.wait_for_function(f"document.body.dataset.jpThemeLight === '{light}'",
                                   timeout=30_000)
            expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")).to_be_visible(
                timeout=30_000)
            expect(page.locator("#jp-main-statusbar .hami-statusbar").first).to_be_visible(
                timeout=STATUS_TIMEOUT_MS)
            seen = page.evaluate(CONTRAST_JS)
            assert len(seen["texts"]) >= 35, seen
            failures += [f"{name}: {t['name']} {t['ratio']}:1 ({t['color']})"
                         for t in seen["texts"] if t["ratio"] < MIN_CONTRAST]
            failures += [f"{name}: {t['name']} faded to {t['opacity']}"
                         for t in seen["texts"] if t["opacity"] < 1]
            if seen["band"] < MIN_BAND_CONTRAST:
                failures.append(f"{name}: the parked band {seen['band']}:1 on its chart")
            if seen["caption"] < 10:
                failures.append(f"{name}: chart captions {seen['caption']} px")
    finally:
        set_theme(lab, THEMES["light"])
    assert not failures, "\n".join(failures)
    assert not page.page_errors, page.page_errors


ALLOCATE_494 = ("from hami_jupyter import driver_memory as c\n"
                "c.init()\n"
                "held = c.DeviceBuffer(430 << 20)\n"
                "print('held 430 MiB')")
ALLOCATE_100 = ("from hami_jupyter import driver_memory as c\n"
                "c.init()\n"
                "small = c.DeviceBuffer(100 << 20)\n"
                "print('held 100 MiB')")
PARKED_TEXT = re.compile(r"^vGPU parked · 494 MiB in host memory$")


def test_a_parked_kernel_stays_parked_when_its_notebook_opens(page, lab):
    """Issue 35, item 1: a kernel parked over REST went back to the GPU 0.2 s after a
    new tab opened its notebook, no cell run. It stays parked until its next cell.
    Item 6: while it is parked the panel's headline says what the status bar says
    (the slice's usage under it), and the biggest kernel at 48 % of the cap is no
    warning (it was always orange)."""
    expect = _expect()
    shut_down_kernels(lab)
    lab.write_notebook("parked.ipynb", "hami-python3", "Python 3 (HAMi vGPU)",
                       [ALLOCATE_494, "print('back')"])
    lab.write_notebook("other.ipynb", "hami-python3", "Python 3 (HAMi vGPU)", [ALLOCATE_100])
    kernel_id = open_notebook(page, lab, "parked.ipynb", "parked")
    run_cell(page, lab, 0, "held 430 MiB")
    page.locator(".jp-DirListing-item", has_text="other.ipynb").dblclick()
    expect(page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")).to_contain_text(
        "other.ipynb", timeout=30_000)
    lab.wait_kernel_state(lab.session_kernel("other.ipynb"), "idle")
    run_cell(page, lab, 0, "held 100 MiB")

    # The biggest kernel of the slice, 494 MiB of the 1 GiB cap (48 %): not a warning.
    item = page.locator("#jp-main-statusbar .hami-statusbar")
    item.click()
    panel = page.locator("#hami-slice-panel")
    memory = panel.locator(f'.hami-kernel-row[data-kernel-id="{kernel_id}"] .hami-kernel-memory')
    expect(memory).to_have_text("494 MiB", timeout=STATUS_TIMEOUT_MS)
    assert panel.locator("tbody.hami-kernel").first.get_attribute("data-kernel-id") == kernel_id
    expect(memory).to_have_class(level_class("ok"))
    expect(memory).to_have_attribute("title", "48 % of the slice's cap")
    name = panel.locator(f'.hami-kernel-row[data-kernel-id="{kernel_id}"] .hami-kernel-sm')
    assert memory.evaluate("n => getComputedStyle(n).color") == \
        name.evaluate("n => getComputedStyle(n).color"), "the 48 % kernel is coloured"

    lab.api("POST", f"hami/v1/kernels/{kernel_id}/park")
    assert lab.slice_status(kernel_id)["kernel"]["park_state"] == "parked"

    # A new tab opens the notebook: the kernel connects, and stays parked.
    tab = page.context.new_page()
    tab.on("pageerror", lambda e: page.page_errors.append(str(e)))
    open_notebook(tab, lab, "parked.ipynb", "parked-again")
    tab_item = tab.locator("#jp-main-statusbar .hami-statusbar")
    expect(tab_item).to_have_text(PARKED_TEXT, timeout=STATUS_TIMEOUT_MS)
    tab.wait_for_timeout(4_000)  # it came back 0.2 s after the page opened
    assert lab.slice_status(kernel_id)["kernel"]["park_state"] == "parked", lab.log_tail(3000)
    assert f"resumed kernel {kernel_id}" not in lab.log_tail(20_000)

    # Its panel heads with the status bar's words; the slice's usage beneath.
    tab_item.click()
    tab_panel = tab.locator("#hami-slice-panel")
    expect(tab_panel.locator(".hami-panel-usage")).to_have_text(PARKED_TEXT, timeout=STATUS_TIMEOUT_MS)
    expect(tab_panel.locator(".hami-panel-slice-usage")).to_have_text(
        re.compile(r"^The slice: vGPU \d\.\d / 1\.0 GiB · SM \d+ % / 25 %$"))

    # Its next cell brings it back, and says so.
    run_cell(tab, lab, 1, "back")
    output = tab.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell").nth(1)
    expect(output.locator(".jp-OutputArea-output").first).to_contain_text("hami: GPU memory restored")
    assert lab.slice_status(kernel_id)["kernel"]["park_state"] == "running"
    tab.close()
    assert not page.page_errors, page.page_errors


NARROW = {"width": 1024, "height": 700}
# %hami status laid out in a narrow notebook: its heading's lines, the path cut or not,
# the bars against the output's right edge, figures split from their units, overflow.
NARROW_STATUS_JS = "out => {" + LINES_JS + """
  const root = out.querySelector('.hami-status');
  const right = out.getBoundingClientRect().right;
  const heading = root.querySelector('b');
  const path = root.querySelector('.hami-path');
  const bars = [...root.querySelectorAll('.hami-bar')].map(b => {
    const r = b.getBoundingClientRect(); return {right: r.right, width: r.width}; });
  const [split] = splitFigures(root);
  return {width: out.getBoundingClientRect().width, heading: nodeLines(heading),
          pathCut: path.scrollWidth > path.clientWidth + 1 || path.getBoundingClientRect().right > right + 1,
          bars, right, split, overflows: out.scrollWidth > out.clientWidth + 1};
}
"""
# AdminPanel() laid out narrow: what is cut, and every input and button within the output.
NARROW_ADMIN_JS = "out => {" + LINES_JS + """
  const base = (out => {""" + ADMIN_JS.removeprefix("out => {" + LINES_JS) + """)(out);
  const right = out.getBoundingClientRect().right;
  const outside = [...out.querySelectorAll('input, select, button')]
    .filter(el => el.offsetParent && el.getBoundingClientRect().right > right + 1)
    .map(el => el.outerHTML.slice(0, 80));
  return {cut: base.cut, split: base.split, outside, width: out.getBoundingClientRect().width};
}
"""


def test_the_panel_and_outputs_work_at_320_px(browser, lab):
    """Issue 35, item 3: at 1024x700 with the file browser open, the 500 px panel left
    the notebook 190 px: `%hami status` broke "hami slice root" over three lines, cut
    the path and the bars; AdminPanel cut "defaul[t]". The panel works from 250 px (issue
    41: JupyterLab's own side panels' width) and
    is resized like JupyterLab's other side panels; beside it the outputs fit."""
    expect = _expect()
    context = browser.new_context(viewport=NARROW)
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        shut_down_kernels(lab)
        lab.write_notebook("narrow.ipynb", "hami-python3", "Python 3 (HAMi vGPU)",
                           [ALLOCATE, STATUS_CELL, ADMIN_CELL])
        open_notebook(page, lab, "narrow.ipynb", "narrow")
        files = page.locator("#filebrowser")
        if not files.is_visible():
            page.locator('.lm-TabBar-tab[data-id="filebrowser"]').click()
        expect(files).to_be_visible()
        item = page.locator("#jp-main-statusbar .hami-statusbar")
        expect(item).to_be_visible(timeout=STATUS_TIMEOUT_MS)
        item.click()
        panel = page.locator("#hami-slice-panel")
        expect(panel).to_be_visible()

        # Resized by its handle like the other side panels: wider, then as narrow as it goes.
        handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").last
        def drag(dx):
            box = handle.bounding_box()
            x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            page.mouse.move(x, y)
            page.mouse.down()
            page.mouse.move(x + dx, y, steps=8)
            page.mouse.up()
            page.wait_for_timeout(300)
            return panel.bounding_box()["width"]
        start = panel.bounding_box()["width"]
        wider = drag(-120)
        assert wider > start + 60, (start, wider)
        narrow = drag(600)
        assert abs(narrow - PANEL_MIN_WIDTH) <= 1, narrow

        run_cell(page, lab, 0, "allocated 2 buffers of 300 MiB")
        expect(panel.locator(".hami-kernel-row").first).to_be_visible(timeout=STATUS_TIMEOUT_MS)
        layout = panel.evaluate(ROWS_JS)
        assert not layout["scrolls"], layout
        bad = [row for row in layout["rows"] if row["lines"] != 1 or row["cut"]]
        assert not bad, f"panel rows that are cut or parts that wrap at {layout['width']}px: {bad}"

        cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell")
        run_cell(page, lab, 1, "hami slice")
        status = cells.nth(1).locator(".jp-OutputArea-output").first.evaluate(NARROW_STATUS_JS)
        assert status["width"] < 420, f"the notebook is not narrow here: {status}"
        assert status["heading"] == 1, status
        assert not status["pathCut"] and not status["split"] and not status["overflows"], status
        assert status["bars"] and all(b["right"] <= status["right"] + 1 and b["width"] > 40
                                      for b in status["bars"]), status

        run_cell(page, lab, 2, "HAMi slices")
        admin = cells.nth(2).locator(".jp-OutputArea-output").first
        expect(admin).to_contain_text("limits for")
        shown = admin.evaluate(NARROW_ADMIN_JS)
        assert not shown["cut"] and not shown["split"] and not shown["outside"], shown
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-narrow.png"), full_page=True)
    finally:
        context.close()
    assert not errors, errors
