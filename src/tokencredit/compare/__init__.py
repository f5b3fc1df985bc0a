"""The method shoot-out behind `tokencredit compare`: recipes x seeds on equal terms.

Each (recipe, seed) is one ordinary trainer run in ``OUT/runs/<recipe>-s<seed>``. All runs share
every setting except the recipe, the seed and (for recipes that only work with a LoRA adapter,
such as ARCA) the LoRA rank, so they see the same data stream (`PromptSampler` depends only on
`run.seed`), the same rollout budget per step and the same held-out problems. DAPO-style dynamic
sampling draws extra prompts from that stream when a group is uninformative; the table shows the
generation rounds per step so that difference in budget stays visible.

`--arm NAME=RECIPE:KEY=VALUE[,...]` adds a row NAME that trains RECIPE with its own overrides (after the
shared --set; its runs carry `run.label = NAME`, by which runs are grouped). `--tune-lr LR,LR,...` first
chooses a learning rate per row on a validation split (`data.eval_split = "validation"`, tune seeds of
their own, runs in ``OUT/tune/runs``; see `tune`), then trains the main runs on the held-out split with it.

Compare is resumable: a run with a `summary.json` for the planned number of steps is not rerun; an
unfinished run resumes from its last checkpoint. SIGINT / SIGTERM stop every run in progress after its
step, with a checkpoint of it (subprocesses get the signal forwarded), and the same command continues.
`--collect` only aggregates existing run directories, grouping them by recipe (recipe.json) and LoRA
rank (config.toml); damaged parts of a run (a cut-off metrics line, an unknown config key or recipe
field) are skipped and listed, and a run with a file that cannot be read at all is left out.

Outputs in OUT: `compare.md` (the table, the command that made it and the settings),
`compare.json`, `accuracy.png` (held-out accuracy vs step, mean over seeds with a band per
recipe) and `concentration.png` (credit Gini and effective-token ratio vs step, mean over seeds).

Statistics: mean ± sample std (n - 1) over seeds; against the baseline recipe a paired t-test over
the seeds both have, on the final held-out accuracy (two-sided p from the exact Student t
distribution for integer degrees of freedom, Abramowitz & Stegun 26.7.3-4).

Modules, one concern each (execution and statistics never import each other):
    stats      t distribution, paired t-test, mean ± std, steps to a target
    runs       reading run directories (through tokencredit.train.rundir.RunDir) into RunData
    aggregate  groups of runs by recipe, curves over seeds, the result dict
    render     Markdown and rich tables, plots, writing compare.md / compare.json / the plots
    plan       planning the runs (one TrainConfig per row: recipe or --arm, and seed), their state on disk
    execute    training the unfinished ones in-process or as subprocesses; stopping them on a signal
    tune       the --tune-lr sweep: its tune runs, their scores and the choice of a learning rate per row
The command line is `tokencredit.commands.compare`.
"""

from tokencredit.compare.aggregate import METRICS, Group, aggregate, final_accuracy, group_runs
from tokencredit.compare.execute import execute, finished_runs
from tokencredit.compare.plan import (
    DEFAULT_RECIPES,
    DEFAULT_SEEDS,
    Arm,
    PlannedRun,
    PlanOptions,
    parse_arm,
    plan_runs,
    plan_state,
)
from tokencredit.compare.render import (
    few_seeds_warning,
    markdown,
    placebo_table,
    plot_accuracy,
    plot_concentration,
    plot_differences,
    rich_table,
    table_rows,
    write_report,
)
from tokencredit.compare.runs import RunData, collect_runs, damaged_parts, expand_run_dirs, read_run
from tokencredit.compare.stats import (
    PairedTest,
    mean_std,
    paired_t_test,
    steps_to_target,
    t_two_sided_p,
)

__all__ = [
    "DEFAULT_RECIPES",
    "DEFAULT_SEEDS",
    "METRICS",
    "Arm",
    "Group",
    "PairedTest",
    "PlanOptions",
    "PlannedRun",
    "RunData",
    "aggregate",
    "collect_runs",
    "damaged_parts",
    "execute",
    "expand_run_dirs",
    "few_seeds_warning",
    "final_accuracy",
    "finished_runs",
    "group_runs",
    "markdown",
    "mean_std",
    "paired_t_test",
    "placebo_table",
    "parse_arm",
    "plan_runs",
    "plan_state",
    "plot_accuracy",
    "plot_concentration",
    "plot_differences",
    "read_run",
    "rich_table",
    "steps_to_target",
    "t_two_sided_p",
    "table_rows",
    "write_report",
]
