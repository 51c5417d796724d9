"""The admin panel: every GPU and slice of the host, and forms that change limits live.

Under JupyterHub, where the hub runs ``hami-jupyter hub-service`` and this
user is one of its administrators, ``AdminPanel()`` shows the whole hub
instead, every node, GPU, user and kernel, with the same controls
(:mod:`.hub_view`); a user the service refuses gets what follows, for this
host, with a one-line note why. Everything below is that host view.

``AdminPanel()`` in a notebook shows the host's GPUs (NVML: name, memory,
utilization, and how much memory slices are sure to keep on each:
"guaranteed to users"), a line per slice and GPU, what the slice counts ("in
use", with its parked memory beside it) beside what the guard measures with
NVML ("measured 1.5 GiB"; "not measured" without a guard, and a notice that
says so in plain words, its technical note as the tooltip), then one section
per slice, headed by a notice while the guard sees the slice over its cap:
its usage, kernels (named by their notebooks) and their users (the same view
as ``%hami status``), and a form. Everything is lines that wrap between their
parts, so that a 270 px notebook scrolls nothing sideways; each plain word's
meaning is its tooltip; the outermost box's class ``hami-admin`` gets
JupyterLab's row height from the extension's stylesheet. The form edits one *entry* of the slice's
limits, chosen in its first selector: the default entry (every GPU without
limits of its own) or one GPU the slice has used. Apply checks the change
(:mod:`.changes`, through :mod:`.actions`), writes it so that running
kernels follow at their next allocation, and logs it (:mod:`.audit`); the outcome, errors and warnings
appear under the form. Editing a field shows the check's verdict before
Apply.

Two rules keep concurrent admins from undoing each other's work. A refresh
reloads a form's inputs only while they still show what was loaded, so it
never overwrites what an admin is typing. Apply sends only the fields the
admin edited, so changing a memory cap never writes back an SM share that
another admin changed meanwhile.

Refreshing (about once a second) runs in a daemon thread, for the reason
:mod:`hami_jupyter.magic.watch` gives: the kernel's event loop is busy while
a cell runs. A lock keeps a refresh and an Apply from interleaving.

A user who may not change a slice's limits (see
:func:`.actions.writable`) sees that slice with a
"read-only: you cannot change limits" banner and disabled inputs; Apply then
refuses without touching anything. When no slice is writable, the panel says
so at the top.

State is inspectable without a browser: :attr:`AdminPanel.forms` (by slice
name) with their input widgets, :attr:`SliceForm.errors`,
:attr:`SliceForm.warnings`, :attr:`SliceForm.last_change`,
:attr:`AdminPanel.refresh_count`, :attr:`AdminPanel.running` and
:attr:`AdminPanel.skipped` (slice files the trust rule of
:mod:`hami_jupyter.slice.paths` refused: another user's, or one anyone may
change; the banner names them, and they are never read).
"""

import re
import threading
import time
from html import escape
from pathlib import Path

import ipywidgets as widgets

from .. import audit
from ..gpus import read_gpus
from ..slice import parking
from ..slice.paths import default_root
from ..slice.limits import effective_guarantee
from ..slice.size import format_size
from ..slice.status_html import (LEVEL_COLOUR, MUTED_COLOUR, format_html, kernel_label, nowrap,
                                 parts_line, short_uuid)
from . import actions, changes, hub_client, marks
from .changes import READ_ONLY
from .hub_view import HubView
from .parked_rows import ParkedRow
from .slice_form import (DEFAULT, FORM_BUTTON, FORM_ROW, LimitsForm, gpu_entry, limit_texts,
                         overcommit_box)

_MUTED_COLOUR = MUTED_COLOUR
_MUTED = f"color: {_MUTED_COLOUR}"
_CELL = "padding: 1px 12px 1px 0; text-align: left"


# The class of the panel's outermost box: the JupyterLab extension's stylesheet
# gives what is under it JupyterLab's row height and wrapping text.
ADMIN_CLASS = "hami-admin"


def _muted(text):
    return f'<span style="{_MUTED}">{text}</span>'


def _lines(items, colour):
    return "".join(f'<div style="color: {colour}">{escape(t)}</div>' for t in items)


# What each figure means, for the tooltips: the words on screen stay plain.
IN_USE_TIP = "what the slice's processes hold on the GPU, as the slice counts it"
CAP_TIP = "the most the slice may hold on this GPU"
MEASURED_TIP = ("what the GPU really holds for the slice's processes, as the guard measures it "
                "with NVML every half second")
