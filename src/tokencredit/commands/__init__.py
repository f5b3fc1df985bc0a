"""One thin module per `tokencredit` command: parse the arguments, call the library, print.

Each module exposes `add_arguments(parser)` and `run(args) -> int`; `tokencredit.cli` imports a
command's module only when that command runs, so `tokencredit recipes` does not pay for
importing transformers.
"""

COMMANDS: dict[str, str] = {
    "train": "train a model with a recipe (default: the embedded toy math task)",
    "recipes": "list the recipes (advantage, credit method, objective, paper)",
    "eval": "evaluate a model on the math benchmarks, the toy tasks, or a run's own evaluation data",
    "explain": "per-token credit heatmaps of several methods as one HTML file",
    "compare": "method shoot-out: recipes x seeds on equal terms",
    "probe": "credit-quality probe: does a method blame the first wrong token?",
    "build-toy": "rebuild a shipped toy warm start (toy, toy-hard, toy-free) deterministically",
}
