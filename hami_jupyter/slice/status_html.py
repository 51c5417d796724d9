"""HTML rendering of :func:`.status.slice_status`, for notebooks and the admin panel.

The HTML travels in a notebook's outputs and is rendered by whatever opens it
later (JupyterLab, nbviewer, a static HTML export), so it is self-contained:
inline CSS only, no scripts, and every string that came from a file or a
process (slice name, path, uuid, user, kernelspec, command name, kernel id)
goes through :func:`html.escape`. The levels' colours are the JupyterLab
extension's (``--hami-warn-fg`` and the like, chosen per theme to read at
4.5:1 or more in Light and Dark), with light-theme fallbacks elsewhere.

A notebook beside JupyterLab's file browser and slice panel can be 300 px
narrow, and a table squeezed into it breaks lines wherever it may: a figure
never parts from its unit ("0 %", "3.5 GiB" lie in one ``white-space:
nowrap`` span, :func:`nowrap`), names (users, kernelspecs, processes) stay
whole, and ids are shortened the way the panel shortens them, 8 characters
with the whole id as a tooltip (:func:`short_id`, :func:`short_uuid`). The
heading "hami slice NAME" stays on one line and the path after it wraps
anywhere rather than be cut; a usage bar lies above its figures and shrinks
with the cell; the kernels' table has three columns (a kernel's user and
kernelspec under its name). A kernel is named by its notebook's path, the
kernel id its tooltip (:func:`kernel_label`). Only the prose of a notice
wraps freely.
"""

import re
from html import escape

from .size import format_size
from .status import (LENT_WORDS, default_guarantee_text, guarantee_text, guard_over_text,
                     guard_parked_text, level_words, over_cap_text, parking_text, real_text)

LEVEL_COLOUR = {
    "ok": "var(--hami-ok-fg, #1b5e20)",
    "warning": "var(--hami-warn-fg, #a84300)",
    "critical": "var(--hami-error-fg, #c62828)",
}
_UNCAPPED_COLOUR = "var(--jp-brand-color1, #1976d2)"
# Details in grey: the extension's muted colour, which reads at 4.5:1 or more on
# JupyterLab's shaded table rows too (the theme's font-color2 was 4.496:1 there).
MUTED_COLOUR = "var(--hami-muted-fg, #616161)"
_MUTED = f"color: {MUTED_COLOUR}"
_CELL = "padding: 1px 8px 1px 0; text-align: left; vertical-align: top"
_TABLE = "border-collapse: collapse; margin: 2px 0 8px 0"
NOWRAP = "white-space: nowrap"
# The space between a figure and its unit, in text this module writes.
_FIGURE_UNIT = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|PiB|%|SMs)(?!\w)")
_DOT = " \u00b7 "
ID_CHARS = 8  # as the JupyterLab panel shortens a kernel id (labextension format.ts, shortId)


def nowrap(html):
    """*html* (already escaped) on one line, wherever the table is squeezed."""
    return f'<span style="{NOWRAP}">{html}</span>'


def parts_line(parts, cls="", title=None):
    """A line of *parts* (HTML, escaped) for a narrow output: each part on one
    line, the line wrapping between them (at " · "), never inside one, so a
    300 px notebook scrolls nothing sideways and cuts nothing."""
    inner = " \u00b7 ".join(nowrap(p) for p in parts if p)
    tip = f' title="{escape(title)}"' if title else ""
    return f'<div class="{cls}"{tip}>{inner}</div>'


def _figures(text):
    """*text* escaped, each figure bound to its unit by a no-break space."""
    return _FIGURE_UNIT.sub("\\1&nbsp;\\2", escape(text))


def short_id(kernel_id):
    """A kernel id as the panel shows it: its first 8 characters, the whole id
    as the tooltip, never broken across lines."""
    return (f'<code title="{escape(kernel_id)}" style="{NOWRAP}">'
            f"{escape(kernel_id[:ID_CHARS])}</code>")


def kernel_label(kernel):
    """A kernel as people name it: its notebook's path (wrapping after a "/"
    in a narrow cell, never cut), the whole kernel id as the tooltip; a kernel
    without a known notebook by its short id (:func:`short_id`)."""
    notebook = kernel.get("notebook")
    if not notebook:
        return short_id(kernel["kernel_id"])
    path = "/<wbr>".join(escape(part) for part in notebook.split("/"))
    return (f'<span class="hami-kernel-notebook" title="kernel {escape(kernel["kernel_id"])}" '
            f'style="overflow-wrap: anywhere">{path}</span>')


def uuid_text(uuid, among=()):
    """A GPU UUID shortened like a kernel id: "GPU-" and 8 characters, then an
    ellipsis; where that would not tell it from another UUID of *among* (two
    simulated GPUs, "GPU-5a1f0000-...-000000000000" and "...-000000000001"), its
    last characters too, as few as tell them apart (at least 4):
    "GPU-5a1f0000\u20260001"."""
    head = 4 if uuid[:4] in ("GPU-", "MIG-") else 0
    if len(uuid) <= head + ID_CHARS + 1:
        return uuid
    start = uuid[:head + ID_CHARS]
    twins = {u for u in among if u != uuid and u[:head + ID_CHARS] == start}
    if not twins:
        return start + "\u2026"
    for tail in range(4, len(uuid) - head - ID_CHARS):
        if all(u[-tail:] != uuid[-tail:] for u in twins):
            return f"{start}\u2026{uuid[-tail:]}"
    return uuid