NOT_MEASURED_TIP = "no guard is running here, so nothing measures what the GPU really holds"
GUARANTEED_TIP = ("memory the users' slices are sure to keep on this GPU even when others need it: "
                  "their guarantees (a slice in hard mode counts its whole cap where it has none). "
                  "Promising more than the GPU holds needs the box below")
BUSY_TIP = "the share of the last second in which the GPU ran work, as NVML says"


def _note_html(note):
    """A note whose command names read as code (no literal backticks)."""
    text = escape(note[0].upper() + note[1:])
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _guard_words(root, now=None):
    """``(plain words, the technical note)`` for a slice root without a running
    guard (no report, a stale one, one that cannot be read); None while a guard
    writes fresh reports. The words end in what to do, never in a file path:
    the note (paths and all) is their tooltip."""
    note = actions.guard_note(root, now)
    if note is None:
        return None
    if note.startswith("the guard is not running: it last wrote"):
        state = "The guard stopped reporting"
    elif note.startswith("the guard is not running"):
        state = "No guard is running"
    else:
        state = "The guard's report cannot be read"
    words = (f"{state}: what the GPU really holds for each slice is not measured, and the caps "
             "hold only for processes started with the library (every kernel is). To start it: "
             "`hami-jupyter guard` (as root).")
    return words, note


def _memory_lines(views, guard):
    """Each readable slice's memory per GPU, one wrapping line each: in use
    (what it counts; parked memory beside it), its cap, what the guard
    measures ("not measured" without a guard); *guard* (:func:`_guard_words`)
    under them."""
    lines = []
    uuids = [g["uuid"] for v in views if v.status for g in v.status["gpus"]]
    for v in views:
        if v.status is None:
            continue
        for g in v.status["gpus"]:
            real = g.get("memory_real")
            if real is None:
                measured = f'<span title="{escape(NOT_MEASURED_TIP)}" style="{_MUTED}">not measured</span>'
            else:
                measured = f'<span title="{escape(MEASURED_TIP)}">measured {format_size(real)}</span>'
            if g.get("guard_state") == "over":
                measured = (f'<span class="hami-guard-over" style="font-weight: 600; color: '
                            f'{LEVEL_COLOUR["critical"]}">measured {format_size(real)}, over the cap</span>')
            used = f'<span title="{escape(IN_USE_TIP)}">{format_size(g["memory_used"])} in use</span>'
            if g.get("memory_parked"):  # a parked kernel's bytes are in host memory, not 0 B
                used += " " + _muted(f"+ {format_size(g['memory_parked'])} parked")
            cap = (f'<span title="{escape(CAP_TIP)}">cap {format_size(g["memory_limit"])}</span>'
                   if g["memory_limit"] else "no cap")
            where = f"<b>{escape(v.name)}</b> on GPU {g['index']}"
            lines.append(parts_line([where, _muted(short_uuid(g["uuid"], uuids)), used, cap, measured],
                                    "hami-slice-line"))
    html = f'<div class="hami-slice-memory">{"".join(lines)}</div>' if lines else ""
    if guard:
        words, note = guard
        tooltip = note[0].upper() + note[1:].replace("`", "")
        html += (f'<div class="hami-guard-note" title="{escape(tooltip)}" style="color: '
                 f'{LEVEL_COLOUR["warning"]}">{_note_html(words)}</div>')
    return html


def _guard_notice(status):
    """A notice heading a slice the guard sees over its cap; "" otherwise."""
    elsewhere = ((status or {}).get("guard") or {}).get("elsewhere") or []
    over = [g for g in (status or {}).get("gpus", []) + elsewhere if g.get("guard_state") == "over"]
    if not over:
        return ""
    def cap(g):
        return g.get("memory_limit", 0) if g.get("guard_limit") is None else g["guard_limit"]

    where = ", ".join(f"GPU {g.get('index', g['uuid'])} ({format_size(g['memory_real'])} really in use, "
                      f"cap {format_size(cap(g))})" for g in over)
    action = (status.get("guard") or {}).get("action")
    text = (f"Slice {status['slice']} is over its memory cap, as the guard sees it: {where}."
            + (f" The guard's action: {action}." if action else ""))
    return (f'<div class="hami-guard-over" style="font-weight: 600; color: '
            f'{LEVEL_COLOUR["critical"]}">{escape(text)}</div>')


