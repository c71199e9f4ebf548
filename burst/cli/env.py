"""``burst freeze``, ``burst env install`` and ``burst env check``: a run's environment.

Freeze where the run trains; install on the node it resumes on (a SkyPilot task's
``setup:`` runs ``burst env install RUN``); check anywhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from burst.cli.console import make_console
from burst.cli.options import json_option, store_option
from burst.cli.wheels import describe_wheels, wheel_target, wheels_options
from burst.contract import ENV_RUN_ID, ENV_TORCH_INDEX
from burst.env import check as envcheck
from burst.env import codearchive, freeze, lockfile, wheelhouse
from burst.env import install as envinstall
from burst.env import rebuild as envrebuild
from burst.errors import BurstError, ConfigError
from burst.store import check_key, open_store

_COLORS = {envcheck.ERROR: "red", envcheck.WARNING: "yellow", envcheck.NOTE: "dim"}


def _run_id(run_id: str | None) -> str | None:
    return run_id or os.environ.get(ENV_RUN_ID) or None


@click.command("freeze")
@click.argument("run_id", required=False)
@store_option
@click.option("--code-dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="The project to archive (default: the current directory).")
@click.option("--no-code", is_flag=True, help="Freeze the environment only.")
@click.option("--max-code-bytes", type=click.IntRange(min=1), default=None,
              help=f"Size cap of the code archive (default: ${codearchive.MAX_BYTES_ENV} or "
                   f"{codearchive.DEFAULT_MAX_BYTES >> 20} MiB).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the lockfile to this file.")
@wheels_options
@json_option
def freeze_command(run_id: str | None, store_url: str, code_dir: Path | None, no_code: bool,
                   max_code_bytes: int | None, output: Path | None, wheels: str | None,
                   wheels_machine: str | None, torch_variant: str | None,
                   as_json: bool) -> None:
    """Record the environment and code of RUN_ID in its store.

    Without RUN_ID (and no $BURST_RUN_ID) the lockfile is printed instead.
    """
    # what the user typed is checked before the environment is read (seconds)
    if output and not output.parent.is_dir():
        raise click.BadParameter(f"{output.parent} is not a directory", param_hint="--output")
    run_id = _run_id(run_id)
    store = None
    if run_id is not None:
        check_key(run_id)  # a run id leaving the store, refused before the slow part
        store = open_store(store_url)
    root = code_dir.resolve() if code_dir else freeze.default_code_dir()
    lock = lockfile.build(root)
    if output:
        output.write_bytes(lock.dumps())
    if run_id is None or store is None:
        if not output:
            click.echo(lock.dumps().decode(), nl=False)
        return
    target = wheel_target(store, run_id, lock, wheels, wheels_machine, torch_variant)
    result = freeze.freeze(store, run_id, code_dir=root, code=not no_code,
                           max_code_bytes=max_code_bytes, lock=lock, wheels=target,
                           say=lambda line: click.echo(line, err=True))
    summary = _freeze_summary(run_id, lock, result)
    if as_json:
        summary["wheelhouse"] = (wheelhouse.summary(result.wheelhouse.index)
                                 if result.wheelhouse else None)
        click.echo(json.dumps(summary, indent=1, sort_keys=True))
    else:
        _print_freeze(summary)
        if target is not None:
            click.echo(describe_wheels(result.wheelhouse))


def _freeze_summary(run_id: str, lock: lockfile.Lockfile, result: freeze.FreezeResult
                    ) -> dict[str, Any]:
    torch = lock.package("torch")
    return {"run": run_id, "lockfile_hash": result.lockfile_hash,
            "lockfile_new": result.lockfile_new, "packages": len(lock.packages),
            "torch": torch.version if torch else None, "python": lock.python.get("version"),
            "not_portable": [{"name": p.name, "source": p.source, "in_code": p.in_code}
                             for p in lock.packages if not p.installable],
            "code": codearchive.describe(result.code_ref) if result.code_ref else None,
            "code_new": result.code_new, "code_ref": result.code_ref}


def _print_freeze(s: dict[str, Any]) -> None:
    state = "new" if s["lockfile_new"] else "unchanged"
    click.echo(f"environment  {s['lockfile_hash'][:12]}  {s['packages']} distributions, "
               f"python {s['python']}, torch {s['torch'] or '-'}  ({state})")
    for p in s["not_portable"]:
        where = "travels in the code archive" if p["in_code"] is not None else "NOT portable"
        click.echo(f"  {p['source']} install {p['name']}: {where}")
    code = s["code"]
    if code is None:
        click.echo("code         not captured")
        return
    git = (f"git {code['commit'][:10]} on {code['branch'] or 'detached HEAD'}"
           f"{', uncommitted changes' if code['dirty'] else ''}" if code["commit"] else "no git")
    stored = "uploaded" if s["code_new"] else "already stored"
    click.echo(f"code         {code['archive'][:12]}  {code['files']} files, "
               f"{code['bytes'] / 1024:.1f} KiB, {git}  ({stored})")
    if code["skipped"]:
        click.echo(f"  left out: {', '.join(code['skipped'])}")


@click.group("env")
def env_group() -> None:
    """Rebuild or check a run's frozen environment."""


