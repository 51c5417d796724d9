"""The admin panel's hub view: every node, GPU, slice, user and kernel of the hub.

What ``AdminPanel()`` shows in a notebook under JupyterHub when the hub
service (``hami-jupyter hub-service``) answers this user: the service's
document (:mod:`hami_jupyter.hubview.document`), drawn as

- one section per node: a table per GPU (name, memory of all its slices
  against the GPU's, parked memory, the sums of their caps and of their
  guarantees, what NVML and the guard really see, SM use, a chart of the last
  minutes with the GPU's memory as a dashed line, and who waits for room on
  it), then the slices on it with their users, caps and guarantees, SM share
  and use, and their kernels with their idle time, why one was parked and
  what one waits for;
- the same controls as the local panel: per kernel interrupt, restart, shut
  down, park or resume; per server stop; per slice a resize form (memory, SM
  share, mode; one GPU's entry or the default) that the service applies live
  on the hub's own node and audit-logs, or, on Kubernetes, a choice of the
  size for the user's next start;
- a table of users with a chart each (memory used, the sum of their caps as
  the line), and the servers that did not answer, with why.

Nothing here reads a slice file: the service does the reading on every node.
State is inspectable without a browser: :attr:`HubView.document`,
:attr:`HubView.kernel_rows` (by kernel id), :attr:`HubView.slice_forms` (by
``(node, slice)``), :attr:`HubView.server_rows` (by ``(user, server)``),
:attr:`HubView.message` (the last action's outcome).
"""

from html import escape

import ipywidgets as widgets

from ..slice.size import format_size
from ..slice.status import PARK_REASON_WORDS, room_wait_text
from ..slice.status_html import LEVEL_COLOUR, MUTED_COLOUR, kernel_label, parts_line, short_uuid
from .hub_client import HubServiceError
from .parked_rows import ParkedRow
from .slice_form import (DEFAULT, FORM_BUTTON, FORM_ROW, LABEL_STYLE, LimitsForm, gpu_entry,
                         limit_texts, overcommit_box)
from .sparkline import sparkline

_MUTED_COLOUR = MUTED_COLOUR
_MUTED = f"color: {_MUTED_COLOUR}"


def _cap(n):
    return format_size(n) if n else "none"


def _idle(seconds):
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


MEASURED_TIP = ("what the GPU really holds, as the guard measures it with NVML; not measured: "
                "no guard runs on that node")


def _real(value, state):
    """What the guard measures, in words: "measured 1.5 GiB", "not measured"."""
    if value is None:
        return f'<span title="{escape(MEASURED_TIP)}" style="{_MUTED}">not measured</span>'
    text = f"measured {format_size(value)}"
    if state == "over":
        return (f'<span class="hami-guard-over" style="font-weight: 600; color: '
                f'{LEVEL_COLOUR["critical"]}">{text}, over the cap</span>')
    return f'<span title="{escape(MEASURED_TIP)}">{text}</span>'





def _kernel_label(k):
    where = f"{escape(k['user'] or '?')}" + (f"/{escape(k['server'])}" if k.get("server") else "")
    state = k.get("execution_state") or "?"
    why = PARK_REASON_WORDS.get(k.get("park_reason")) if k.get("park_state") == "parked" else None
    parked = (f", {escape(k['park_state'])}{' ' + escape(why) if why else ''} "
              f"{format_size(k['memory_parked'])}"
              if k.get("park_state", "running") != "running" else "")
    room = room_wait_text(k.get("room_wait"))
    parked += f", {escape(room)}" if room else ""
    return (f"{kernel_label(k)} {where} "
            f"<span style='{_MUTED}'>{escape(k.get('slice') or 'no slice')} on "
            f"{escape(k['node'])}: {format_size(k['memory_used'])}, SM {k['sm_util']} %, "
            f"{escape(state)}, idle {_idle(k.get('idle_seconds'))}{parked}</span>")


