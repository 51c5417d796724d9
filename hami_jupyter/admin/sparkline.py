"""Small inline SVG charts of the last minutes: memory used, and the cap as a line.

The hub view draws one per GPU and one per user from the service's history
(samples ``[unix time, memory used, cap, SM utilization]``). Plain SVG in the
HTML the widgets already show: no JavaScript, nothing to install, and it
renders in JupyterLab, Notebook and a saved notebook alike.
"""

from html import escape

from ..slice.size import format_size

USED_COLOUR = "var(--jp-brand-color1, #1976d2)"
CAP_COLOUR = "var(--jp-error-color1, #d32f2f)"


def _points(samples, index, t0, span, top, width, height):
    out = []
    for s in samples:
        x = 0 if span <= 0 else (s[0] - t0) / span * width
        y = height - (s[index] or 0) / top * (height - 2) - 1
        out.append(f"{x:.1f},{y:.1f}")
    return " ".join(out)


def sparkline(samples, width=160, height=28, label=""):
    """An ``<svg>`` of *samples* (oldest first); "" when there are none. The
    cap's line is left out where the cap is 0 (none)."""
    if not samples:
        return ""
    t0, t1 = samples[0][0], samples[-1][0]
    top = max(max(s[1] or 0 for s in samples), max(s[2] or 0 for s in samples), 1)
    used = _points(samples, 1, t0, t1 - t0, top, width, height)
    if len(samples) == 1:  # one sample: a short flat line, so it shows
        y = used.split(",")[1]
        used = f"0,{y} {width},{y}"
    parts = [f'<polyline class="hami-spark-used" fill="none" stroke="{USED_COLOUR}" '
             f'stroke-width="1.5" points="{used}"/>']
    if any(s[2] for s in samples):
        cap = _points(samples, 2, t0, t1 - t0, top, width, height)
        if len(samples) == 1:
            y = cap.split(",")[1]
            cap = f"0,{y} {width},{y}"
        parts.append(f'<polyline class="hami-spark-cap" fill="none" stroke="{CAP_COLOUR}" '
                     f'stroke-width="1" stroke-dasharray="3,2" points="{cap}"/>')
    last = samples[-1]
    title = (f"{label}: " if label else "") + format_size(last[1] or 0)
    if last[2]:
        title += f" of {format_size(last[2])}"
    minutes = (t1 - t0) / 60
    title += f", last {minutes:.0f} min" if minutes >= 1 else ""
    return (f'<svg class="hami-sparkline" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img"><title>{escape(title)}</title>'
            + "".join(parts) + "</svg>")
