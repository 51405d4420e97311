"""`export`: a checkpoint's model weights as a plain state_dict file, or (`--policy`) its
deployable forward as a self-contained ONNX / torch.export artifact (R-DEPLOY-1)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli.common import DEBUG_HELP, reported_errors, run_snapshot
from embodichain.cli.launching import NoProgressOpt
from embodichain.core.errors import UsageError


def export(
    checkpoint: Annotated[Path, typer.Argument(
        help="Checkpoint file (.pt), or a run directory for the snapshot resume would use.")],
    out: Annotated[Path | None, typer.Argument(
        help="File to write the state_dict to, e.g. model.pt (not with --policy).")] = None,
    policy: Annotated[Path | None, typer.Option(
        "--policy", help="Write the deployable policy artifact here instead (policy.onnx or "
        "policy.pt2): forward with normalisation baked in, interface and provenance inside.",
        metavar="OUT")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", help="Artifact format with --policy: onnx or pt2 (default: by OUT's "
        "suffix, else onnx).")] = None,
    ema: Annotated[bool, typer.Option(
        "--ema", help="Export the EMA weights (trainer.ema) instead of the model's own.")]
    = False,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    no_progress: NoProgressOpt = False,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Write the model's state_dict, or with --policy its deployable artifact; both verified
    against the checkpoint's digest.

    Load a state_dict with `model.load_state_dict(torch.load(OUT, weights_only=True))`; run
    an artifact with `embodichain.core.deploy.runner.PolicyRunner(OUT)` (docs/deploy.md).
    """
    with reported_errors(debug):
        if (out is None) == (policy is None):
            raise UsageError("give OUT (the model's state_dict) or --policy OUT (the "
                             "deployable artifact), one of them")
        if fmt is not None and policy is None:
            raise UsageError("--format chooses the artifact of --policy; a state_dict export "
                             "takes no format")
        data = None
        if checkpoint.is_dir():
            checkpoint, data = run_snapshot(checkpoint)
        if policy is not None:
            _export_policy(checkpoint, policy, fmt, ema, force, data, not no_progress)
            return
        from embodichain.core.checkpoint.export import export_model

        assert out is not None
        done = export_model(checkpoint, out, ema=ema, force=force, data=data)
        what = "EMA weights" if done.ema else "model state_dict"
        typer.echo(f"wrote {done.path}: {what} of update {done.step} from {checkpoint} "
                   f"({done.tensors} tensors, {done.numbers:,} numbers). Load it with "
                   f"model.load_state_dict(torch.load({str(done.path)!r}, weights_only=True))")


def _export_policy(checkpoint: Path, out: Path, fmt: str | None, ema: bool, force: bool,
                   data: dict | None, progress: bool) -> None:
    from embodichain.cli.common import error_console
    from embodichain.core.deploy.artifact import EXPORT_STEPS, export_policy, policy_format
    from embodichain.core.observe.work_progress import WorkProgress

    policy_format(out, fmt)  # a wrong name is refused before the checkpoint is read
    # Tracing, converting and checking a large model take minutes: each step is named.
    with WorkProgress("export", EXPORT_STEPS, "steps", enabled=progress, estimate=False,
                      console=error_console()) as steps:
        done = export_policy(checkpoint, out, fmt=fmt, ema=ema, force=force, data=data,
                             step=steps.begin)
    interface = done.interface
    inputs = ", ".join(f"{k} {v['shape']}" for k, v in interface["observations"].items())
    action = interface["action"]
    execution = interface.get("execution")
    typer.echo(f"wrote {done.path}: {interface['kind']} ({done.format}) of update {done.step} "
               f"from {checkpoint}{' (EMA weights)' if ema else ''}")
    typer.echo(f"  observations: {inputs}")
    if interface.get("noise"):  # drawn by the runner, from each episode's seed
        noise = interface["noise"]
        typer.echo(f"  {noise['key']}: {noise['shape']} {noise['kind']}, drawn by the runner "
                   "per episode (seed_episode)")
    typer.echo(f"  {action['key']}: {action['shape']}"
               + (f", chunk execution {execution}" if execution else "")
               + (f", {interface['fps']} fps" if "fps" in interface else ""))
    typer.echo(f"  checked against the model: largest difference {done.max_difference:.2e}")
    typer.echo(f"  run it: PolicyRunner({str(done.path)!r}) from "
               "embodichain.core.deploy.runner")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
