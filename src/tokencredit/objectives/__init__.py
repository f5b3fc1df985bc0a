"""Policy objectives: ratio kernels, losses, KL, aggregation, and the effective credit they give.

`kernels` (per-token, GSPO) and `traces` (P-trace, S-trace, a reconstruction; GRPO(lambda)) map
log-ratios to log importance weights; `losses` holds the loss registry with PPO-clip and
REINFORCE, `losses_verl` verl's other losses (CISPO, SAPO, Clip-Cov, KL-Cov, GMPO, DPPO) and
`losses_trl` TRL's VESPO; `policy` composes them into `policy_loss`; `effective` measures the
per-token gradient weight an objective gives each token at the on-policy point.
"""

from tokencredit.objectives.effective import *  # noqa: F401,F403
from tokencredit.objectives.kernels import *  # noqa: F401,F403
from tokencredit.objectives.losses import *  # noqa: F401,F403
from tokencredit.objectives.losses_trl import *  # noqa: F401,F403
from tokencredit.objectives.losses_verl import *  # noqa: F401,F403
from tokencredit.objectives.policy import *  # noqa: F401,F403
from tokencredit.objectives.traces import *  # noqa: F401,F403