def _cap_cell(s):
    """A slice's cap on a GPU, with its guarantee where that is less."""
    guarantee = s.get("memory_guarantee")
    if guarantee is None or guarantee == (s["memory_limit"] or 0):
        return _cap(s["memory_limit"])
    return f"{_cap(s['memory_limit'])} <span style='{_MUTED}'>({format_size(guarantee)} guaranteed)</span>"


def _waiting_html(gpu):
    """Who waits for room on *gpu*, oldest first; "" when nobody does."""
    waiting = gpu.get("waiting") or []
    if not waiting:
        return ""
    who = "; ".join(
        f"{escape(w['user'] or w['slice'])}"
        + (f" ({kernel_label(w)})" if w.get("kernel_id") else f" (pid {w['pid']})")
        + f" {escape(room_wait_text(w))}" for w in waiting)
    return (f'<div class="hami-hub-waiting" style="color: {LEVEL_COLOUR["warning"]}">'
            f"Waiting for room on this GPU: {who}</div>")


def gpu_html(node, gpu, history, oversubscription=None):
    """One GPU of *node*: its facts, a chart, who waits for room on it, and its
    slices with their kernels, each a line that wraps between its parts (a
    narrow notebook scrolls nothing sideways). *oversubscription*: the
    policy's factor, when the hub admits starts by it (its caps' bound is then
    shown)."""
    key = f"{node['node']}/{gpu['uuid']}"
    chart = sparkline(history.get("gpus", {}).get(key, []), label=f"GPU {gpu['uuid']}")
    name = escape(gpu.get("name") or "GPU")
    index = "" if gpu.get("index") is None else f"{gpu['index']} "
    caps = (f"caps {format_size(gpu['memory_limits'])}"
            f"{' (+' + str(gpu['uncapped_slices']) + ' without a cap)' if gpu['uncapped_slices'] else ''}"
            f"{_bound(gpu, oversubscription)}")
    facts = [f"<b>{index}{name}</b>",
             f'<span style="{_MUTED}">'
             f"{short_uuid(gpu['uuid'], [g['uuid'] for g in node.get('gpus', [])])}</span>",
             f"{format_size(gpu['memory_used'])} of "
             f"{format_size(gpu['memory_total']) if gpu['memory_total'] else '?'} used by slices",
             f"{format_size(gpu['memory_parked'])} parked" if gpu["memory_parked"] else "",
             caps,
             f"guaranteed {format_size(gpu.get('memory_guarantees', gpu['memory_limits']))}",
             _on_gpu(gpu), _real(gpu["memory_real"], None), f"SM {gpu['sm_util']} %", chart]
    head = parts_line(facts, "hami-hub-gpu") + _waiting_html(gpu)
    lines = []
    for s in gpu["slices"]:
        level = s.get("memory_level") or "ok"
        colour = LEVEL_COLOUR.get(level, "inherit")
        share = f"SM share {s['sm_share']} % ({s['mode']})" if s["sm_share"] else "no SM share"
        parts = [f"<b>{escape(s['slice'])}</b>", escape(", ".join(s["users"])),
                 f'<span style="color: {colour}">{format_size(s["memory_used"])}</span> in use of '
                 f"{_cap_cell(s)}",
                 f"{format_size(s['memory_parked'])} parked" if s["memory_parked"] else "",
                 _real(s["memory_real"], s["guard_state"]), share, f"SM {s['sm_util']} % in use"]
        kernels = "".join(f'<div class="hami-hub-kernel" style="padding-left: 1em">{_kernel_label(k)}</div>'
                          for k in s["kernels"])
        lines.append(f'<div class="hami-hub-slice">{parts_line(parts, "hami-hub-slice-line")}'
                     f"{kernels}</div>")
    return head + (f'<div class="hami-hub-slices">{"".join(lines)}</div>' if lines else "")


def _bound(gpu, oversubscription):
    """" (up to 4 x the GPU at a start)": the bound the hub's admission holds the caps to."""
    if not oversubscription or not gpu.get("memory_total"):
        return ""
    return (f" (up to {format_size(int(oversubscription * gpu['memory_total']))}, "
            f"{oversubscription:g} x the GPU, at a start)")