def _load(run_id: str | None, lockfile_path: Path | None, store_url: str, step: int | None
          ) -> tuple[lockfile.Lockfile, dict | None, Any]:
    if lockfile_path is not None:
        try:
            return lockfile.loads(lockfile_path.read_bytes()), None, None
        except OSError as error:
            raise ConfigError(f"cannot read {lockfile_path}: {error.strerror}") from None
    run_id = _run_id(run_id)
    if run_id is None:
        raise ConfigError("name a run (or $BURST_RUN_ID), or give --lockfile FILE")
    store = open_store(store_url)
    lock, code_ref = freeze.load_frozen(store, run_id, step)
    return lock, code_ref, store


@env_group.command("install")
@click.argument("run_id", required=False)
@store_option
@click.option("--lockfile", "lockfile_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Install from this lockfile instead of a run's.")
@click.option("--step", type=int, default=None, help="Use the environment of this snapshot.")
@click.option("--venv", type=click.Path(file_okay=False, path_type=Path), default=Path(".venv"),
              show_default=True, help="The environment to create (or update).")
@click.option("--system", is_flag=True, help="Install into the interpreter running burst.")
@click.option("--base-python", default=None, help="Interpreter to create the venv from.")
@click.option("--installer", type=click.Choice(["auto", "uv", "pip"]), default="auto",
              show_default=True)
@click.option("--gpu", default=None, help="Install for this card (default: detect).")
@click.option("--compute-capability", default=None, help="Install for this capability (9.0).")
@click.option("--cuda", default=None, help="Install this CUDA build of torch (12.8).")
@click.option("--cpu", is_flag=True, help="Install a CPU build of torch.")
@click.option("--rocm", is_flag=True, help="Install a ROCm build of torch.")
@click.option("--index-url", default=None, help="Package index to use instead of PyPI.")
@click.option("--torch-index", default=None,
              help=f"PyTorch wheel index template with {{variant}} (default: "
                   f"${ENV_TORCH_INDEX} or the one recorded, or download.pytorch.org).")
@click.option("--find-links", multiple=True, help="A wheel directory (repeatable).")
@click.option("--no-index", is_flag=True, help="Use only --find-links (offline).")
@click.option("--wheelhouse", "wheelhouse_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Install from this wheelhouse first (default: download the "
                                 "run's from the store into <venv>/../wheelhouse, if it has one).")
@click.option("--no-wheelhouse", is_flag=True, help="Do not use the run's wheelhouse.")
@click.option("--code-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Where to restore the code archive.")
@click.option("--no-code", is_flag=True, help="Do not restore the code archive.")
@click.option("--dry-run", is_flag=True, help="Print the plan; install nothing.")
@json_option
def install(run_id: str | None, store_url: str, lockfile_path: Path | None, step: int | None,
            venv: Path, system: bool, base_python: str | None, installer: str, gpu: str | None,
            compute_capability: str | None, cuda: str | None, cpu: bool, rocm: bool,
            index_url: str | None, torch_index: str | None, find_links: tuple[str, ...],
            no_index: bool, wheelhouse_dir: Path | None, no_wheelhouse: bool, code_dir: Path,
            no_code: bool, dry_run: bool, as_json: bool) -> None:
    """Create RUN_ID's environment on this node and restore its code.

    torch is installed in the build this node's card needs (a CUDA build on a GPU node,
    never a CPU one by accident).
    """
    if sum([cpu, rocm, bool(cuda)]) > 1:
        raise ConfigError("give at most one of --cpu, --rocm, --cuda")
    if torch_index and "{variant}" not in torch_index:
        raise ConfigError("--torch-index must contain {variant}, e.g. "
                          "https://download.pytorch.org/whl/{variant}")
    lock, code_ref, store = _load(run_id, lockfile_path, store_url, step)
    target = envinstall.detect_target(gpu=gpu, capability=compute_capability, cuda=cuda,
                                      cpu=cpu, rocm=rocm)
    options = envinstall.Options(None if system else venv, installer, base_python, index_url,
                                 list(find_links), no_index, torch_index,
                                 None if no_wheelhouse else wheelhouse_dir)
    restore_code = bool(code_ref and store is not None and not no_code)
    if dry_run:
        _print_plan(envinstall.make_plan(lock, target, options),
                    code_ref if restore_code else None, code_dir, as_json)
        return
    echo = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    # the run's wheelhouse goes beside the venv, unless one is named or refused
    fetch_to = (None if wheelhouse_dir is not None or no_wheelhouse
                else venv.expanduser().absolute().parent / "wheelhouse")
    code = envrebuild.Code(code_dir, code_ref) if restore_code else None
    rebuilt = envrebuild.rebuild(lock, target, options, store=store,
                                 run_id=_run_id(run_id) or "", wheelhouse_to=fetch_to,
                                 code=code, say=echo)
    _report_install(rebuilt.plan, rebuilt.differences, rebuilt.restored,
                    rebuilt.editable_failed, as_json, echo)