def _gpu_lines(gpus, message, promised):
    """The host's GPUs, one wrapping line each; *promised* is :func:`.actions.commitments`."""
    by_uuid = {g.uuid: g for g in gpus}
    uuids = [p["uuid"] for p in promised]
    lines = []
    for p in promised:
        g = by_uuid.get(p["uuid"])
        used = g.memory_used if g else None
        total = format_size(p["memory_total"]) if p["memory_total"] else "?"
        memory = f"{format_size(used)} of {total} in use" if used is not None else f"{total} memory"
        util = g.utilization if g else None
        over = p["memory_total"] and p["promised"] > p["memory_total"]
        style = f' style="color: {LEVEL_COLOUR["critical"]}"' if over else ""
        promise = (f'<span title="{escape(GUARANTEED_TIP)}"{style}>'
                   f'{format_size(p["promised"])} guaranteed to users</span>')
        parts = [f"<b>GPU {g.index}</b>" if g else "<b>GPU</b>",
                 escape(p["name"] or "(from the slice files)"),
                 _muted(short_uuid(p["uuid"], uuids)), memory,
                 f'<span title="{escape(BUSY_TIP)}">{util} % busy</span>' if util is not None else "",
                 promise]
        if p.get("lent"):  # guarantees below caps: the promises are the guarantees
            parts.append(f"caps {format_size(p['capped'])}")
        parts += [_muted(f"{escape(name)} {format_size(b)}") for name, b in p["holders"].items()]
        lines.append(parts_line(parts, "hami-gpu-line"))
    html = (f'<div class="hami-gpus">{"".join(lines)}</div>' if promised
            else "<div>No GPU known.</div>")
    note = (f'<div style="{_MUTED}">{escape(message)}; sizes come from the slice files</div>'
            if message else "")
    return html + note


