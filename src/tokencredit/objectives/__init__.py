"""Policy objectives: ratio kernels, losses, KL, aggregation, and the effective credit they give.

`kernels` (per-token, GSPO) and `traces` (P-trace, S-trace, a reconstruction; GRPO(lambda)) map
log-ratios to log importance weights; `losses` holds the loss registry with PPO-clip and
REINFORCE, `losses_verl` verl's other losses (CISPO, SAPO, Clip-Cov, KL-Cov, GMPO, DPPO) and
`losses_trl` TRL's VESPO; `args` holds `ObjectiveArgs`, the typed settings of one objective;
`policy` composes the pieces into `policy_loss`; `effective` measures the per-token gradient
weight an objective gives each token at the on-policy point.
"""

from tokencredit.objectives.args import *  # noqa: F401,F403
from tokencredit.objectives.effective import *  # noqa: F401,F403
from tokencredit.objectives.kernels import *  # noqa: F401,F403
from tokencredit.objectives.losses import *  # noqa: F401,F403
from tokencredit.objectives.losses_trl import *  # noqa: F401,F403
from tokencredit.objectives.losses_verl import *  # noqa: F401,F403
from tokencredit.objectives.policy import *  # noqa: F401,F403
from tokencredit.objectives.traces import *  # noqa: F401,F403

# The lines above are the package's exports. Registration needs no list: every public module of the
# package (a new losses_*.py included) is imported here, sorted by name, and registers its kernels and
# losses on import (tokencredit.registry.import_submodules).
from tokencredit.registry import import_submodules as _import_submodules  # noqa: E402

_import_submodules(__name__, __path__)  # noqa: F405 (the package path, not a star import)
