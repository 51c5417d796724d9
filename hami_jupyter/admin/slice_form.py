"""The limits form of the admin panel, one per slice: the local panel's
(:class:`.panel.SliceForm`) and the hub view's (:class:`.hub_view.HubSliceForm`)
are this one form, so both behave alike.

The form edits the limits of all GPUs or of one GPU, picked in its first
selector ("limits for"): "all GPUs" (:data:`DEFAULT`, the slice's default
entry: every GPU without limits of its own) or "GPU 0". Its inputs are the
memory cap, the guarantee ("always kept": "whole cap" where none is set, the
cap is the guarantee), the SM share ("compute %") and the mode ("above the
share": never, hard; if the GPU is idle, elastic), then Apply: plain words,
each explained in its tooltip. Sizes show as everything else shows them
("4.0 GiB"); an admin may type them so or as ``4g``. The rules both views
keep:

* A refresh reloads the inputs only while they show what was loaded
  (:meth:`LimitsForm.pending` is empty), so it never overwrites what an
  admin is typing.
* Apply sends only the edited fields, so changing a memory cap never writes
  back an SM share another admin changed meanwhile.
* Every edit is checked at once, and again before Apply, by the grammar
  :func:`.changes.propose` uses (:func:`value_problems`): a malformed value is
  refused in the same words wherever it is typed, before anything is sent.

The view supplies the entry's limits (:meth:`LimitsForm.entry_limits`), what
an edit that passes the check shows (:meth:`LimitsForm.preview`) and Apply
itself (:meth:`LimitsForm.apply`).

The row fits a notebook beside JupyterLab's slice panel: descriptions as
wide as their words (never cut), inputs as wide as what they hold, short
labels with the whole text as a tooltip. Should the notebook be narrower
still, the row wraps rather than push Apply past the edge.
"""

import re
from html import escape

import ipywidgets as widgets

from ..slice.limits import LimitError, parse_mode
from ..slice.size import format_size, parse_size
from ..slice.status_html import LEVEL_COLOUR
from .changes import DEFAULT_GUARANTEE, parse_guarantee, parse_memory, parse_sm

DEFAULT = "default"  # the entry selector's value for the slice's default entry
DEFAULT_LABEL = "all GPUs"
DEFAULT_TOOLTIP = "all GPUs: the limits of every GPU without limits of its own"
FIELDS = ("memory", "guarantee", "sm", "mode")
MODES = ("hard", "elastic")
# The mode in plain words: may the slice's kernels go above their compute share?
MODE_WORDS = (("never", "hard"), ("if the GPU is idle", "elastic"))
# The guarantee input's word for "none set: the whole cap is kept".
WHOLE_CAP = "whole cap"

FORM_ROW = {"flex_flow": "row wrap", "align_items": "center"}
FORM_BUTTON = {"width": "auto", "flex": "0 0 auto"}
# A description as wide as its words: ipywidgets' fixed width cuts longer ones.
LABEL_STYLE = {"description_width": "initial"}


def _input_layout(width):
    return widgets.Layout(width=width, flex="0 0 auto")


def memory_text(n):
    """A cap as every view shows it: ``4.0 GiB``, ``1.5 GiB``; bytes (``1234567 B``)
    where those figures would round it; ``none`` without a cap."""
    if not n:
        return "none"
    shown = format_size(n)
    return shown if parse_size(typed(shown)) == n else f"{n} B"


def typed(text):
    """*text* as the size grammar reads it: "4.0 GiB" as "4.0GiB" (the grammar,
    shared with the C library, has no spaces); the guarantee's "whole cap" as
    ``default``."""
    if text.strip().lower() in (WHOLE_CAP, f"the {WHOLE_CAP}"):
        return DEFAULT_GUARANTEE
    return re.sub(r"(?<=[0-9.]) (?=[A-Za-z])", "", text)


def guarantee_text(memory_limit, guarantee):
    """The guarantee input's text: "whole cap" where the guarantee in force
    (*guarantee*, bytes; None: unknown) is the cap, else the size."""
    if not guarantee or guarantee == memory_limit:
        return WHOLE_CAP
    return memory_text(guarantee)