class SliceForm(LimitsForm):
    """One slice in the panel: its status, and the limits form (:mod:`.slice_form`)
    for one entry of its limits."""

    def __init__(self, panel, view):
        super().__init__()
        self.panel, self.path, self.name = panel, view.path, view.name
        self.view, self.read_only = view, not view.writable
        self.last_change = None  # the Change of the last Apply that got as far as a check
        self.status = widgets.HTML()
        self.guard_notice = widgets.HTML()  # while the guard sees the slice over its cap
        self.banner = widgets.HTML()
        self.reset_button = widgets.Button(description="Reset to policy", icon="undo", layout=FORM_BUTTON,
                                           tooltip="drop the limits an administrator set: back to "
                                                   "the hub policy's (otherwise they outlive server "
                                                   "restarts)")
        self.reset_button.on_click(lambda _button: self.reset())
        self.kernel_rows = widgets.VBox()  # a park / resume button per kernel on the GPU
        self._kernel_states = None
        self.box = widgets.VBox([self.guard_notice, self.status, self.kernel_rows, self.banner,
                                 self.row(self.reset_button), self.message])
        self.update(view)  # loads the inputs too

    # -- showing the slice --

    def update(self, view):
        """Show *view* (a fresh read of the slice); reload the inputs unless being edited."""
        self.view, self.read_only = view, not view.writable
        if view.error:
            self.status.value = (f"<div><b>slice {escape(self.name)}</b></div>"
                                 f'<div style="color: {LEVEL_COLOUR["critical"]}">{escape(view.error)}</div>')
        else:
            self.status.value = format_html(view.status)
        self.guard_notice.value = _guard_notice(view.status)
        self.banner.value = (f'<div class="hami-read-only" style="font-weight: 600; color: '
                             f'{LEVEL_COLOUR["warning"]}">{READ_ONLY}</div>') if self.read_only else ""
        self.set_disabled(self.read_only or view.error is not None)
        # Shown only while an administrator's limits are in force (they outlive restarts).
        self.admin_set = marks.admin_mark(self.path) is not None
        self.reset_button.layout.display = None if self.admin_set else "none"
        self.reset_button.disabled = self.read_only
        gpus = self.view.status["gpus"] if self.view.status else []
        entries = []
        for g in gpus:
            label, tooltip = gpu_entry(g["index"], g["uuid"], g["limit_is_fallback"])
            entries.append((label, g["index"], tooltip))
        self.set_entries(entries)
        self._set_kernel_rows()
        if not self.pending():
            self.load()

    def entry_limits(self):
        """The selected entry's limits now, as input texts (None when unreadable)."""
        status = self.view.status
        if status is None:
            return None
        entry = (status["default_limit"] if self.device.value == DEFAULT else
                 next(g for g in status["gpus"] if g["index"] == self.device.value))
        guarantee = entry.get("memory_guarantee")
        if self.device.value == DEFAULT:  # the entry as stored: 0 is "the cap"
            guarantee = effective_guarantee(entry["memory_limit"], guarantee or 0)
        return limit_texts(entry["memory_limit"], entry["sm_share"], entry["mode"], guarantee)

    def preview(self, fields):
        with self.panel._lock:
            change = changes.propose(self.path, self.device_ref(), **fields,
                                     overcommit=self.panel.overcommit.value, gpus=self.panel.gpus)
        if change.ok:
            self.show(f"on Apply: {change.summary()}", _MUTED_COLOUR, (), change.warnings)
        else:
            self.show("cannot apply:", LEVEL_COLOUR["critical"], change.errors, change.warnings)

    # -- applying --

    def apply(self):
        """Check and apply the edited fields; returns the applied Change, or None.

        The outcome is in :attr:`errors`, :attr:`warnings` and the message widget.
        """
        if self.read_only:
            self.show("not applied:", LEVEL_COLOUR["critical"], [READ_ONLY])
            return None
        fields = self.pending()
        if not fields:
            self.show("not applied:", LEVEL_COLOUR["critical"],
                      ["nothing to change: edit the memory cap, the guarantee, the SM share "
                       "or the mode first"])
            return None
        if self.refuse_malformed():
            return None
        with self.panel._lock:
            try:
                change = actions.apply(self.path, self.device_ref(), **fields,
                                       overcommit=self.panel.overcommit.value, gpus=self.panel.gpus,
                                       audit_path=self.panel.audit_path)
            except changes.ChangeError as e:
                self.last_change = e.change
                errors = e.change.errors if e.change is not None and e.change.errors else [str(e)]
                warnings = e.change.warnings if e.change is not None else []
                self.show("not applied:", LEVEL_COLOUR["critical"], errors, warnings)
                self.update(actions.read_slice(self.path))  # e.g. now read-only
                return None
            self.last_change = change
            self.forget_loaded()  # applied: the inputs follow the file again
            self.update(actions.read_slice(self.path))
        self.show(f"applied: {change.summary()}", LEVEL_COLOUR["ok"], (), change.warnings)
        return change

    def reset(self):
        """Back to the policy's limits (:func:`.actions.reset`); returns the message, or None."""
        if self.read_only:
            self.show("not reset:", LEVEL_COLOUR["critical"], [READ_ONLY])
            return None
        with self.panel._lock:
            try:
                text = actions.reset(self.path, audit_path=self.panel.audit_path)
            except changes.ChangeError as e:
                self.show("not reset:", LEVEL_COLOUR["critical"], [str(e)])
                return None
            self.forget_loaded()
            self.update(actions.read_slice(self.path))
        self.show(text, LEVEL_COLOUR["ok"])
        return text

    # -- parking --

    def _set_kernel_rows(self):
        """One row per kernel with a process in the slice: park it, or resume it when parked."""
        kernels = [k for k in (self.view.status or {}).get("kernels", []) if k["processes"]]
        states = [(k["kernel_id"], k.get("park_state", "running")) for k in kernels]
        if states == self._kernel_states:
            return
        self._kernel_states = states
        rows = []
        for k in kernels:
            state = k.get("park_state", "running")
            where = (f", {nowrap(format_size(k.get('memory_parked', 0)))} in host memory"
                     if state != "running" else "")
            label = widgets.HTML(f"{kernel_label(k)} "
                                 f"<span style='{_MUTED}'>{escape(state)}{where}</span>")
            verb = "Park" if state == "running" else "Resume"
            button = widgets.Button(description=verb, icon="pause" if verb == "Park" else "play",
                                    tooltip=f"{verb.lower()} this kernel's GPU memory",
                                    layout=widgets.Layout(width="auto"),
                                    disabled=self.read_only or state in ("parking", "resuming"))
            button.on_click(lambda _b, kid=k["kernel_id"], v=verb: self.park_or_resume(kid, v))
            rows.append(widgets.HBox([button, label], layout=FORM_ROW))
        self.kernel_rows.children = rows

    def park_or_resume(self, kernel_id, verb):
        """Park or resume (*verb*) one kernel of this slice; the outcome is in the message.
        Returns the line shown, or None when it failed."""
        try:
            text = (actions.park if verb == "Park" else actions.resume)(self.path, kernel_id)
        except parking.ParkError as e:
            self.show(f"not {'parked' if verb == 'Park' else 'resumed'}:", LEVEL_COLOUR["critical"],
                      [str(e)])
            return None
        self.show(text, LEVEL_COLOUR["ok"])
        with self.panel._lock:
            self.update(actions.read_slice(self.path))
        return text

    def close(self):
        self.box.close()


