"""`tokencredit probe`: arguments and output of `tokencredit.report.probe` (split by concern in progress)."""

from tokencredit.report.probe import add_arguments, run

__all__ = ["add_arguments", "run"]