def _on_gpu(gpu):
    """"9.0 GiB on the GPU (NVML)": every process's bytes, where NVML told."""
    used = gpu.get("nvml_memory_used")
    return "" if used is None else f"{format_size(used)} on the GPU (NVML)"


def node_html(node, history, oversubscription=None):
    """A node: its GPUs, kernels holding no GPU memory, and slices it could not read."""
    parts = [f'<h4 class="hami-hub-node" style="margin: 8px 0 2px 0">node {escape(node["node"])} '
             f'<span style="{_MUTED}; font-weight: normal">{len(node["servers"])} server(s)</span></h4>']
    if node.get("gpu_facts_error") and not node["gpus"]:
        parts.append(f'<div style="{_MUTED}">{escape(node["gpu_facts_error"])}</div>')
    parts += [gpu_html(node, g, history, oversubscription) for g in node["gpus"]]
    if node["kernels_without_gpu"]:
        parts.append("<div>Kernels holding no GPU memory: "
                     + "; ".join(_kernel_label(k) for k in node["kernels_without_gpu"]) + "</div>")
    for e in node["errors"]:
        parts.append(f'<div style="color: {LEVEL_COLOUR["critical"]}">slice '
                     f'{escape(str(e["slice"]))}: {escape(e["error"])}</div>')
    return "".join(parts)


def users_html(document):
    """One wrapping line per user: servers, kernels, memory against the caps, a chart."""
    history = document.get("history", {}).get("users", {})
    lines = []
    for u in document["users"]:
        servers = ", ".join(s or "(default)" for s in u["servers"])
        lines.append(parts_line([
            f"<b>{escape(u['user'])}</b>", f"server(s) {escape(servers)}", f"{u['kernels']} kernel(s)",
            f"{format_size(u['memory_used'])} / {_cap(u['memory_limit'])} in use of the caps",
            f"{format_size(u['memory_parked'])} parked" if u["memory_parked"] else "",
            f"SM {u['sm_util']} %", sparkline(history.get(u["user"], []), label=u["user"]),
        ], "hami-hub-user"))
    if not lines:
        return "<div>No user has a server running.</div>"
    return f'<div class="hami-hub-users">{"".join(lines)}</div>'


def servers_html(document):
    """Servers the service could not read, each with why; "" when all answered."""
    lines = []
    for s in document["servers"]:
        if s["state"] == "ready":
            continue
        label = escape(s["user"]) + (f"/{escape(s['server'])}" if s["server"] else "")
        colour = LEVEL_COLOUR["critical"] if s["state"] == "unreachable" else _MUTED_COLOUR
        lines.append(f'<div class="hami-hub-unreachable" style="color: {colour}">server {label} '
                     f"({escape(s['url'])}): {escape(s['state'])}: {escape(s['error'] or '')}</div>")
    if document.get("hub_error"):
        lines.insert(0, f'<div style="color: {LEVEL_COLOUR["critical"]}">the Hub API: '
                        f'{escape(document["hub_error"])}</div>')
    return "".join(lines)


def every_kernel(document):
    """Every kernel of *document* once (a kernel on two GPUs once), nodes in order."""
    found = {}
    for node in document.get("nodes", []):
        for gpu in node["gpus"]:
            for s in gpu["slices"]:
                for k in s["kernels"]:
                    found.setdefault(k["kernel_id"], k)
        for k in node["kernels_without_gpu"]:
            found.setdefault(k["kernel_id"], k)
    return list(found.values())