def short_uuid(uuid, among=()):
    """:func:`uuid_text` in a span that never breaks, the whole UUID as the tooltip."""
    return f'<span title="{escape(uuid)}" style="{NOWRAP}">{escape(uuid_text(uuid, among))}</span>'

def _level_words(level, status, gpu):
    words = _figures(level_words(level, status, gpu))
    if level == "warning":
        return f"Warning: {words}."
    return (f"Critical: {words} (free tensors you no longer need; <code>%hami release</code> "
            "returns framework caches).")


def _td(content, style=""):
    return f'<td style="{_CELL}{style}">{content}</td>'


def _muted(text):
    return f'<span style="{_MUTED}">{text}</span>'


def _bar(fraction, colour):
    """A usage bar on a line of its own above the figures: as wide as the cell
    allows, 160 px at most, so a narrow notebook shrinks it instead of cutting it."""
    pct = min(max(fraction, 0.0), 1.0) * 100
    return (
        '<span class="hami-bar" style="display: block; width: 100%; max-width: 160px; '
        'height: 10px; margin: 3px 0 2px; border-radius: 2px; overflow: hidden; '
        'background: var(--jp-layout-color3, #e0e0e0)">'
        f'<span style="display: block; width: {pct:.1f}%; height: 100%; '
        f'background: {colour}"></span></span>'
    )


def _memory_cell(gpu):
    used, limit, total = gpu["memory_used"], gpu["memory_limit"], gpu["memory_total"]
    if limit:
        cell = (_bar(used / limit, LEVEL_COLOUR[gpu["memory_level"]])
                + nowrap(f"{format_size(used)} / {format_size(limit)}") + " "
                + nowrap(f"({100 * used / limit:.0f} %)"))
    # No cap: the bar shows the whole GPU, in a colour that is not a level.
    elif total:
        cell = (_bar(used / total, _UNCAPPED_COLOUR)
                + nowrap(f"{format_size(used)} of {format_size(total)}") + " " + _muted("(no cap)"))
    else:
        cell = nowrap(format_size(used)) + " " + _muted("(no cap)")
    real = real_text(gpu)  # the guard's figure, where it tells something the slice's does not
    if not real:
        return cell
    return cell + ", " + nowrap(f'<span class="hami-guard-real">{real}</span>')


def _sm_cell(gpu):
    if gpu["sm_share"]:
        share = nowrap(f"share {gpu['sm_share']} %") + f" ({escape(gpu['mode'])})"
    else:
        share = "no SM limit"
    return f"{nowrap(str(gpu['sm_util']) + ' %')} now, {share}"


def _gpu_table(gpu, status):
    sms = ", " + nowrap(f"{gpu['sm_count']} SMs") if gpu["sm_count"] else ""
    among = [g["uuid"] for g in status["gpus"]]
    title = nowrap(f"GPU {gpu['index']}") + " " + _muted(short_uuid(gpu["uuid"], among) + sms)
    rows = [
        f'<tr><th colspan="2" style="{_CELL}">{title}</th></tr>',
        f"<tr>{_td('memory')}{_td(_memory_cell(gpu))}</tr>",
        f"<tr>{_td('SM')}{_td(_sm_cell(gpu))}</tr>",
    ]
    guaranteed = guarantee_text(gpu["memory_limit"], gpu.get("memory_guarantee"))
    if guaranteed:  # only where the cap reaches above the guarantee
        rows.insert(2, f'<tr>{_td("guarantee")}<td class="hami-guarantee" style="{_CELL}">'
                       f'{_figures(guaranteed)} {_muted("(" + escape(LENT_WORDS) + ")")}</td></tr>')
    if gpu.get("memory_parked"):
        parked = nowrap(format_size(gpu["memory_parked"])) + " " + _muted(
            "in host memory, back when its kernel runs again")
        rows.append(f"<tr>{_td('parked')}{_td(parked)}</tr>")
    level = gpu["memory_level"]
    if level != "ok":
        rows.append(
            f'<tr><td colspan="2" class="hami-{level}" style="{_CELL}; font-weight: 600; '
            f'color: {LEVEL_COLOUR[level]}">{_level_words(level, status, gpu)}</td></tr>'
        )
    held = over_cap_text(gpu)
    if held:
        rows.append(f'<tr><td colspan="2" class="hami-held" style="{_CELL}; color: '
                    f'{LEVEL_COLOUR["warning"]}">{escape(held[0].upper() + held[1:])}.</td></tr>')
    over = guard_over_text(gpu, status)
    if over:
        rows.append(
            f'<tr><td colspan="2" class="hami-guard-over" style="{_CELL}; font-weight: 600; '
            f'color: {LEVEL_COLOUR["critical"]}">Over the cap: {escape(over)}.</td></tr>'
        )
    return f'<table class="hami-gpu" style="{_TABLE}">{"".join(rows)}</table>'