def _print_plan(plan: envinstall.Plan, code_ref: dict | None, code_dir: Path,
                as_json: bool) -> None:
    data = plan.to_json()
    data["requirements_file"] = "<temporary>"
    data["commands"] = [c for c in (plan.create, plan.install_command("requirements.txt")) if c]
    data["code"] = ({"archive": code_ref.get("archive"), "into": str(code_dir.resolve())}
                    if code_ref else None)
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    for note in plan.notes:
        click.echo(f"# {note}")
    for skipped in plan.skipped:
        click.echo(f"# skip {skipped['name']}: {skipped['reason']}")
    if data["code"]:
        click.echo(f"# restore code {data['code']['archive'][:12]} into {data['code']['into']}")
    for command in data["commands"]:
        click.echo("$ " + " ".join(command))
    click.echo("# requirements.txt:")
    for line in plan.requirements:
        click.echo(line)


def _report_install(plan: envinstall.Plan, differences: list[envcheck.Difference],
                    restored: list[str], failed: list[str], as_json: bool, echo: Any) -> None:
    counts = _counts(differences)
    if as_json:
        click.echo(json.dumps({"python": plan.python, "torch": plan.torch,
                               "installed": len(plan.requirements), "skipped": plan.skipped,
                               "code_files": len(restored), "editable_failed": failed,
                               "differences": [d.to_json() for d in differences], **counts},
                              indent=1))
    else:
        for error in failed:
            echo(f"warning: {error}")
        echo(f"environment ready: {plan.python} ({counts['errors']} errors, "
             f"{counts['warnings']} warnings, {counts['notes']} notes against the lockfile)")
        for d in differences:
            if d.severity != envcheck.NOTE:
                echo(f"  {d.severity}: {d.what} {d.recorded} -> {d.live} ({d.note})")
    if counts["errors"]:
        raise BurstError(f"the new environment differs from the lockfile in a way that breaks "
                         f"the run's snapshots: {_first_error(differences)}")


@env_group.command("check")
@click.argument("run_id", required=False)
@store_option
@click.option("--lockfile", "lockfile_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Check against this lockfile instead of a run's.")
@click.option("--step", type=int, default=None, help="Use the environment of this snapshot.")
@click.option("--python", "python", default=None,
              help="Check this interpreter's environment (default: the one running burst).")
@click.option("--strict", is_flag=True, help="Fail on warnings too.")
@json_option
def check(run_id: str | None, store_url: str, lockfile_path: Path | None, step: int | None,
          python: str | None, strict: bool, as_json: bool) -> None:
    """Compare a live environment with RUN_ID's lockfile and print the differences.

    Exit status 1 when a difference breaks the run's snapshots (or, with --strict, on
    any warning).
    """
    lock, _, _ = _load(run_id, lockfile_path, store_url, step)
    live = envcheck.live_in(python) if python else envcheck.live_here()
    differences = envcheck.compare(lock, live)
    counts = _counts(differences)
    if as_json:
        click.echo(json.dumps({"differences": [d.to_json() for d in differences], **counts},
                              indent=1))
    elif not differences:
        click.echo("clean: the environment matches the lockfile")
    else:
        _print_table(differences, counts)
    if counts["errors"]:
        raise BurstError(f"{counts['errors']} difference(s) break the run's snapshots: "
                         f"{_first_error(differences)}")
    if strict and counts["warnings"]:
        raise BurstError(f"{counts['warnings']} warning(s) and --strict")


def _print_table(differences: list[envcheck.Difference], counts: dict[str, int]) -> None:
    table = Table(title="environment vs lockfile")
    for column in ("severity", "what", "lockfile", "live", "note"):
        table.add_column(column)
    for d in differences:
        color = _COLORS[d.severity]
        table.add_row(f"[{color}]{d.severity}[/{color}]", d.what, d.recorded or "-",
                      d.live or "-", d.note)
    console = make_console()
    console.print(table)
    console.print(f"{counts['errors']} errors, {counts['warnings']} warnings, "
                  f"{counts['notes']} notes", highlight=False)


def _counts(differences: list[envcheck.Difference]) -> dict[str, int]:
    return {"errors": sum(d.severity == envcheck.ERROR for d in differences),
            "warnings": sum(d.severity == envcheck.WARNING for d in differences),
            "notes": sum(d.severity == envcheck.NOTE for d in differences)}


def _first_error(differences: list[envcheck.Difference]) -> str:
    d = next(d for d in differences if d.severity == envcheck.ERROR)
    return f"{d.what} {d.recorded or '-'} -> {d.live or '-'} ({d.note})"


COMMANDS = (freeze_command, env_group)