class KernelRow:
    """Buttons for one kernel: interrupt, restart, shut down, park or resume."""

    VERBS = (("interrupt", "Interrupt", "stop"), ("restart", "Restart", "refresh"),
             ("shutdown", "Shut down", "power-off"))

    def __init__(self, view, kernel):
        self.view, self.kernel = view, kernel
        self.label = widgets.HTML()
        self.buttons = {}
        for action, text, icon in self.VERBS:
            b = widgets.Button(description=text, icon=icon, layout=widgets.Layout(width="auto"),
                               tooltip=f"{text.lower()} this kernel (on its server)")
            b.on_click(lambda _b, a=action: self.act(a))
            self.buttons[action] = b
        self.park = widgets.Button(layout=widgets.Layout(width="auto"))
        self.park.on_click(lambda _b: self.act("park" if self.parked_verb() == "park" else "resume"))
        self.box = widgets.HBox([*self.buttons.values(), self.park, self.label], layout=FORM_ROW)
        self.update(kernel)

    def parked_verb(self):
        return "park" if self.kernel.get("park_state", "running") == "running" else "resume"

    def update(self, kernel):
        self.kernel = kernel
        self.label.value = _kernel_label(kernel)
        verb = self.parked_verb()
        self.park.description = verb.capitalize()
        self.park.icon = "pause" if verb == "park" else "play"
        self.park.disabled = kernel.get("slice") is None or kernel.get("park_state") in (
            "parking", "resuming")

    def act(self, action):
        """Do *action* on this kernel through the service; the answer, or None."""
        k = self.kernel
        return self.view.act(action=action, user=k["user"], server=k.get("server") or "",
                             kernel_id=k["kernel_id"])


class ServerRow:
    """A button to stop one server."""

    def __init__(self, view, server):
        self.view, self.server = view, server
        self.button = widgets.Button(description="Stop server", icon="stop",
                                     layout=widgets.Layout(width="auto"),
                                     tooltip="ask the hub to stop this server (its kernels end)")
        self.button.on_click(lambda _b: self.stop())
        self.label = widgets.HTML()
        self.box = widgets.HBox([self.button, self.label], layout=FORM_ROW)
        self.update(server)

    def update(self, server):
        self.server = server
        who = escape(server["user"]) + (f"/{escape(server['server'])}" if server["server"] else "")
        self.label.value = (f"server {who} <span style='{_MUTED}'>{escape(server['state'])} on "
                            f"{escape(server.get('node') or '?')}</span>")

    def stop(self):
        return self.view.act(action="stop-server", user=self.server["user"],
                             server=self.server["server"])


