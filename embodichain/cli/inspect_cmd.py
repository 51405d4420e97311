"""`inspect-checkpoint`: what a checkpoint holds, safely loaded and verified (R-INSP-1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from embodichain.cli.common import DEBUG_HELP, SET_HELP, reported_errors, run_snapshot


def inspect_checkpoint(
    path: Annotated[Path, typer.Argument(
        help="Checkpoint file (.pt), or a run directory for the snapshot resume would use.")],
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the report as one plain JSON document on stdout.")] = False,
    tensors: Annotated[bool, typer.Option(
        "--tensors", help="List every model tensor with its shape and dtype.")] = False,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Also say whether this recipe may resume from the checkpoint "
        "(exit 0: it may, 1: it may not, 2: bad input).")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help=SET_HELP + " Applies to --config.", metavar="KEY=VALUE")] = None,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Show a checkpoint's identity, model, optimizer, per-rank state and last metrics.

    Loads without running code from the file, verifies its digest; needs no recipe code.
    A sharded checkpoint with a shard missing or damaged is reported, and exits 1.
    """
    with reported_errors(debug):
        from embodichain.cli.checkpoint_summary import resume_check, summarize
        from embodichain.core.checkpoint.file import read_checkpoint
        from embodichain.core.errors import UsageError

        if overrides and config is None:
            raise UsageError("--set applies to the recipe given with --config; add --config")
        if path.is_dir():
            path, data = run_snapshot(path)
        else:
            data = read_checkpoint(path)
        report = summarize(data, path, tensors=tensors)
        if config is not None:
            report["resume"] = resume_check(data, path, config, overrides or [])
        if as_json:
            # Plain print: no colour, no wrapping, exactly one document for `jq` and friends.
            typer.echo(json.dumps(report, indent=2, allow_nan=False))
        else:
            render(report)
        if config is not None and report["resume"]["compatible"] is False:
            raise typer.Exit(1)  # design §9: 0 may resume, 1 may not, 2 bad input
        if any(not shard["verified"] for shard in report.get("shards") or ()):
            # Reported in full above, but like any checkpoint that does not verify, it
            # cannot be resumed or exported: not a success.
            raise typer.Exit(1)


# ----------------------------------------------------------------------------------------
# Rich tables


