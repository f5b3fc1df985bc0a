"""The registration: what loading tokencredit's verl plugin does, once per process.

Checks verl's version (`check_version`, before any verl-internal module is imported), registers one
advantage estimator ``tc_<slug>`` per recipe and per credit method that is not a recipe, and one policy loss
``tc_<kernel>`` per ratio kernel and loss verl lacks (`register_all`), then installs the hooks on verl's
trainers (`tokencredit.integrations.verl.hooks.install_hooks`). Imported by the entry point,
`tokencredit.integrations.verl.plugin`, after verl's compat patch (`tokencredit.integrations.verl.compat`);
the package's docstring says what is registered and how the hooks supply what verl does not pass.
"""

from __future__ import annotations

import logging

from tokencredit import objectives
from tokencredit.errors import ConfigError
from tokencredit.integrations.engines import ENGINE_KERNELS, check_supported
from tokencredit.integrations.verl.compat import VERL_VERSIONS
from tokencredit.recipes import RECIPES, known_names, resolve

try:
    import verl
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tokencredit.integrations.verl needs verl: pip install 'tokencredit[verl]' and then "
        "pip install --no-deps 'verl>=0.9,<0.10' (see docs/integrations.md)"
    ) from err

SUPPORTED_VERSIONS = VERL_VERSIONS


def check_version(version: str | None = None) -> str:
    """Raise ImportError unless verl's version is in SUPPORTED_VERSIONS (the range we test)."""
    return check_supported(
        "tokencredit.integrations.verl",
        "verl",
        verl.__version__ if version is None else version,
        SUPPORTED_VERSIONS,
        "0.9.1",
        "Its hooks wrap verl-internal functions whose signatures change between releases, so other "
        "versions are refused rather than silently mis-wired.",
    )


# The version is checked before any verl-internal module is imported by the parts below.
check_version()

from tokencredit.integrations.verl.batch import SIGNAL_KEYS, batch_from_dataproto  # noqa: E402
from tokencredit.integrations.verl.estimators import (  # noqa: E402
    ESTIMATORS,
    estimator_spec,
    needs_critic_values,
    needs_sampled_values,
    register_estimator,
    slug,
)
from tokencredit.integrations.verl.hooks import ACTOR_HOOK_TARGETS, HOOK_TARGETS, install_hooks  # noqa: E402
from tokencredit.integrations.verl.losses import LOSSES, VERL_LOSSES, register_loss  # noqa: E402

log = logging.getLogger(__name__)

__all__ = [
    "ACTOR_HOOK_TARGETS",
    "ESTIMATORS",
    "HOOK_TARGETS",
    "LOSSES",
    "SIGNAL_KEYS",
    "SUPPORTED_VERSIONS",
    "batch_from_dataproto",
    "check_version",
    "estimator_spec",
    "install_hooks",
    "register_all",
    "register_estimator",
    "register_loss",
]


def register_all() -> None:
    """One estimator per recipe and per credit method that is not a recipe; one loss per kernel verl lacks."""
    for name in known_names():
        if needs_sampled_values(resolve(name)):
            continue  # oracle / vineppo: verl does not sample the Monte-Carlo values they read
        if needs_critic_values(resolve(name)):
            continue  # ppo / bpco: verl's own critic and adv_estimator=gae do this
        try:
            register_estimator(f"tc_{slug(name)}", name)
        except ConfigError as err:  # a recipe whose credit method is not registered in this build
            log.warning("tokencredit: estimator tc_%s not registered: %s", slug(name), err)
    for kernel in objectives.KERNELS:
        if kernel in ENGINE_KERNELS:
            continue
        params = dict(RECIPES[kernel].kernel_params) if kernel in RECIPES else {}
        register_loss(f"tc_{slug(kernel)}", kernel, **params)
    for loss in objectives.LOSSES:
        if loss not in VERL_LOSSES:
            register_loss(f"tc_{slug(loss)}", loss=loss)


register_all()
HOOKED = install_hooks()
