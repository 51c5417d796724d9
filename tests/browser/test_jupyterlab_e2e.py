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
"""

import re
import time
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

CELL_TIMEOUT_MS = 30_000
# The item polls every 500 ms: a few polls, with room for a slow machine.
STATUS_TIMEOUT_MS = 10_000
SCREENSHOT = ARTIFACTS / "jupyterlab-slice.png"

ALLOCATE = ("from hami_jupyter import driver_memory as c\n"
            "c.init()\n"
            "b = [c.DeviceBuffer(300 << 20) for _ in range(2)]\n"
            "print('allocated', len(b), 'buffers of 300 MiB')")
ALLOCATE_MORE = ("b.append(c.DeviceBuffer(200 << 20))\n"
                 "print('allocated 200 MiB more')")

# statusText() in labextension/src/format.ts: GiB with one decimal, SM in whole percent.
OK_TEXT = re.compile(r"^vGPU 0\.6 / 1\.0 GiB · SM \d+ % / 25 %$")  # 664 MiB
WARNING_TEXT = re.compile(r"^vGPU 0\.8 / 1\.0 GiB · SM \d+ % / 25 %$")  # 864 MiB
EMPTY_TEXT = re.compile(r"^vGPU 0\.0 / 1\.0 GiB · SM \d+ % / 25 %$")
ANY_SLICE_TEXT = re.compile(r"^vGPU \d+\.\d / 1\.0 GiB · SM \d+ % / 25 %$")

MiB = 1 << 20


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