def _usage(values, gpu_index):
    """Total of a per-GPU mapping, with the per-GPU split when the slice has several
    GPUs: " (GPU 0: 3.1 GiB · GPU 1: 0 B)", each GPU's figure on one line."""
    total = sum(values.values())
    if len(gpu_index) < 2 or not values:
        return total, ""
    split = " \u00b7 ".join(nowrap(f"GPU {gpu_index.get(u, '?')}: {format_size(v)}")
                            for u, v in values.items())
    return total, " " + _muted(f"({split})")


def _process_row(p, gpu_index, indent):
    memory, memory_split = _usage(p["memory_used"], gpu_index)
    sm = sum(p["sm_util"].values())
    # The pid and the command each whole; in a very narrow cell the command goes under.
    name = nowrap(f"pid {p['pid']}") + " " + nowrap(escape(p["comm"]))
    return (f"<tr>{_td(name, f'; padding-left: {indent}em')}"
            f"{_td(nowrap(format_size(memory)) + memory_split)}{_td(nowrap(f'{sm} %'))}</tr>")


def _processes_table(status, current_kernel):
    """Three columns, so a 300 px notebook holds them: a kernel's id with its
    user and kernelspec on a line under it, then its memory and SM use."""
    gpu_index = {g["uuid"]: g["index"] for g in status["gpus"]}
    head = "".join(f'<th style="{_CELL}">{h}</th>' for h in ("kernel / process", "memory", "SM"))
    rows = [f"<tr>{head}</tr>"]
    for k in status["kernels"]:
        label = kernel_label(k)
        if current_kernel and k["kernel_id"] == current_kernel:
            label += " " + _muted(nowrap("(this kernel)"))
        who = [nowrap(escape(x)) for x in (k["user"], k["kernelspec"]) if x]
        if who:
            label += f'<div class="hami-kernel-who" style="{_MUTED}">{_DOT.join(who)}</div>'
        parked = parking_text(k)
        memory = (nowrap(format_size(k["memory_used"]))
                  + (" " + _muted(_figures(parked[2:])) if parked else ""))
        rows.append(f"<tr>{_td(label)}{_td(memory)}{_td(nowrap(str(k['sm_util']) + ' %'))}</tr>")
        rows.extend(_process_row(p, gpu_index, 1) for p in k["processes"])
    if status["other_processes"]:
        rows.append(f'<tr><td colspan="3" style="{_CELL}">'
                    + _muted("other processes (not started by a kernel)") + "</td></tr>")
        rows.extend(_process_row(p, gpu_index, 1) for p in status["other_processes"])
    return f'<table class="hami-processes" style="{_TABLE}">{"".join(rows)}</table>'


def _no_gpu_line(status):
    d = status["default_limit"]
    cap = format_size(d["memory_limit"]) if d["memory_limit"] else "no memory cap"
    sm = f"SM share {d['sm_share']} % ({d['mode']})" if d["sm_share"] else "no SM limit"
    guaranteed = default_guarantee_text(status)
    cap += f" ({guaranteed})" if guaranteed else ""
    return f"<div>No GPU used in this slice yet; each GPU gets: {_figures(cap)}, {_figures(sm)}.</div>"


def format_html(status, current_kernel=None):
    """A compact HTML view of *status*: one table per GPU, then kernels and processes.

    *current_kernel* (a kernel id) marks that kernel's row "(this kernel)".
    """
    parts = [
        '<div class="hami-status" style="font-size: var(--jp-content-font-size1, 13px); '
        'line-height: 1.4">',
        f'<div><b style="{NOWRAP}">hami slice {escape(status["slice"])}</b> '
        f'<span class="hami-path" style="{_MUTED}; overflow-wrap: anywhere">'
        f'{escape(status["path"])}</span></div>',
    ]
    if not status["gpus"]:
        parts.append(_no_gpu_line(status))
    parts.extend(_gpu_table(g, status) for g in status["gpus"])
    for record in (status.get("guard") or {}).get("parked") or []:
        parts.append(f'<div class="hami-guard-parked" style="font-weight: 600; color: '
                     f'{LEVEL_COLOUR["critical"]}">{escape(guard_parked_text(record))}</div>')
    for g in (status.get("guard") or {}).get("elsewhere") or []:
        over = guard_over_text(g, status)
        text = (f"GPU {g['uuid']}: the guard sees {format_size(g['memory_real'])} of this slice really "
                "in use where none of its processes runs the library")
        style = f' style="font-weight: 600; color: {LEVEL_COLOUR["critical"]}"' if over else ""
        parts.append(f'<div class="hami-guard-over"{style}>{escape(text)}'
                     + (f" (over the cap: {escape(over)})" if over else "") + "</div>")
    if status["kernels"] or status["other_processes"]:
        parts.append(_processes_table(status, current_kernel))
    if status["dead_processes"]:
        parts.append("<div>" + _muted(
            f"{status['dead_processes']} dead process(es) not reclaimed yet "
            "(their memory is not counted above)") + "</div>")
    parts.append("</div>")
    return "".join(parts)
