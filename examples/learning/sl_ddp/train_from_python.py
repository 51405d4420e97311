"""Train the sl_ddp recipe from Python, exactly as `embodichain train-sl` does.

    python examples/learning/sl_ddp/train_from_python.py --set trainer.output_dir=outputs/py
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 \\
        examples/learning/sl_ddp/train_from_python.py

Every rank runs this file: each enters `distributed_run` and calls `fit()`. The run
directory, its claim and lock, the resume rules (`resume="auto"` below continues a run the
output directory already holds), Ctrl-C / SIGTERM stops with a snapshot, and the summary
are train-sl's; so is the trained model, bitwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from embodichain.learning.sl import (
    Stopped,
    TrainingError,
    UsageError,
    build_trainer,
    distributed_run,
    load_recipe,
)

RECIPE = Path(__file__).with_name("cpu.yaml")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=RECIPE, help="recipe YAML file")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a recipe value (repeatable)")
    parser.add_argument("--resume", default=None, help="auto, a checkpoint or a run directory")
    args = parser.parse_args()
    try:
        recipe = load_recipe(args.config, args.overrides)  # checked as train-sl checks it
        with distributed_run(recipe.config.device) as device:
            trainer = build_trainer(recipe, device, resume=args.resume)
            final = trainer.fit(show_progress=sys.stdout.isatty())
    except (UsageError, Stopped, TrainingError) as exc:  # bad input 2, stop 130/143, failure 1
        if os.environ.get("RANK", "0") == "0" or isinstance(exc, TrainingError):
            print(f"{'' if isinstance(exc, Stopped) else 'error: '}{exc}", file=sys.stderr)
        return exc.exit_code
    if os.environ.get("RANK", "0") == "0":
        print("final metrics:", {k: round(v, 6) for k, v in sorted(final.items())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