class HubSliceForm(LimitsForm):
    """Resize one slice of one node (live on the hub's node), or pick the
    user's next size on Kubernetes: the limits form of :mod:`.slice_form`,
    applied through the service."""

    def __init__(self, view, entries):
        super().__init__()
        self.view = view
        self.node, self.name = entries[0]["node"], entries[0]["slice"]
        self.label = widgets.HTML()
        self.next_size = widgets.Dropdown(description="next start", style=LABEL_STYLE,
                                          layout=widgets.Layout(width="auto"))
        self.next_button = widgets.Button(description="Set next size", icon="forward",
                                          layout=FORM_BUTTON,
                                          tooltip="the size of the user's next server start")
        self.next_button.on_click(lambda _b: self.set_next_size())
        self.note = widgets.HTML()
        self.resize_box = self.row()
        self.next_box = widgets.HBox([self.next_size, self.next_button], layout=FORM_ROW)
        self.box = widgets.VBox([self.label, self.resize_box, self.message, self.next_box,
                                 self.note])
        self.update(entries)

    @property
    def users(self):
        return sorted({u for e in self.entries for u in e["users"]})

    def update(self, entries):
        self.entries = entries
        service = self.view.service
        k8s = service.get("kubernetes")
        local = self.node == service.get("node")
        self.label.value = (f"<b>slice {escape(self.name)}</b> on {escape(self.node)} "
                            f"<span style='{_MUTED}'>({escape(', '.join(self.users))})</span>")
        self.resize_box.layout.display = "none" if k8s else None
        self.next_box.layout.display = None if k8s else "none"
        self.set_disabled(not local)
        if k8s:
            sizes = list(service.get("sizes") or [])
            if list(self.next_size.options) != sizes:
                self.next_size.options = sizes
            self.next_button.disabled = not (sizes and service.get("next_sizes"))
            self.note.value = (f"<span style='{_MUTED}'>On Kubernetes a slice is as large as its "
                               "pod: a new size takes effect at the user's next server start.</span>")
        elif not local:
            self.note.value = (f"<span style='{_MUTED}'>Its limits files are on {escape(self.node)}; "
                               f"this hub resizes slices of {escape(str(service.get('node')))} "
                               f"only (there: hami-jupyter slice set {escape(self.name)} ...)</span>")
        entries_shown = []
        for e in entries:
            label, tooltip = gpu_entry(e.get("index"), e["uuid"], e.get("limit_is_fallback", False))
            entries_shown.append((label, e["uuid"], tooltip))
        self.set_entries(entries_shown)
        if not self.pending():
            self.load()

    def entry_limits(self):
        if self.device.value == DEFAULT:
            d = self.entries[0].get("default_limit") or {}
            limit = d.get("memory_limit", 0)
            return limit_texts(limit, d.get("sm_share", 0), d.get("mode", "hard"),
                               d.get("memory_guarantee") or limit)
        e = next(e for e in self.entries if e["uuid"] == self.device.value)
        return limit_texts(e["memory_limit"], e["sm_share"], e["mode"], e.get("memory_guarantee"))

    def preview(self, fields):
        self.show("on Apply: " + ", ".join(f"{k} {v}" for k, v in fields.items()),
                  _MUTED_COLOUR)

    def apply(self):
        """Send the edited fields to the service; its answer, or None (the message says why)."""
        fields = self.pending()
        if not fields:
            self.view.show("not applied:", ["nothing to change: edit the memory cap, the "
                                            "guarantee, the SM share or the mode first"],
                           error=True)
            return None
        if self.refuse_malformed():
            self.view.show("not applied:", self.errors, error=True)
            return None
        answer = self.view.act(action="resize", node=self.node, slice=self.name,
                               device=self.device_ref(),
                               overcommit=self.view.overcommit.value, **fields)
        if answer is not None:
            self.forget_loaded()
            self.show("", "inherit")
        return answer

    def set_next_size(self):
        users = self.users
        return self.view.act(action="next-size", user=users[0] if users else self.name,
                             size=self.next_size.value)


