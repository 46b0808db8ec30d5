"""`eslab export`: every metric, population row and sample of a run, unsampled, as one JSON
document, a folder of CSV files, or a self-contained HTML report; with `--checkpoint`, one
of its checkpoints as a tar (what the Run page's download link streams); with `--sweep`, a sweep's
runs, one row each, as CSV, JSON or an HTML report that ranks them."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli.common import open_store, print_error

if TYPE_CHECKING:
    from jobs.store.records import RunRecord, SweepRecord
    from jobs.store.store import Store


def add_commands(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export", help="a run's metrics, population and samples, or a sweep's runs"
    )
    export.add_argument("run", nargs="?", help="run id or uuid (prefix)")
    export.add_argument(
        "--sweep", metavar="ID", help="export this sweep (id or name): one row per run instead"
    )
    export.add_argument(
        "--checkpoint",
        metavar="STEP",
        type=int,
        help="write the run's checkpoint of this step as a tar instead (to --out, default stdout)",
    )
    export.add_argument("--format", choices=("csv", "json", "html"), default="json")
    export.add_argument(
        "--out",
        help="json: file (default stdout); csv: folder (default NAME-export/), of a sweep a "
        "file (default stdout); html: file (default NAME.html)",
    )
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    """Every metric, population row and sample of a run, unsampled: one JSON document, or
    a folder of CSV files (metrics.csv, population.csv, samples.csv) and run.json."""
    if (args.run is None) == (args.sweep is None):
        print_error("give a run to export, or --sweep ID")
        return 2
    if args.sweep is not None:
        return export_sweep(args)
    if args.checkpoint is not None:
        return export_checkpoint(args)
    with open_store() as store:
        if args.format == "html":
            return _export_html(store, args)
        exported = store.export_run(args.run)
    run = _plain(asdict(exported.run))
    tables = {
        "metrics": exported.metrics,
        "population": exported.population,
        "samples": exported.samples,
    }
    counts = ", ".join(f"{len(rows)} {name} rows" for name, rows in tables.items())
    if args.format == "json":
        document = {
            "run": run,
            **tables,
            "checkpoints": [_plain(asdict(c)) for c in exported.checkpoints],
            "events": [_plain(asdict(e)) for e in exported.events],
        }
        text = json.dumps(document, indent=1, default=str)
        if args.out in (None, "-"):
            print(text)
            return 0
        Path(args.out).write_text(text + "\n")
        print(f"wrote {counts} to {args.out}", file=sys.stderr)
        return 0
    folder = Path(args.out or default_name(exported.run, "-export"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps(run, indent=1, default=str) + "\n")
    for name, rows in tables.items():
        _write_csv(folder / f"{name}.csv", rows)
    print(f"wrote {counts} to {folder}/", file=sys.stderr)
    return 0


def _export_html(store: Store, args: argparse.Namespace) -> int:
    """One self-contained .html file (charts as inline SVG, no script, no network)."""
    from app.report import run_report

    run = store.get_run(args.run)
    out = Path(args.out or default_name(run, ".html"))
    out.write_text(run_report(store, run.id), encoding="utf-8")
    print(f"wrote the report of run {run.id} to {out}", file=sys.stderr)
    return 0


def export_checkpoint(args: argparse.Namespace) -> int:
    """The run's checkpoint of step --checkpoint as a tar streamed to --out or stdout, a file
    at a time: a checkpoint of any size costs this process one chunk (app.exports)."""
    from app.exports import NoCheckpoint, checkpoint_folder, write_checkpoint_tar

    with open_store() as store:
        run = store.get_run(args.run)
        try:
            folder = checkpoint_folder(store, run, args.checkpoint)
        except NoCheckpoint as exc:
            print_error(str(exc))
            return 1
    if args.out in (None, "-"):
        if sys.stdout.isatty():
            print_error("a tar is not for a terminal: give --out FILE.tar or redirect stdout")
            return 2
        write_checkpoint_tar(folder, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return 0
    with open(args.out, "wb") as out:
        write_checkpoint_tar(folder, out)
    print(
        f"wrote the checkpoint of step {args.checkpoint} of run {run.id} to {args.out}",
        file=sys.stderr,
    )
    return 0


def export_sweep(args: argparse.Namespace) -> int:
    """A sweep's runs, one row each (jobs.sweeps.driver.sweep_table): a CSV table, a JSON
    document with the sweep (its search and base configuration) and the rows, or an HTML
    report that ranks them; the files the Sweep page downloads (app.exports)."""
    from app.exports import sweep_csv, sweep_json

    with open_store() as store:
        sweep = store.get_sweep(args.sweep)
        if args.format == "html":
            from app.report import sweep_report

            out = Path(args.out or default_name(sweep, ".html", "sweep"))
            out.write_text(sweep_report(store, sweep.id), encoding="utf-8")
            print(f"wrote the report of sweep {sweep.id} to {out}", file=sys.stderr)
            return 0
        text = (sweep_csv if args.format == "csv" else sweep_json)(store, sweep.id)
        count = len(store.sweep_runs(sweep.id))
    if args.out in (None, "-"):
        sys.stdout.write(text)
        return 0
    Path(args.out).write_text(text)
    print(f"wrote {count} runs of sweep {sweep.id} to {args.out}", file=sys.stderr)
    return 0


def default_name(record: RunRecord | SweepRecord, suffix: str, kind: str = "run") -> str:
    """NAME + suffix in the current folder, NAME in safe characters: a run's or sweep's name
    is what its author typed, and `../x` or `/etc/x` must not choose where the export goes."""
    from engine.filenames import safe_file_name

    return safe_file_name(record.name, suffix, f"{kind}-{record.id}")


def _plain(record: dict) -> dict:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in record.items()}


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in row.items()}
            )
