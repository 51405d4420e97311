"""The examples that end each command's `--help` (kept together so that they stay consistent)."""

from __future__ import annotations

EXAMPLES: dict[str, list[str]] = {
    "train-sl": [
        "embodichain train-sl --config examples/learning/sl_ddp/cpu.yaml",
        "OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m embodichain train-sl "
        "--config examples/learning/sl_ddp/cpu.yaml",
        "embodichain train-sl -c cpu.yaml --resume outputs/sl_ddp_cpu/step_100.pt "
        "--set trainer.output_dir=outputs/resumed",
    ],
    "resume": [
        "embodichain resume outputs/sl_ddp_cpu",
        "embodichain resume outputs/sl_ddp_cpu --set trainer.max_updates=400",
    ],
    "validate-config": [
        "embodichain validate-config examples/learning/sl_ddp/cpu.yaml",
        "embodichain validate-config cpu.yaml --set optimizer.lr=0.01 --set trainer.batch_size=64",
    ],
    "check-data": [
        "embodichain check-data cartpole_bc.yaml  # exit 0: every example loads, 1: some do not",
        "embodichain check-data cartpole_bc.yaml --workers 8 --set data.root=/data/cartpole",
    ],
    "inspect-checkpoint": [
        "embodichain inspect-checkpoint outputs/sl_ddp_cpu/step_100.pt",
        "embodichain inspect-checkpoint outputs/sl_ddp_cpu --json | jq .step",
        "embodichain inspect-checkpoint outputs/sl_ddp_cpu/last.pt --config cpu.yaml  "
        "# exit 0: may resume, 1: may not",
    ],
    "export": [
        "embodichain export outputs/sl_ddp_cpu/last.pt model.pt",
        "embodichain export outputs/sl_ddp_cpu model_ema.pt --ema  # a run with trainer.ema",
    ],
    "eval": [
        "embodichain eval outputs/cartpole_bc  # its newest snapshot, the recipe's episodes",
        "embodichain eval outputs/cartpole_bc/step_1500.pt --episodes 100 --seed 7 --videos 4 "
        "--out eval_1500",
        "embodichain eval outputs/cartpole_bc --nproc-per-node 4  # episodes over 4 workers",
    ],
    "list-factories": [
        "embodichain list-factories",
        "embodichain list-factories | grep sl_ddp",
    ],
    "init": [
        "embodichain init sl_ddp my_recipe.yaml",
        "embodichain init nerd nerd.yaml",
    ],
    "report": [
        "embodichain report outputs/sl_ddp_cpu",
        "embodichain report outputs/run_a outputs/run_b --format html",
    ],
    "reproduce": [
        "embodichain reproduce outputs/sl_ddp_cpu  # exit 0: bitwise identical, 1: differs",
        "embodichain reproduce outputs/aloha_transfer_cube_camera --until 500 --output check_500",
    ],
    "runs": [
        "embodichain runs outputs",
        "embodichain runs outputs --json",
    ],
}
EXAMPLES["train"] = EXAMPLES["train-sl"]


def epilog(command: str) -> str | None:
    """The examples of `command` as a help epilog (`\\b`: printed as written, not re-wrapped)."""
    lines = EXAMPLES.get(command)
    if not lines:
        return None
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