def limit_texts(memory_limit, sm_share, mode, guarantee=None):
    """The inputs' texts for an entry's limits (bytes, percent, mode, and the
    guarantee in force in bytes)."""
    return {"memory": memory_text(memory_limit),
            "guarantee": guarantee_text(memory_limit, guarantee),
            "sm": str(sm_share) if sm_share else "none",
            "mode": mode if mode in MODES else "hard"}


def value_problems(fields):
    """What is wrong with the edited *fields* (``memory``, ``guarantee``,
    ``sm``, ``mode`` texts) alone, one line each, in the words of
    :func:`.changes.propose`."""
    problems = []
    for name, parse in (("memory", parse_memory), ("guarantee", parse_guarantee),
                        ("sm", parse_sm), ("mode", lambda v: parse_mode(v, "mode"))):
        if name in fields:
            try:
                parse(fields[name])
            except LimitError as e:
                problems.append(str(e))
    return problems


def gpu_entry(index, uuid, follows_default=False):
    """``(label, tooltip)`` of a GPU's entry: "GPU 0" (the index where known,
    else the UUID's start), the whole UUID in the tooltip; "(as default)"
    while the GPU has no limits of its own."""
    name = f"GPU {index}" if index is not None else f"GPU {uuid[:12]}\u2026"
    tooltip = f"GPU {index} ({uuid})" if index is not None else f"GPU {uuid}"
    if follows_default:
        return (f"{name} (as all GPUs)",
                f"{tooltip}: no limits of its own, it follows the limits for all GPUs")
    return name, tooltip