class AdminPanel:
    """Every GPU and slice under *root* (default: the slice root), editable by an admin.

    *gpu_source* returns ``(gpus, message)`` like :func:`hami_jupyter.gpus.read_gpus` (the
    default); *audit_path* defaults to ``<root>/audit.log``; *overcommit*
    is the initial state of the "allow memory overcommit" box. With
    ``start=False`` nothing refreshes by itself (call :meth:`refresh`).

    Under JupyterHub with the hub service (``HAMI_HUB_SERVICE_URL`` in the
    environment, see :mod:`.hub_client`), and no *root* given, it shows the
    whole hub instead (:class:`.hub_view.HubView`, in :attr:`hub`; :attr:`mode`
    is "hub"). When the service refuses this user or does not answer, it shows
    this host as above, with a one-line note why (:attr:`hub_note`). *hub*:
    "auto" (the default), False (this host only), or a
    :class:`.hub_client.HubClient`.
    """

    def __init__(self, root=None, *, audit_path=None, gpu_source=None, interval=1.0,
                 overcommit=False, start=True, hub="auto"):
        self.root = Path(root) if root else default_root()
        self.audit_path = Path(audit_path) if audit_path else audit.default_path(self.root)
        self.gpu_source, self.interval = gpu_source or read_gpus, interval
        self.gpus, self.gpu_message = [], None
        self.skipped = []  # one line per slice the trust rule refused, as the banner shows them
        self.forms = {}  # slice name -> SliceForm, sorted by name
        self.refresh_count = 0
        self.error = None  # why the last refresh failed, if it did
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hami-admin", daemon=True)
        self.hub, self.hub_note = self._connect_hub(hub, root)
        self.mode = "local" if self.hub is None else "hub"
        self.footer = widgets.HTML()
        if self.hub is not None:
            # The service refreshes on its own clock: reading faster shows nothing new.
            self.interval = max(interval, float(self.hub.service.get("refresh_seconds") or 0) / 2)
            self.widget = widgets.VBox([self.hub.widget, self.footer])
            self.widget.add_class(ADMIN_CLASS)
            self.refresh()
            if start:
                self.start()
            return
        self.title = widgets.HTML(f"<b>HAMi slices</b> <span class='hami-path' style='{_MUTED}; "
                                  f"overflow-wrap: anywhere'>{escape(str(self.root))}</span>")
        self.banner = widgets.HTML()
        self.overcommit = overcommit_box(overcommit)
        self.gpu_table = widgets.HTML()
        self.memory_table = widgets.HTML()  # each slice per GPU: in use, cap, what the guard sees
        self.slices = widgets.VBox()
        # Processes the guard parked under this root: Resume / End (docs/guard.md).
        self.parked_rows = {}
        self.parked_message = widgets.HTML()
        self.parked_box = widgets.VBox()
        self.parked = widgets.VBox([widgets.HTML("<b>Parked by the guard</b>"), self.parked_message,
                                    self.parked_box])
        self.hub_notice = widgets.HTML(
            f'<div class="hami-hub-note" style="{_MUTED}">{escape(self.hub_note)}</div>'
            if self.hub_note else "")
        self.widget = widgets.VBox([self.title, self.hub_notice, self.banner, self.parked,
                                    self.gpu_table, self.overcommit, self.memory_table, self.slices,
                                    self.footer])
        # JupyterLab's density and wrapping lines instead of ipywidgets' 28 px rows
        # (the extension's style/base.css, scoped to this class).
        self.widget.add_class(ADMIN_CLASS)
        self.refresh()
        if start:
            self.start()

    @staticmethod
    def _connect_hub(hub, root):
        """``(HubView or None, note or None)`` for the *hub* argument (see the class)."""
        if hub is False or (hub == "auto" and root is not None):
            return None, None
        if hub == "auto":
            client, first, note = hub_client.connect()
        else:
            client, first, note = hub, None, None
            try:
                first = client.document()
            except hub_client.HubServiceError as e:
                client, note = None, (f"the hub view is unavailable ({e}): this shows this "
                                      "server's host only")
        if client is None:
            return None, note
        return HubView(client, first), None

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    @property
    def read_only(self):
        """True when this user can change no slice shown (the hub view: never; the
        service answers only administrators)."""
        if self.hub is not None:
            return False
        return all(f.read_only for f in self.forms.values())

    @property
    def running(self):
        return self._thread.is_alive() and not self._stopping.is_set()

    def refresh(self):
        """Read the GPUs and every slice once (the hub view: the service's document), and show them."""
        if self.hub is not None:
            with self._lock:
                self.hub.refresh()
                self.refresh_count += 1
                self.footer.value = (f"<small style='{_MUTED}'>updated {time.strftime('%H:%M:%S')}"
                                     f"{f', every {self.interval:g} s' if self.running else ''}</small>")
            return
        with self._lock:
            try:
                gpus, message = self.gpu_source()
            except Exception as e:  # a broken source must not stop the slices from showing
                gpus, message = [], f"GPU facts unavailable: {e}"
            skipped = []
            views = actions.read_slices(self.root, skipped=skipped)
            self.gpus, self.gpu_message, self.skipped = gpus, message, skipped
            self.gpu_table.value = _gpu_lines(gpus, message, actions.commitments(views, gpus))
            self.memory_table.value = _memory_lines(views, _guard_words(self.root))
            self._update_forms(views)
            self._update_parked()
            if not views and not skipped:
                self.banner.value = (f"<div>No slices under {escape(str(self.root))} yet: a slice "
                                     "appears when its first kernel starts.</div>")
            elif self.read_only and views:
                self.banner.value = (f'<div class="hami-read-only" style="font-weight: 600; '
                                     f'color: {LEVEL_COLOUR["warning"]}">{READ_ONLY}</div>')
            else:
                self.banner.value = ""
            # Slices the trust rule refused (another user's file, say): named, never read.
            self.banner.value += _lines(skipped, LEVEL_COLOUR["warning"])
            self.overcommit.disabled = self.read_only
            self.refresh_count += 1
            self.footer.value = (f"<small style='{_MUTED}'>updated {time.strftime('%H:%M:%S')}"
                                 f"{f', every {self.interval:g} s' if self.running else ''}</small>")

    def _update_parked(self):
        wanted = {r["pid"]: r for r in actions.guard_parked(self.root)}
        for pid, record in wanted.items():
            if pid in self.parked_rows:
                self.parked_rows[pid].update(record)
            else:
                self.parked_rows[pid] = ParkedRow(self.guard_act, record)
        for gone in set(self.parked_rows) - set(wanted):
            self.parked_rows.pop(gone).box.close()
        boxes = [self.parked_rows[p].box for p in wanted]
        if list(self.parked_box.children) != boxes:
            self.parked_box.children = boxes
        self.parked.layout.display = None if wanted or self.parked_message.value else "none"

    def guard_act(self, what, record):
        """Resume or end a process the guard parked (root here, else the admin
        service); the line saying what was done, or None (the panel says why)."""
        from .guard_parked import ParkedError

        try:
            message = actions.guard_act(self.root, record["pid"], what, audit_path=self.audit_path)
        except ParkedError as e:
            self.parked_message.value = f'<div style="color: {LEVEL_COLOUR["critical"]}">{escape(str(e))}</div>'
            message = None
        else:
            self.parked_message.value = f"<div>{escape(message)}</div>"
        self.refresh()
        return message

    def _update_forms(self, views):
        for view in views:
            form = self.forms.get(view.name)
            if form is None:
                self.forms[view.name] = SliceForm(self, view)
            else:
                form.update(view)
        names = [v.name for v in views]
        for gone in set(self.forms) - set(names):
            self.forms.pop(gone).close()
        self.forms = {n: self.forms[n] for n in names}
        boxes = [self.forms[n].box for n in names]
        if list(self.slices.children) != boxes:
            self.slices.children = boxes

    # -- the refresh thread --

    def start(self):
        """Refresh every *interval* seconds from a daemon thread until :meth:`stop`."""
        self._thread.start()
        return self

    def _run(self):
        while not self._stopping.wait(self.interval):
            if self.widget.comm is None:  # closed: nobody sees it any more
                break
            try:
                self.refresh()
                self.error = None
            except Exception as e:  # keep trying: the next second may read fine
                self.error = f"refresh failed: {e!r}"
                self.footer.value = (f'<small style="color: {LEVEL_COLOUR["critical"]}">'
                                     f"{escape(self.error)}</small>")

    def stop(self):
        """Stop refreshing; returns once the thread has ended."""
        self._stopping.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