class HubView:
    """The hub view's widgets for *client* (:class:`.hub_client.HubClient`),
    first showing *document*."""

    def __init__(self, client, document):
        self.client = client
        self.document = document
        self.kernel_rows, self.slice_forms, self.server_rows = {}, {}, {}
        self.parked_rows = {}  # (node, pid) -> ParkedRow
        self.message, self.errors = "", []
        self.last_answer = None
        self.title = widgets.HTML()
        self.outcome = widgets.HTML()
        self.overcommit = overcommit_box()
        self.unreachable = widgets.HTML()
        self.nodes = widgets.HTML()
        self.users = widgets.HTML()
        self.kernels_box = widgets.VBox()
        self.slices_box = widgets.VBox()
        self.servers_box = widgets.VBox()
        self.parked_title = widgets.HTML("<b>Parked by the guard</b>")
        self.parked_box = widgets.VBox()
        self.widget = widgets.VBox([
            self.title, self.outcome, self.unreachable, self.nodes,
            self.parked_title, self.parked_box,
            widgets.HTML("<b>Users</b>"), self.users,
            widgets.HTML("<b>Kernels</b>"), self.kernels_box,
            widgets.HTML("<b>Slices</b>"), self.overcommit, self.slices_box,
            widgets.HTML("<b>Servers</b>"), self.servers_box])
        self.show_document(document)

    @property
    def service(self):
        return self.document.get("service") or {}

    def refresh(self):
        """Read the service's document again and show it."""
        self.show_document(self.client.document())

    def show_document(self, document):
        self.document = document
        history = document.get("history", {})
        nodes = document.get("nodes", [])
        gpus = sum(len(n["gpus"]) for n in nodes)
        self.title.value = (f"<b>HAMi slices across the hub</b> <span style='{_MUTED}'>"
                            f"{len(nodes)} node(s), {gpus} GPU(s), {len(document['servers'])} "
                            f"server(s); as {escape(str(document.get('viewer')))}; refreshed by the "
                            f"service every {self.service.get('refresh_seconds', '?')} s</span>")
        self.unreachable.value = servers_html(document)
        over = self.service.get("memory_oversubscription")
        self.nodes.value = "".join(node_html(n, history, over) for n in nodes) or \
            "<div>No server answered yet.</div>"
        self.users.value = users_html(document)
        self._update_parked()
        self._update_kernels()
        self._update_slices()
        self._update_servers()

    def _update_parked(self):
        wanted = {(n["node"], p["pid"]): (n["node"], p) for n in self.document.get("nodes", [])
                  for p in n.get("parked", [])}
        for key, (node, record) in wanted.items():
            if key in self.parked_rows:
                self.parked_rows[key].update(record)
            else:
                self.parked_rows[key] = ParkedRow(
                    lambda what, r, node=node: self.act(action=f"guard-{what}", node=node, pid=r["pid"]),
                    record, node)
        for gone in set(self.parked_rows) - set(wanted):
            self.parked_rows.pop(gone).box.close()
        children = [self.parked_rows[k].box for k in wanted]
        if list(self.parked_box.children) != children:
            self.parked_box.children = children
        shown = None if wanted else "none"
        self.parked_title.layout.display = shown
        self.parked_box.layout.display = shown

    def _sync(self, rows, wanted, make, box):
        for key, item in wanted.items():
            if key in rows:
                rows[key].update(item)
            else:
                rows[key] = make(self, item)
        for gone in set(rows) - set(wanted):
            rows.pop(gone).box.close()
        children = [rows[k].box for k in wanted]
        if list(box.children) != children:
            box.children = children

    def _update_kernels(self):
        self._sync(self.kernel_rows, {k["kernel_id"]: k for k in every_kernel(self.document)},
                   KernelRow, self.kernels_box)

    def _update_slices(self):
        found = {}
        for node in self.document.get("nodes", []):
            for gpu in node["gpus"]:
                for s in gpu["slices"]:
                    found.setdefault((node["node"], s["slice"]), []).append(
                        {**s, "index": gpu.get("index")})  # the form names GPUs by index
        self._sync(self.slice_forms, found, HubSliceForm, self.slices_box)

    def _update_servers(self):
        wanted = {}
        if self.service.get("allow_stop_server", True):
            wanted = {(s["user"], s["server"]): s for s in self.document["servers"]}
        self._sync(self.server_rows, wanted, ServerRow, self.servers_box)

    # -- actions --

    def show(self, headline, lines=(), error=False, warnings=()):
        self.message = headline
        self.errors = list(lines) if error else []
        colour = LEVEL_COLOUR["critical"] if error else LEVEL_COLOUR["ok"]
        self.outcome.value = (f'<div style="color: {colour}">{escape(headline)}</div>'
                              + "".join(f'<div style="color: {LEVEL_COLOUR["critical"] if error else "inherit"}">'
                                        f"{escape(x)}</div>" for x in lines)
                              + "".join(f'<div style="color: {LEVEL_COLOUR["warning"]}">'
                                        f"{escape(w)}</div>" for w in warnings))

    def act(self, **request):
        """One action through the service; its answer, or None (shown either way)."""
        try:
            answer = self.client.act(**request)
        except HubServiceError as e:
            self.last_answer = e.body
            errors = e.body.get("errors") or []
            self.show(f"not done: {e}", [x for x in errors if x not in str(e)], error=True,
                      warnings=e.body.get("warnings") or [])
            return None
        self.last_answer = answer
        self.show(answer.get("message", "done"), warnings=answer.get("warnings") or [])
        try:
            self.refresh()
        except HubServiceError:
            pass  # the next refresh shows it
        return answer
