"""`tokencredit explain`: arguments and output of `tokencredit.report.explain` (split by concern in progress)."""

from tokencredit.report.explain import add_arguments, run

__all__ = ["add_arguments", "run"]
