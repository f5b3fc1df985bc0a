"""Policy objectives: ratio kernels, clipping, aggregation, KL, metrics.

`ppo` holds the per-token / GSPO / REINFORCE kernels, PPO-clip, KL and aggregation;
`traces` holds the eligibility-trace kernels (P-trace, S-trace; a reconstruction, see there).
"""

from tokencredit.objectives.ppo import *  # noqa: F401,F403
from tokencredit.objectives.traces import *  # noqa: F401,F403
