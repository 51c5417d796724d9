"""The slice's HTML view (``%hami status``, and each slice of ``AdminPanel()``)
in a narrow notebook: no figure parts from its unit, names stay whole, and
ids are shortened as the JupyterLab panel shortens them (issue 26, item 4).

The browser test (tests/browser/test_jupyterlab_e2e.py) measures the same
view laid out beside the slice panel; this checks the markup that keeps it
so, without a browser: every "value unit" pair of the text a reader sees lies
in a ``white-space: nowrap`` element or is joined by a no-break space.
"""

import re
from html.parser import HTMLParser

from hami_jupyter.slice.status_html import format_html

MiB = 1 << 20
GiB = 1 << 30
KERNEL = "0f3c2a9e-5b71-4d0e-9a42-7c1d2e3f4a5b"
UUIDS = ("GPU-5a1f0000-0000-4000-8000-000000000000", "GPU-5a1f0000-0000-4000-8000-000000000001")
# A figure and its unit with an ordinary (breakable) space between them.
FIGURE_UNIT = re.compile(r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB|%|SMs)(?!\w)")
PROSE = ("hami-warning", "hami-critical", "hami-guard-over")  # notices: free text


class Reader(HTMLParser):
    """The text a reader sees, each piece with whether it lies in a nowrap element,
    and the titles (tooltips); notices' prose is left out."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.pieces, self.titles = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        nowrap = "white-space: nowrap" in (attrs.get("style") or "")
        prose = any(c in (attrs.get("class") or "").split() for c in PROSE)
        self.stack.append((tag, nowrap, prose))
        if attrs.get("title"):
            self.titles.append(attrs["title"])

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if any(prose for _, _, prose in self.stack):
            return
        self.pieces.append((data, any(nowrap for _, nowrap, _ in self.stack)))

    def visible(self):
        return "".join(text for text, _ in self.pieces)


def two_gpu_status():
    """A slice on two 4 GiB GPUs, 3.5 GiB on GPU 0, one kernel whose process
    uses both GPUs, and a parked kernel."""
    process = {"pid": 4242, "comm": "python3", "uid": 0, "active_unix": 0.0,
               "memory_used": {UUIDS[0]: 3584 * MiB, UUIDS[1]: 0},
               "sm_util": {UUIDS[0]: 0, UUIDS[1]: 0}}
    gpus = [{"index": i, "uuid": u, "memory_total": 16 * GiB, "memory_used": used,
             "memory_peak": used, "memory_limit": 4 * GiB, "memory_level": level,
             "sm_count": 132, "sm_share": 25, "sm_util": 0, "mode": "hard",
             "limit_is_fallback": True, "memory_parked": parked}
            for i, u, used, level, parked in ((0, UUIDS[0], 3584 * MiB, "warning", 0),
                                               (1, UUIDS[1], 0, "ok", 512 * MiB))]
    kernels = [
        {"kernel_id": KERNEL, "user": "alice", "kernelspec": "hami-python3", "pid": 4242,
         "processes": [process], "memory_used": 3584 * MiB, "sm_util": 0},
        {"kernel_id": "9a8b7c6d-0000-4000-8000-000000000002", "user": "alice",
         "kernelspec": "hami-python3", "pid": 4343, "processes": [], "memory_used": 0,
         "sm_util": 0, "park_state": "parked", "memory_parked": 512 * MiB},
    ]
    return {"slice": "alice", "path": "/run/hami-jupyter/alice.slice", "dead_processes": 0,
            "default_limit": {"memory_limit": 4 * GiB, "sm_share": 25, "mode": "hard"},
            "gpus": gpus, "kernels": kernels, "other_processes": [],
            "warning_fraction": 0.8, "critical_fraction": 0.95}


def read(html):
    reader = Reader()
    reader.feed(html)
    return reader


def test_no_figure_parts_from_its_unit():
    reader = read(format_html(two_gpu_status(), current_kernel=KERNEL))
    loose = [m.group(0) for text, nowrap in reader.pieces if not nowrap
             for m in FIGURE_UNIT.finditer(text)]
    assert not loose, f"figures a narrow table may break from their units: {loose}"
    # They are there, bound: the GPU's figures, the SM use, a kernel's and the parked bytes.
    text = reader.visible().replace("\u00a0", " ")
    for shown in ("3.5 GiB / 4.0 GiB (88 %)", "0 % now", "share 25 %", "132 SMs",
                  "512.0 MiB in host memory"):
        assert shown in text, shown


def test_names_stay_whole_and_ids_are_shortened_with_the_whole_id_as_tooltip():
    reader = read(format_html(two_gpu_status(), current_kernel=KERNEL))
    # A process's pid and command each stay whole (in a very narrow cell the command goes under).
    for name in ("hami-python3", "alice", "pid 4242", "python3", KERNEL[:8], "(this kernel)"):
        assert (name, True) in reader.pieces, f"{name} may break: {reader.pieces}"
    text = reader.visible()
    # 8 characters of a kernel id, as the JupyterLab panel; the 36 only in tooltips.
    assert KERNEL not in text and KERNEL in reader.titles
    for uuid in UUIDS:
        assert uuid not in text and uuid in reader.titles
    assert "GPU-5a1f0000\u2026" in text


def test_a_process_on_two_gpus_says_each_gpus_figure_apart():
    text = read(format_html(two_gpu_status())).visible()
    assert "(GPU 0: 3.5 GiB \u00b7 GPU 1: 0 B)" in text, text


def test_over_a_lowered_cap_every_line_says_what_is_true():
    """Issue 35, item 4: at 117 % of a cap lowered below use, nothing says
    allocations "will fail soon" beside a refusal that already happens; at 96 %
    the line says what is left and what a larger allocation meets."""
    from hami_jupyter.slice.status import format_text

    status = two_gpu_status()
    for g in status["gpus"]:
        g.update(decoders=0, max_decoders=0)
    for k in status["kernels"]:
        k.setdefault("processes", [])
    status["kernels"][0]["processes"][0].update(decoders={}, frames_decoded=0)
    g0 = status["gpus"][0]
    g0.update(memory_limit=3 * GiB, memory_level="critical", over_cap_since=1_700_000_000.0)
    text, html = format_text(status), format_html(status)
    for shown in (text, html.replace("&nbsp;", " ")):
        assert "will fail soon" not in shown, shown
        assert "117 % of the memory cap is in use: over the cap, so new allocations are refused " \
               "until use falls below it" in shown, shown
        assert "held before the change: nothing it holds is taken" in shown, shown
        assert shown.count("refused") == 1, shown  # said once, by the level's line
    g0.update(memory_limit=4 * GiB, memory_used=int(3.84 * GiB), over_cap_since=None)
    text = format_text(status)
    assert "CRITICAL: 96 % of the memory cap is in use: 163.8 MiB left, a larger allocation " \
           "is refused" in text, text
