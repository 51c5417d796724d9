"""``%hami watch``: the slice's status as a widget that refreshes itself.

Each watch refreshes from a daemon thread rather than an asyncio task on the
kernel's event loop: that loop is busy for as long as a cell runs, which is
exactly when a user wants to watch memory grow (a training loop). Widget
updates from a thread are safe: ipykernel sends them through its IOPub
thread. Reading a slice takes well under a millisecond and never waits for
a lock, so a refresh cannot stall on a kernel of the slice that died.

The thread never raises: a slice it cannot read shows as one line of advice
in the widget (and the watch keeps trying, so it recovers when the file is
back); a widget that can no longer be updated (closed) ends the watch.

State stays inspectable: :attr:`Watch.refresh_count`, :attr:`Watch.running`,
:attr:`Watch.error` and the widgets' ``value``; :func:`running_watches` lists
the watches of this process.
"""

import threading
import time
from html import escape

import ipywidgets as widgets

from ..advice import advice
from ..slice.status import slice_status
from ..slice.status_html import LEVEL_COLOUR, format_html

_lock = threading.Lock()
_running = []  # watches started and not stopped, oldest first


class Watch:
    """A live status widget for the slice at *path*, refreshed every *interval* seconds."""

    def __init__(self, path, interval=1.0, current_kernel=None):
        self.path, self.interval, self.current_kernel = path, interval, current_kernel
        self.refresh_count = 0
        self.error = None  # the advice shown when the last refresh could not read the slice
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hami-watch", daemon=True)
        self.html = widgets.HTML()
        self.footer = widgets.HTML()
        self.stop_button = widgets.Button(description="Stop", icon="stop",
                                          tooltip="stop refreshing this view",
                                          layout=widgets.Layout(width="auto"))
        self.stop_button.on_click(lambda _button: self.stop())
        self.widget = widgets.VBox([self.html, widgets.HBox([self.stop_button, self.footer])])

    @property
    def running(self):
        return self._thread.is_alive() and not self._stop.is_set()

    def start(self):
        self.refresh()  # the first view is there when the cell's output appears
        self._thread.start()
        return self

    def refresh(self):
        """Read the slice once and show it (or why it could not be read)."""
        try:
            self.html.value = format_html(slice_status(self.path), self.current_kernel)
            self.error = None
        except Exception as e:  # anything: the widget is the only place it can go
            self.error = f"hami: {advice(e, self.path)}"
            self.html.value = (f'<div style="color: {LEVEL_COLOUR["critical"]}">'
                               f"{escape(self.error)}</div>")
        self.refresh_count += 1
        self.footer.value = (f"<small>updated {time.strftime('%H:%M:%S')}, "
                             f"every {self.interval:g} s</small>")

    def _run(self):
        while not self._stop.wait(self.interval):
            if self.html.comm is None:  # the widget was closed: nobody sees it any more
                break
            try:
                self.refresh()
            except Exception:  # updating the widget itself failed; nothing left to show
                break
        self._forget()

    def stop(self):
        """Stop refreshing; returns once the thread has ended (at most a refresh later)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self._forget()
        self.stop_button.disabled = True
        self.stop_button.description = "Stopped"
        self.footer.value = (f"<small>stopped at {time.strftime('%H:%M:%S')} after "
                             f"{self.refresh_count} refreshes</small>")

    def _forget(self):
        with _lock:
            if self in _running:
                _running.remove(self)


def start(path, interval=1.0, current_kernel=None):
    """Start a :class:`Watch` of the slice at *path* and return it (not displayed)."""
    watch = Watch(path, interval, current_kernel)
    with _lock:
        _running.append(watch)
    return watch.start()


def running_watches():
    """The watches of this process that are still refreshing, oldest first."""
    with _lock:
        return list(_running)


def stop_all():
    """Stop every watch of this process; returns how many were running."""
    watches = running_watches()
    for w in watches:
        w.stop()
    return len(watches)