def render(report: dict[str, Any]) -> None:
    """Print the report as rich tables."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        # Piped or redirected: no cell wraps, so digests and paths stay whole and copyable.
        console = Console(width=10_000)
    for table in (_identity_table(report), _model_table(report["model"]),
                  _tensor_table(report["model"]), _optimizer_table(report["optimizer"]),
                  _ema_table(report.get("ema")),
                  _ranks_table(report["ranks"], report["world_size"]),
                  _shards_table(report.get("shards")),
                  _metrics_table(report["metrics"])):
        if table is not None:
            console.print(table)
            console.print()
    if "resume" in report:
        _print_resume(console, report["resume"])


def _kv_table(title: str) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False, box=None,
                  padding=(0, 2, 0, 0))
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    return table


def _text(value: Any) -> str:
    from rich.markup import escape

    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | dict):
        return escape(json.dumps(value))
    return escape(str(value))


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n:,} B" if unit == "B" else f"{size:.1f} {unit} ({n:,} B)"
        size /= 1024
    return f"{n:,} B"  # pragma: no cover


def _identity_table(r: dict[str, Any]) -> Any:
    t = _kv_table("Checkpoint")
    t.add_row("path", _text(r["path"]))  # a row, not the title: titles wrap to the table
    t.add_row("file", _bytes(r["file_bytes"]))
    t.add_row("format", f"{_text(r['format'])} version {_text(r['format_version'])}")
    t.add_row("digest", f"[green]verified[/], sha256 {_text(r['payload_sha256'])}")
    t.add_row("run id", _text(r["run_id"]) if r["run_id"] else
              "- (no run identity: resumable only into a fresh directory)")
    t.add_row("created", _text(r["created_at"]))
    t.add_row("step", _text(r["step"]))
    t.add_row("world size", _text(r["world_size"]))
    t.add_row("strategy", _text(r.get("strategy", "ddp")))
    t.add_row("factory", _text(r["factory"]))
    match = "[green]matches the stored recipe[/]" if r["config_matches_hash"] \
        else "[red]does not match the stored recipe[/]"
    t.add_row("config sha256", f"{match}, {_text(r['config_sha256'])}")
    t.add_row("source identity", _text(r["source_identity"]))
    resumed = r["resumed_from"]
    if isinstance(resumed, dict):
        resumed = (f"run {resumed.get('run_id')} at update {resumed.get('step')} "
                   f"({resumed.get('checkpoint')})")
    t.add_row("resumed from", _text(resumed))
    t.add_row("versions", ", ".join(f"{_text(k)} {_text(v)}" for k, v in r["versions"].items())
              or "-")
    if r["callbacks"]:
        t.add_row("callback states", ", ".join(r["callbacks"]))
    return t


def _model_table(m: dict[str, Any]) -> Any:
    t = _kv_table("Model")
    t.add_row("parameters", f"{m['parameters']:,} in {m['parameter_tensors']} tensors")
    t.add_row("buffers", f"{m['buffers']:,} in {m['buffer_tensors']} tensors")
    t.add_row("bytes", _bytes(m["bytes"]))
    t.add_row("dtypes", ", ".join(f"{d} ({n:,} values)" for d, n in m["dtypes"].items()) or "-")
    if "tensors" not in m:
        t.add_row("tensors", "use --tensors to list shapes")
    return t


def _tensor_table(m: dict[str, Any]) -> Any:
    if "tensors" not in m:
        return None
    from rich.table import Table

    t = Table(title="Model tensors", title_justify="left")
    for name, justify in (("name", "left"), ("kind", "left"), ("shape", "left"),
                          ("dtype", "left"), ("values", "right"), ("bytes", "right")):
        t.add_column(name, justify=justify, overflow="fold")
    for e in m["tensors"]:
        shape = "[" + ", ".join(map(str, e["shape"])) + "]"
        t.add_row(_text(e["name"]), e["kind"], shape, e["dtype"], f"{e['numel']:,}",
                  f"{e['bytes']:,}")
    return t


def _ema_table(ema: dict[str, Any] | None) -> Any:
    if ema is None:
        return None
    t = _kv_table("EMA weights (learner.ema)")
    t.add_row("decay", _text(ema["decay"]))
    t.add_row("validated", _text(ema["validate"]))
    t.add_row("tensors", f"{ema['tensors']}, {_bytes(ema['bytes'])}")
    return t


def _optimizer_table(o: dict[str, Any]) -> Any:
    t = _kv_table("Optimizer")
    kind = o["type"]
    if o["recipe_name"]:
        kind += f" (recipe: {o['recipe_name']})"
    t.add_row("type", _text(kind))
    t.add_row("step", _text(o["step"]))
    t.add_row("parameter tensors", f"{o['parameter_tensors']} in {o['param_groups']} group(s)")
    for i, group in enumerate(o["hyper_parameters"]):
        prefix = f"group {i}: " if len(o["hyper_parameters"]) > 1 else ""
        for key, value in group.items():
            if key == "parameter_tensors":  # the line above says it for a single group
                if prefix:
                    t.add_row(f"{prefix}parameter tensors", _text(value))
                continue
            t.add_row(f"{prefix}{key}", _text(value))
    t.add_row("state", f"{o['state_tensors']} tensors, {_bytes(o['state_bytes'])}")
    if o["scheduler"]:
        s = o["scheduler"]
        t.add_row("scheduler", f"last epoch {_text(s['last_epoch'])}, "
                               f"last lr {_text(s['last_lr'])}")
    scaler = o["grad_scaler"]
    t.add_row("grad scaler", f"enabled, scale {_text(scaler.get('scale'))}"
              if scaler.get("enabled") else "disabled")
    return t


def _ranks_table(ranks: dict[str, Any], world_size: Any) -> Any:
    from rich.table import Table

    if ranks["complete"]:
        caption = f"all {world_size} ranks present"
    else:
        caption = (f"[red]incomplete:[/] {ranks['present']} rank entries for world size "
                   f"{world_size}; missing {ranks['missing'] or 'none'}, "
                   f"extra {ranks['extra'] or 'none'} (this checkpoint cannot be resumed)")
    t = Table(title="Per-rank state", title_justify="left", caption=caption,
              caption_justify="left")
    for name in ("rank", "torch RNG", "CUDA RNG", "Python RNG", "NumPy RNG", "sampler",
                 "buffers"):
        t.add_column(name, justify="right" if name in ("rank", "buffers") else "left")

    def mark(flag: bool) -> str:
        return "yes" if flag else "-"

    for rank, s in ranks["per_rank"].items():
        sampler = s["sampler"]
        drawn = f"{sampler.get('batches_drawn', '?')} batches" if sampler else "-"
        t.add_row(rank, mark(s["torch_rng"]), mark(s["cuda_rng"]), mark(s["python_rng"]),
                  mark(s["numpy_rng"]), drawn, str(s["buffers"]))
    return t


def _shards_table(shards: list[dict[str, Any]] | None) -> Any:
    """A sharded checkpoint's shard files (trainer.strategy: fsdp), each verified."""
    if shards is None:
        return None
    from rich.table import Table

    bad = [s for s in shards if not s["verified"]]
    caption = ("all shards verified against the manifest" if not bad else
               f"[red]{len(bad)} shard(s) missing or damaged:[/] this checkpoint cannot be "
               "resumed or exported")
    t = Table(title="Shards", title_justify="left", caption=caption, caption_justify="left")
    for name in ("rank", "file", "size", "host", "sha256", "verified"):
        t.add_column(name, justify="right" if name in ("rank", "size") else "left")
    for s in shards:
        t.add_row(str(s["rank"]), _text(s["file"]), _bytes(int(s["bytes"] or 0)),
                  _text(s["host"]), _text(str(s["sha256"])[:16]) + "...",
                  "[green]yes[/]" if s["verified"] else f"[red]no:[/] {_text(s['problem'])}")
    return t


def _metrics_table(metrics: dict[str, Any]) -> Any:
    t = _kv_table("Last metrics")
    for key, value in sorted(metrics.items()):
        t.add_row(_text(key), _text(value))
    if not metrics:
        t.add_row("-", "none recorded")
    return t


def _print_resume(console: Any, check: dict[str, Any]) -> None:
    from rich.markup import escape

    verdict = {True: "[green]yes[/]", False: "[red]no[/]", None: "[yellow]cannot tell[/]"}
    lines = [f"[bold]May {escape(check['recipe'])} resume from it?[/] "
             f"{verdict[check['compatible']]} (compared the {check['compared']})"]
    if check["note"]:
        lines.append(f"  note: {escape(check['note'])}")
    lines += [f"  - {escape(problem)}" for problem in check["problems"]]
    if check["differences"]:
        lines.append("  differences (only trainer.output_dir, the log/validate/save intervals "
                     "and a higher max_updates may change):")
        lines += [f"  - {escape(diff)}" for diff in check["differences"]]
    if check.get("added"):
        lines.append(f"  {escape(check['added'])}")
    if check["compatible"] is not False:
        lines.append("  provided that:")
        lines += [f"  - {escape(condition)}" for condition in check["conditions"]]
    for line in lines:
        console.print(line, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("inspect-checkpoint")(inspect_checkpoint)
