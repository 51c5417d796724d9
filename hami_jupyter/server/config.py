"""How the server extension shows slices: configuration, as jupyter_server config.

``c.SliceDisplay.warning_fraction = 0.8`` and ``c.SliceDisplay.critical_fraction
= 0.95`` in ``jupyter_server_config.py`` (or ``--SliceDisplay.warning_fraction``
on the command line): the fractions of a slice's memory cap from which its
level is "warning" and "critical". The REST answers carry each GPU's level by
them and the fractions themselves, and the JupyterLab status bar and panel
colour by those, so one setting holds for every view the server gives.
"""

from traitlets import Float, Int, TraitError, validate
from traitlets.config import Configurable

from ..slice.status import CRITICAL_FRACTION, WARNING_FRACTION, check_fractions


class SliceDisplay(Configurable):
    """Thresholds of the memory levels in the server's REST answers, and the
    history of the slices the server keeps for the panel's charts."""

    warning_fraction = Float(
        WARNING_FRACTION, config=True,
        help="""Fraction of a slice's memory cap (above 0, at most 1) from which
        its level is "warning": the JupyterLab status bar turns orange.""")
    critical_fraction = Float(
        CRITICAL_FRACTION, config=True,
        help="""Fraction of a slice's memory cap (above 0, at most 1, not below
        warning_fraction) from which its level is "critical": the status bar
        turns red.""")

    history_minutes = Int(
        60, config=True,
        help="""Minutes of each slice's history the server keeps for the JupyterLab
        panel's charts (1 to 60; the panel shows the last historyMinutes of them), so
        that a page opened later draws the minutes before it.""")
    history_interval = Float(
        2.0, config=True,
        help="""Seconds between two readings of the server's slices for that history.""")

    @validate("history_minutes")
    def _valid_minutes(self, proposal):
        if not 1 <= proposal["value"] <= 60:
            raise TraitError(f"SliceDisplay.history_minutes must be 1 to 60, not {proposal['value']}")
        return proposal["value"]

    @validate("history_interval")
    def _valid_interval(self, proposal):
        if not proposal["value"] > 0:
            raise TraitError("SliceDisplay.history_interval must be above 0")
        return proposal["value"]

    @validate("warning_fraction", "critical_fraction")
    def _valid_fraction(self, proposal):
        value = proposal["value"]
        if not 0 < value <= 1:
            raise TraitError(f"SliceDisplay.{proposal['trait'].name} must be above 0 and at "
                             f"most 1, not {value}")
        return value

    @property
    def fractions(self):
        """``(warning, critical)``; ValueError when warning is above critical."""
        check_fractions(self.warning_fraction, self.critical_fraction)
        return self.warning_fraction, self.critical_fraction
