"""`tokencredit compare`: arguments and output of `tokencredit.report.compare` (split by concern in progress)."""

from tokencredit.report.compare import add_arguments, run

__all__ = ["add_arguments", "run"]
