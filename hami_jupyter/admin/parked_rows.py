"""The admin panels' rows for processes the guard parked: who, why, Resume, End.

The guard parks a process over its slice's cap by memory no cap allowed and
keeps its GPU state in host memory (docs/guard.md); only an administrator
brings it back, after raising the cap, or ends it. One row per process, in
both views: the local :class:`.panel.AdminPanel` (its buttons call
:func:`.actions.guard_act`: root here, anyone else through the admin
service) and the hub view (:mod:`.hub_view`: the hub service's
``guard-resume`` / ``guard-end``, which go through that node's admin
service). Either way the admin service or root writes the audit record.
"""

import time
from html import escape

import ipywidgets as widgets

from ..slice.size import format_size
from ..slice.status_html import MUTED_COLOUR

_MUTED = f"color: {MUTED_COLOUR}"


def parked_label(record, node=None, now=None):
    """One line for an administrator: the process, whose, where, since when, why."""
    now = time.time() if now is None else now
    ago = max(0, int(now - (record.get("unix") or now)))
    where = f" on {escape(node)}" if node else ""
    return (f"<b>pid {record['pid']}</b> ({escape(str(record.get('command') or '?'))}) of "
            f"{escape(str(record.get('user') or '?'))}, slice {escape(str(record.get('slice') or '?'))}"
            f"{where}: parked by the guard {ago // 60} min ago, "
            f"{format_size(record.get('process_bytes') or 0)} safe in host memory. "
            f"<span style='{_MUTED}'>{escape(str(record.get('why') or 'over its slice cap'))}. "
            "Raise the slice's cap, then Resume; or End it.</span>")


class ParkedRow:
    """Resume and End for one parked process; *act(what, record)* does it
    ("resume" or "end") and returns the answer (None when it failed, the
    view saying why)."""

    def __init__(self, act, record, node=None):
        self._act, self.node = act, node
        self.label = widgets.HTML()
        self.resume = widgets.Button(description="Resume", icon="play",
                                     layout=widgets.Layout(width="auto"),
                                     tooltip="give it its GPU memory back (raise the slice's cap first)")
        self.end = widgets.Button(description="End", icon="power-off",
                                  layout=widgets.Layout(width="auto"),
                                  tooltip="end the process; its memory in host memory is freed")
        self.resume.on_click(lambda _b: self.act("resume"))
        self.end.on_click(lambda _b: self.act("end"))
        self.box = widgets.HBox([self.resume, self.end, self.label],
                                layout={"flex_flow": "row wrap", "align_items": "center"})
        self.update(record)

    def update(self, record):
        self.record = record
        self.label.value = parked_label(record, self.node)

    def act(self, what):
        return self._act(what, self.record)
