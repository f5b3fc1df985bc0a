"""What the verl and TRL plugins assume of the engines they plug into, besides the core's credit pipeline.

A plugin is configured with one name, read by `tokencredit.recipes.resolve` (recipes first, then credit
methods; ``recipe:`` / ``credit:`` prefixes choose), and computes Â with `tokencredit.recipes.token_credit`,
exactly as the trainer and the reports do. What it needs of the engine itself is here: which ratio kernels
the engine's own losses already implement (`ENGINE_KERNELS`), and the check of the engine's version that
each plugin runs at import (`check_supported`).
"""

from __future__ import annotations

from packaging.version import Version

__all__ = ["ENGINE_KERNELS", "check_supported"]

# Ratio kernels the engines' own losses already implement (verl: loss_mode vanilla / gspo; TRL:
# importance_sampling_level="token" / "sequence"), so the plugins add only the trace kernels.
ENGINE_KERNELS = ("token", "gspo", "gspo-token")


def check_supported(who: str, package: str, found: str, supported: str, tested: str, why: str) -> str:
    """`found` if A <= found < B for `supported` = ">=A,<B" (packaging's version order), else an
    ImportError saying that `who` supports `package` `supported` (tested with `tested`), and `why`."""
    lo, hi = (Version(part.lstrip("<>=")) for part in supported.split(","))
    if not lo <= Version(found) < hi:
        raise ImportError(
            f"{who} supports {package} {supported} (tested with {tested}); found {package} {found}. {why}"
        )
    return found