class LimitsForm:
    """The entry selector, memory, SM %, mode and Apply of one slice, with a
    message under them (:attr:`errors`, :attr:`warnings`)."""

    def __init__(self):
        self.errors, self.warnings = [], []
        self._loaded = {}  # what load() put in the inputs: the "pristine" values
        self._loading = False
        self._entry_tooltips = {DEFAULT: DEFAULT_TOOLTIP}
        self.device = widgets.Dropdown(description="limits for", options=[(DEFAULT_LABEL, DEFAULT)],
                                       tooltip=DEFAULT_TOOLTIP, style=LABEL_STYLE,
                                       layout=_input_layout("15em"))
        self.memory = widgets.Text(description="memory cap", placeholder="4 GiB or none",
                                   tooltip="the most memory the slice may hold on each GPU: 4 GiB, "
                                           "4g, 4096m, bytes, or none",
                                   continuous_update=False, style=LABEL_STYLE,
                                   layout=_input_layout("12em"))
        self.guarantee = widgets.Text(
            description="always kept", placeholder="2 GiB or whole cap",
            tooltip="memory the slice keeps on each GPU whatever others need, at most the cap: "
                    "2 GiB, 2g, bytes, or whole cap (none set: the cap is kept). Above it memory "
                    "is lent: idle kernels may be parked to make room for others",
            continuous_update=False, style=LABEL_STYLE, layout=_input_layout("13em"))
        self.sm = widgets.Text(description="compute %", placeholder="1-100",
                               tooltip="the slice's share of each GPU's compute (its SMs, the "
                                       "streaming multiprocessors): a whole percent 1-100, or none",
                               continuous_update=False, style=LABEL_STYLE,
                               layout=_input_layout("8.5em"))
        self.mode = widgets.Dropdown(description="above the share", options=list(MODE_WORDS),
                                     tooltip="may the slice's kernels use more compute than their "
                                             "share? never (hard), or while the GPU is otherwise "
                                             "idle (elastic)",
                                     style=LABEL_STYLE, layout=_input_layout("16em"))
        self.apply_button = widgets.Button(description="Apply", icon="check",
                                           button_style="primary", layout=FORM_BUTTON,
                                           tooltip="check and apply the edited fields now")
        self.message = widgets.HTML()
        self.device.observe(self._on_device, names="value")
        for w in self._field_inputs():
            w.observe(self._on_edit, names="value")
        self.apply_button.on_click(lambda _button: self.apply())
        self.inputs = (self.device, self.memory, self.guarantee, self.sm, self.mode,
                       self.apply_button)

    def _field_inputs(self):
        """The inputs of :data:`FIELDS`, in that order."""
        return (self.memory, self.guarantee, self.sm, self.mode)

    def row(self, *extra):
        """The inputs and Apply (then *extra* widgets) as one row."""
        return widgets.HBox(list(self.inputs) + list(extra), layout=FORM_ROW)

    # -- what the view supplies --

    def entry_limits(self):
        """The selected entry's limits now, as :func:`limit_texts`; None when unknown."""
        raise NotImplementedError

    def preview(self, fields):
        """Show what Apply would do with the edited *fields*, which pass :func:`value_problems`."""

    def apply(self):
        raise NotImplementedError

    # -- the entries --

    def set_entries(self, entries):
        """The GPUs' entries after the default: ``(label, value, tooltip)`` each. The
        selection stays where it still exists, else goes back to the default."""
        options = [(DEFAULT_LABEL, DEFAULT)] + [(label, value) for label, value, _ in entries]
        self._entry_tooltips = {DEFAULT: DEFAULT_TOOLTIP,
                                **{value: tip for _, value, tip in entries}}
        if list(self.device.options) != options:
            chosen = self.device.value
            self._loading = True  # new options reset the selection: put it back quietly
            try:
                self.device.options = options
                self.device.value = chosen if chosen in [v for _, v in options] else DEFAULT
            finally:
                self._loading = False
        self.device.tooltip = self._entry_tooltips.get(self.device.value, DEFAULT_TOOLTIP)

    def device_ref(self):
        """The entry as :func:`.changes.propose` takes it: None for the default."""
        return None if self.device.value == DEFAULT else self.device.value

    # -- the inputs --

    def load(self):
        """Put the selected entry's limits in the inputs (discarding edits)."""
        texts = self.entry_limits()
        if texts is None:
            return
        self._loading = True
        try:
            for w, f in zip(self._field_inputs(), FIELDS):
                w.value = texts[f]
        finally:
            self._loading = False
        self._loaded = dict(texts)

    def pending(self):
        """The edited fields, ``{"memory"|"guarantee"|"sm"|"mode": text}``: what Apply
        sends, sizes as the grammar reads them (:func:`typed`)."""
        now = {f: w.value for f, w in zip(FIELDS, self._field_inputs())}
        return {f: typed(now[f]) for f in FIELDS if self._loaded and now[f] != self._loaded[f]}

    def forget_loaded(self):
        """After an Apply: the inputs follow the slice again at the next load."""
        self._loaded = {}

    def set_disabled(self, disabled):
        for w in self.inputs:
            w.disabled = disabled

    # -- messages --

    def show(self, headline, colour, errors=(), warnings=()):
        self.errors, self.warnings = list(errors), list(warnings)
        self.message.value = (f'<div style="color: {colour}">{escape(headline)}</div>'
                              + _lines(errors, LEVEL_COLOUR["critical"])
                              + _lines(warnings, LEVEL_COLOUR["warning"]))

    def refuse_malformed(self, verb="not applied:"):
        """Show the edited fields' :func:`value_problems` under *verb*; True when
        there were any (Apply then sends nothing)."""
        problems = value_problems(self.pending())
        if problems:
            self.show(verb, LEVEL_COLOUR["critical"], problems)
        return bool(problems)

    def _on_device(self, _change):
        self.device.tooltip = self._entry_tooltips.get(self.device.value, DEFAULT_TOOLTIP)
        if not self._loading:
            self.load()
            self.show("", "inherit")

    def _on_edit(self, _change):
        if self._loading or not self.pending():
            return
        if not self.refuse_malformed("cannot apply:"):
            self.preview(self.pending())


def _lines(items, colour):
    return "".join(f'<div style="color: {colour}">{escape(t)}</div>' for t in items)


OVERCOMMIT_LABEL = "allow promising more memory than a GPU has"
OVERCOMMIT_TOOLTIP = ("memory overcommit: a change may then promise the slices of a GPU (their "
                      "guarantees, a hard slice's whole cap) more memory than the GPU has; it is "
                      "applied with a warning instead of refused")


def overcommit_box(value=False):
    """The memory overcommit box both views put above their forms: plain words,
    the whole rule as its tooltip, as wide as its words."""
    return widgets.Checkbox(value=value, indent=False, description=OVERCOMMIT_LABEL,
                            tooltip=OVERCOMMIT_TOOLTIP, layout=widgets.Layout(width="auto"))
