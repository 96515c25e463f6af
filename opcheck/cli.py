"""`opcheck`: generate, validate, list and scaffold op specs; capture them from a run; report a run's coverage.

Thin by design: parse arguments, call opcheck.spec / opcheck.codegen / opcheck.report, print, pick
the exit status (0 ok, 1 invalid specs, stale generated tests or unreadable results, 2 bad usage or
a bad `[tool.opcheck]` table). The defaults of --specs, --out and report's RESULTS come from that
table (opcheck.config), relative to its pyproject.toml, as the pytest plugin reads it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from opcheck import __version__
from opcheck import config as project_config

DEFAULT_SPECS = "op_specs"
DEFAULT_OUT = "generated_tests"


def main(argv: list[str] | None = None) -> int:
    # Specs name the project's own modules (`examples.ops:Cube.apply`) as `python -m` would find
    # them: relative to the working directory, which a console script does not put on sys.path
    # (and relative to the project root, added once the specs say where that is: _use_root).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    parser = _parser()
    args = parser.parse_args(argv)
    from opcheck import _suite

    absent = _suite.missing()
    if absent:
        print(
            f"opcheck {args.command}: needs opcheck's suite, and {_suite.not_installed(absent)} in this Python "
            f"({sys.executable}): {_suite.INSTALL}",
            file=sys.stderr,
        )
        return 1
    try:
        _apply_project_defaults(args, project_config.load(Path.cwd()))
    except project_config.ConfigError as e:
        print(f"opcheck: {e}", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except _Failure as e:
        print(str(e), file=sys.stderr)
        return e.status
    except KeyboardInterrupt:  # the user's Ctrl-C (one raised by a spec's module is a spec problem)
        print("opcheck: interrupted", file=sys.stderr)
        return 130


class _Failure(Exception):
    """An expected failure (bad spec, stale tree): printed without a traceback."""

    status = 1


class _Usage(_Failure):
    """A command line that cannot run (what argparse would refuse, had it known the project's settings)."""

    status = 2


def _apply_project_defaults(args: argparse.Namespace, project: project_config.ProjectConfig) -> None:
    """Fill the options left unset from `[tool.opcheck]`, else from the built-in defaults."""
    args.project = project
    args.specs_given = getattr(args, "specs", None) is not None  # `list` takes spec paths or --specs, not both
    for option, key, default in (("specs", "specs", DEFAULT_SPECS), ("out", "out", DEFAULT_OUT)):
        if hasattr(args, option) and getattr(args, option) is None:
            setattr(args, option, project.path(key) or Path(default))
    args.default_specs = project.path("specs") or Path(DEFAULT_SPECS)
    args.default_out = project.path("out") or Path(DEFAULT_OUT)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opcheck",
        description="Declarative gradient tests for PyTorch operators.",
        epilog="Paths in generated headers and in spec problems are relative to the project root: the "
        "nearest folder at or above the specs that holds pyproject.toml, setup.cfg or .git (else the "
        "working directory), so every folder the command runs from generates the same bytes. The "
        "project root is also where a spec's own modules (`examples.ops:Cube.apply`) are imported from.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def specs_option(p):
        p.add_argument(
            "--specs",
            default=None,
            type=Path,
            help=f"spec file or folder of *.yaml specs (default: [tool.opcheck] specs, else {DEFAULT_SPECS})",
        )

    def imports_option(p, when: str):
        p.add_argument(
            "--import", dest="imports", action="append", default=[], metavar="MODULE", help=f"a module to import {when}"
        )

    p = sub.add_parser("generate", help="compile specs into generated pytest modules")
    specs_option(p)
    p.add_argument(
        "--out", default=None, type=Path, help=f"output folder (default: [tool.opcheck] out, else {DEFAULT_OUT})"
    )
    p.add_argument(
        "--check", action="store_true", help="write nothing; print a diff and exit 1 if the generated modules are stale"
    )
    p.add_argument(
        "--no-cache", action="store_true", help="load and render every spec even if nothing changed since the last run"
    )
    p.add_argument(
        "--cost",
        action="store_true",
        help="also estimate each test's seconds, as `opcheck list --cost` does (it runs the ops: off unless "
        "asked), and warn on stderr of the tests past the time budget ([tool.opcheck] time_budget), with what "
        "would make them cheaper",
    )
    p.set_defaults(run=_generate)

    p = sub.add_parser("validate", help="check specs and report every problem")
    specs_option(p)
    p.set_defaults(run=_validate)

    p = sub.add_parser(
        "list",
        help="ops, samples and test counts; with --cost, each test's estimated calls and seconds",
        description="Every spec's op, samples, checks and test count. With --cost, each generated test's "
        "estimated calls of the op and seconds, from one probe of each sample (opcheck.runtime.cost): per "
        "spec, the costliest tests, the tests over --threshold with what would make them cheaper, and the "
        "total.",
    )
    p.add_argument(
        "spec_paths",
        nargs="*",
        type=Path,
        metavar="SPEC_PATH",
        help="spec files or folders of *.yaml specs to list (default: --specs)",
    )
    specs_option(p)
    p.add_argument("--cost", action="store_true", help="estimate each test's calls and seconds (runs the ops)")
    p.add_argument(
        "--device",
        default=None,
        metavar="DEVICES",
        help="with --cost: device types to estimate, comma-separated (default: [tool.opcheck] device, else "
        "every one the specs name; the tests of those unavailable here are counted, not estimated)",
    )
    p.add_argument(
        "--policy",
        choices=("auto", "full", "fast"),
        default=None,
        help="with --cost: as pytest's --opcheck-policy (default: [tool.opcheck] policy, else each spec's fast_mode)",
    )
    p.add_argument(
        "--budget",
        default=None,
        metavar="N",
        help="with --cost: as pytest's --opcheck-budget (default: [tool.opcheck] budget, else 2**20)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --cost: mark the tests estimated over this many seconds, and say what would make them "
        "cheaper (default 1)",
    )
    p.add_argument(
        "--top", type=int, default=10, metavar="N", help="with --cost: list the N costliest tests (0: every test)"
    )
    p.set_defaults(run=_list)

    p = sub.add_parser("new", help="scaffold a commented spec for an op")
    p.add_argument("name", help="spec name: op_specs/NAME.yaml, generated_tests/test_NAME.py")
    p.add_argument("--op", required=True, help="the op path, e.g. torch.sin or mypkg.ops:MyOp.apply")
    imports_option(
        p,
        "before resolving the op (repeatable): the one registering a torch.ops.* operator; written "
        "to the spec's `imports:`",
    )
    p.add_argument(
        "--shape",
        dest="shapes",
        action="append",
        default=[],
        metavar="SIZES",
        help="a tensor argument's shape, e.g. 2,7,33 (repeatable: one per tensor argument, in order). The "
        "op is probed at these shapes and the spec says what it found: float64 refused or computed in "
        "float32 (dtypes: [], lowprec_dtypes, reference), no vmap rule (check_batched_grad: false), no "
        "double backward or forward AD, writes into its inputs (clone_inputs) or grad_outputs",
    )
    p.add_argument(
        "--sample",
        default=None,
        metavar="NAME",
        help="probe at a sample already written, and copy it: sample NAME of the spec being rewritten "
        "(with --force), else of a spec in the specs folder for the same op (instead of --shape)",
    )
    specs_option(p)
    p.add_argument("--force", action="store_true", help="overwrite an existing spec file")
    p.set_defaults(run=_new)

    p = sub.add_parser(
        "import-opinfo",
        help="write a spec from an entry of torch's OpInfo database",
        description="Write a spec from torch's OpInfo entry NAME (or NAME.variant): its samples, the "
        "float64/complex128 its backward supports on cpu, its gradient flags, and its gradient-test "
        "skips and expected failures.",
    )
    p.add_argument("opinfo", metavar="NAME[.variant]", help="the OpInfo's name: sin, linalg.det, div.trunc_rounding")
    p.add_argument(
        "--out",
        dest="spec_file",
        type=Path,
        help=f"the spec file to write (default: SPEC_NAME.yaml in [tool.opcheck] specs, else in {DEFAULT_SPECS})",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing spec file")
    p.set_defaults(run=_import_opinfo)

    p = sub.add_parser(
        "capture",
        help="run a command with ops recorded, and write their calls as spec samples",
        usage="opcheck capture --op OP [--op OP ...] [options] -- COMMAND ...",
        description="Run COMMAND (python SCRIPT.py, python -m MODULE, python -c CODE, or pytest ARGS) with the "
        "calls of the --op selections recorded, then write them as samples: into the spec in --specs that tests "
        "the op (appended to its samples list, the rest of the file untouched), else into a new spec file. "
        "Calls that differ only in their values are one sample; at most --max-samples per op are kept, chosen "
        "to keep what differs (ranks, dims against powers of two, broadcasts, empty dims, argument values). "
        "Nothing is written outside --specs; the user's code is never changed.",
    )
    p.add_argument(
        "--op",
        dest="ops",
        action="append",
        required=True,
        metavar="OP",
        help="what to record (repeatable): a torch function or method (torch.nn.functional.gelu, "
        "torch.Tensor.matmul), a torch.library operator or namespace (torch.ops.mylib.rms_norm, torch.ops.mylib), "
        "an aten operator wherever it reaches the dispatcher (aten.mm), or a Python callable or "
        "autograd.Function (mypkg.ops:Square.apply)",
    )
    specs_option(p)
    p.add_argument(
        "--max-samples",
        type=int,
        default=None,
        metavar="N",
        help="the most distinct samples kept per op (default 8)",
    )
    p.add_argument(
        "--values",
        nargs="?",
        const="all",
        choices=("all", "structured"),
        default=None,
        help="also save the tensors' values, one .pt per sample in values/SPEC/ beside the specs, read by "
        "`values_file:`; `structured`: only tensors whose values uniform draws do not reproduce (masks, a "
        "dominant entry per row, non-finite entries)",
    )
    p.add_argument(
        "--reduce",
        action="store_true",
        help="also write a reduced twin of each sample with a dim over 256: that dim becomes 128 plus its "
        "remainder mod 128, so tails and alignments stay",
    )
    p.add_argument("--force", action="store_true", help="replace samples (and values files) of the same name")
    p.add_argument("--no-cost", dest="cost", action="store_false", help="do not estimate each new sample's test cost")
    imports_option(
        p,
        "before the command runs (repeatable), and to list in a new spec's `imports:`: the one "
        "registering a torch.ops operator",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    p.set_defaults(run=_capture)

    p = sub.add_parser(
        "report",
        help="coverage matrix (op x check x dtype x device) of a pytest run",
        description="Coverage matrix of a pytest run of generated tests: each op's checks and "
        "dtypes by device, passed / failed / xfailed / skipped with the reasons. With "
        "neither --markdown nor --html, prints the Markdown.",
    )
    p.add_argument(
        "results",
        type=Path,
        nargs="?",
        metavar="RESULTS",
        help="a JUnit XML file (pytest --junitxml=PATH.xml) or opcheck's JSON results "
        "(pytest --opcheck-results PATH.json); default: [tool.opcheck] results",
    )
    p.add_argument("--markdown", type=Path, metavar="PATH", help="write the Markdown report to PATH")
    p.add_argument("--html", type=Path, metavar="PATH", help="write a self-contained HTML page to PATH")
    p.set_defaults(run=_report)
    return parser


ROOT_MARKERS = ("pyproject.toml", "setup.cfg", ".git")


def project_root(specs: Path) -> Path:
    """The nearest folder at or above `specs` holding one of ROOT_MARKERS, else the working directory.

    Spec sources, the paths in generated headers and the cache are relative to it, so running
    `opcheck generate --specs main/op_specs --out main/generated_tests` from the parent folder
    writes the same bytes as `opcheck generate` from main/.
    """
    start = Path(os.path.abspath(specs))
    folder = start if start.is_dir() else start.parent
    for candidate in (folder, *folder.parents):
        if any(os.path.lexists(candidate / marker) for marker in ROOT_MARKERS):
            return candidate
    return Path.cwd()


def _use_root(root: Path) -> Path:
    # The specs' own modules are named from the project root, wherever the command runs, and so are
    # the files they name (`values_file:`), which the runtime reads when the ops are probed.
    from opcheck.runtime.project_root import set_project_root

    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    set_project_root(root)
    return root


def _load(specs: Path, root: Path):
    if not specs.exists():
        raise _Failure(f"{specs}: no such file or folder (pass --specs PATH)")
    return _load_paths([specs], root)


def _load_paths(paths: list[Path], root: Path):
    from opcheck.spec import SpecError, load_specs
    from opcheck.spec.requires import validation_notes

    if importlib.util.find_spec("torch") is None:  # else every op path would fail on its own line
        raise _Failure(
            f"opcheck: torch is not installed in this Python ({sys.executable}): specs name "
            "torch ops and the generated tests call them; install torch, e.g. with README's "
            "set-up command"
        )
    _use_root(root)
    _interpret_triton(root)
    try:
        loaded = load_specs(paths, root=root)
    except SpecError as e:
        where = "" if _same(root, Path.cwd()) else f" (paths are relative to the project root, {_relative(root)})"
        raise _Failure(f"{e}\n{len(e.problems)} problem(s) found{where}.") from None
    for note in validation_notes(loaded):  # a note, not a problem: the exit status stays
        print(note, file=sys.stderr)
    return project_config.with_compile_default(loaded, _root_project(root))


def _root_project(root: Path) -> project_config.ProjectConfig:
    """The `[tool.opcheck]` table of the project at `root`: the one that shapes its specs (`compile`)
    and names its folders in generated headers, wherever the command runs."""
    try:
        return project_config.load(root)
    except project_config.ConfigError as e:
        raise _Usage(f"opcheck: {e}") from None


def _interpret_triton(root: Path) -> None:
    """Validating imports the ops, and with them their Triton kernels: where there is no GPU they
    are made interpreted, as under pytest (opcheck.triton; some triton releases ask the GPU driver
    when an autotuned kernel is defined)."""
    from opcheck.triton import setup_for_project

    try:
        setup_for_project(root)
    except ValueError as e:  # a bad [tool.opcheck] key (ConfigError) or OPCHECK_TRITON_AUTOTUNE_CONFIG
        raise _Failure(f"opcheck: {e}") from None


def _same(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def _relative(path: Path, base: Path | None = None) -> str:
    """`path` as the user reads it: relative to `base` (default: the working directory)."""
    try:
        return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(base or Path.cwd()))).as_posix()
    except ValueError:  # another drive on Windows
        return Path(os.path.abspath(path)).as_posix()


def _generate_command(args, base: Path) -> str:
    """The command that regenerates args.out from args.specs, run from `base` (the project root, whose
    `[tool.opcheck]` table gives the defaults there, so the command is the same from every folder)."""
    project = project_config.load(base)
    parts = ["opcheck", "generate"]
    for option, key, default in (("--specs", "specs", DEFAULT_SPECS), ("--out", "out", DEFAULT_OUT)):
        configured = project.path(key)
        value = _relative(getattr(args, key), base)
        if value != (_relative(configured, base) if configured is not None else default):
            parts += [option, value]
    return " ".join(parts)


def _generate(args) -> int:
    from opcheck.codegen import GenerationError, apply_plan, cache, plan_generation, stale_diff
    from opcheck.codegen.write import remove_stale_temp_files

    if args.cost and args.check:
        raise _Usage("opcheck generate: --cost applies when writing; run `opcheck list --cost` to estimate only")
    root = project_root(args.specs)
    # The header's command is run from the project root; the hints below, from here.
    regenerate = _generate_command(args, root)
    cache_file = root / cache.CACHE_FILE
    # The project's `compile` setting changes the modules as a spec would: a run under another
    # setting is not the one the cache recorded.
    compile_default = project_config.compile_default(_root_project(root))
    generator = f"{regenerate}\n[tool.opcheck] compile = {str(compile_default).lower()}"
    if not args.check:
        remove_stale_temp_files(args.out)  # leftovers of a run that was killed mid-write
        _refresh_schema_copy(args.specs)
    # --cost estimates the specs, so it loads them even when the cache says nothing changed
    cached = not args.check and not args.no_cache and not args.cost
    if cached and cache.is_fresh(args.specs, args.out, generator, cache_file, root=root):
        print(f"0 written: specs and generator unchanged since the last run ({_relative(args.out)})")
        return 0
    specs = _load(args.specs, root)
    try:
        plan = plan_generation(specs, args.out, regenerate=regenerate, root=root)
    except GenerationError as e:
        raise _Failure(str(e)) from None
    if args.check:
        stale_schema = _stale_schema_copy(args.specs)
        for line in stale_schema:
            print(line, file=sys.stderr)
        if plan.is_fresh:
            print(f"{_relative(args.out)} is up to date ({len(plan.unchanged)} modules)")
            return 1 if stale_schema else 0
        sys.stdout.write(stale_diff(plan))
        print(
            f"{_relative(args.out)} is stale: {len(plan.write)} module(s) to write, {len(plan.delete)} to "
            f"delete; run `{_generate_command(args, Path.cwd())}`",
            file=sys.stderr,
        )
        return 1
    try:
        apply_plan(plan)
    except GenerationError as e:
        raise _Failure(str(e)) from None
    cache.record(args.specs, args.out, generator, cache_file, root=root)
    print(
        f"{len(plan.write)} written, {len(plan.unchanged)} unchanged, {len(plan.delete)} deleted "
        f"({_relative(args.out)})"
    )
    if args.cost:
        _warn_past_time_budget(specs, args)
    return 0


def _specs_folder(specs: Path) -> Path:
    return specs.parent if specs.suffix in (".yaml", ".yml") or specs.is_file() else specs


def _refresh_schema_copy(specs: Path) -> None:
    """Write the schema copy beside the specs where it is wanted and missing or stale
    (opcheck.codegen.schema_copy); a file opcheck did not write is never touched."""
    from opcheck.codegen.schema_copy import schema_copy, wanted, write_copy
    from opcheck.codegen.write import GenerationError

    folder = _specs_folder(specs)
    copy = schema_copy(folder)
    if copy.needs_writing and wanted(folder, copy):
        try:
            write_copy(copy)
        except GenerationError as e:
            raise _Failure(str(e)) from None
        print(f"wrote {_relative(copy.path)} (the spec format's schema, for editors)")


def _stale_schema_copy(specs: Path) -> list[str]:
    """`generate --check`'s line about the schema copy beside the specs, when it is missing or stale."""
    from opcheck.codegen.schema_copy import CopyState, schema_copy, wanted

    folder = _specs_folder(specs)
    copy = schema_copy(folder)
    if not (copy.needs_writing and wanted(folder, copy)):
        return []
    missing = copy.state is CopyState.MISSING
    why = "is missing (a spec refers to it)" if missing else "is stale: opcheck's schema changed"
    return [f"{_relative(copy.path)} {why}; run `opcheck generate`"]


def _validate(args) -> int:
    specs = _load(args.specs, project_root(args.specs))
    tests = sum(_count_tests(s) for s in specs)
    print(f"ok: {len(specs)} spec(s), {tests} tests")
    return 0


def _count_tests(spec) -> int:
    """How many tests the spec's module holds: one per case (opcheck.spec.case.cases_of)."""
    from opcheck.spec.case import cases_of

    return sum(1 for _ in cases_of(spec))


def _list(args) -> int:
    cost_only = [f"--{o}" for o in ("device", "policy", "budget", "threshold") if getattr(args, o) is not None]
    if cost_only and not args.cost:
        raise _Usage(f"opcheck list: {', '.join(cost_only)} apply only with --cost")
    paths = _listed_paths(args)
    specs = sorted(_load_paths(paths, project_root(paths[0])), key=lambda s: s.name)
    if args.cost:
        return _list_cost(specs, args)
    rows = [("name", "op", "samples", "checks", "tests")]
    for s in specs:
        rows.append((s.name, s.op, str(len(s.samples)), ",".join(s.checks()), str(_count_tests(s))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    print(f"{len(specs)} spec(s), {sum(_count_tests(s) for s in specs)} tests")
    return 0


def _listed_paths(args) -> list[Path]:
    """The spec paths `list` reads: SPEC_PATH arguments, else --specs; each one that is not there, or
    is not a spec file, is named."""
    if not args.spec_paths:
        if not args.specs.exists():
            raise _Failure(f"{args.specs}: no such file or folder (pass --specs PATH or spec paths)")
        return [args.specs]
    if args.specs_given:
        raise _Usage("opcheck list: give spec paths or --specs, not both")
    problems = []
    for path in args.spec_paths:
        if not path.exists():
            problems.append(f"{path}: no such file or folder")
        elif path.is_file() and path.suffix not in (".yaml", ".yml"):
            problems.append(f"{path}: not a spec: expected a *.yaml or *.yml file, or a folder of them")
    if problems:
        raise _Failure("\n".join(problems))
    return list(args.spec_paths)


def _cost_settings(args, command: str):
    """The settings an estimate runs under, as pytest takes them (opcheck.runtime.cost.settings, which
    capture's cost comments read too): (Settings, device types or None for all)."""
    from opcheck.runtime.cost.settings import cost_settings

    given = {o: getattr(args, o, None) for o in ("policy", "budget", "device")}
    try:
        return cost_settings(args.project, **given)
    except (project_config.ConfigError, ValueError) as e:
        raise _Usage(f"opcheck {command}: {e}") from None


def _warn_past_time_budget(specs, args) -> None:
    """`generate --cost`: the tests estimated past the time budget pytest will give them, on stderr."""
    from opcheck.runtime.cost.report import estimate_specs, render_over_budget

    setting = args.project.get("time_budget")
    try:
        budget = (
            project_config.DEFAULT_TIME_BUDGET
            if setting is None
            else project_config.check_time_budget(setting.value, setting.where)
        )
    except project_config.ConfigError as e:
        raise _Usage(f"opcheck generate: {e}") from None
    if budget is None:
        print("opcheck generate --cost: the time budget is off ([tool.opcheck] time_budget): nothing to warn of")
        return
    where = "[tool.opcheck] time_budget" if setting is not None else "the default"
    settings, devices = _cost_settings(args, "generate")
    print(f"opcheck generate --cost: probing the samples of {len(specs)} spec(s) ...", file=sys.stderr, flush=True)
    estimates = estimate_specs(specs, settings, devices, threshold=budget)
    warning = render_over_budget(estimates, budget, where, _relative(args.out))
    sys.stderr.write(warning)
    done = sum(1 for e in estimates if e.skipped is None)
    if not warning:
        print(f"{done} test(s) estimated, none past the time budget of {budget:g} s ({where})")


def _list_cost(specs, args) -> int:
    """`opcheck list --cost`: the run's settings (_cost_settings), then opcheck.runtime.cost.report."""
    from opcheck.runtime.cost.estimate import THRESHOLD
    from opcheck.runtime.cost.report import estimate_specs, render

    settings, devices = _cost_settings(args, "list")
    print(f"opcheck list --cost: probing the samples of {len(specs)} spec(s) ...", file=sys.stderr, flush=True)
    threshold = THRESHOLD if args.threshold is None else args.threshold
    estimates = estimate_specs(specs, settings, devices, threshold)
    sys.stdout.write(render(estimates, threshold=threshold, top=args.top, settings=settings))
    return 0


def _new(args) -> int:
    from opcheck.codegen.scaffold import parse_shape, scaffold_spec
    from opcheck.codegen.scaffold_sample import find_sample
    from opcheck.codegen.schema_copy import SCHEMA_COPY_NAME

    folder = args.specs if args.specs.suffix not in (".yaml", ".yml") else args.specs.parent
    path = folder / f"{args.name}.yaml"
    if path.exists() and not args.force:
        raise _Failure(f"{_relative(path)} already exists; pass --force to overwrite it")
    root = _use_root(project_root(folder))
    try:
        shapes = tuple(parse_shape(shape) for shape in args.shapes)
        if shapes and args.sample is not None:
            raise ValueError("--shape and --sample both give the sample: pass one of them")
        sample = None
        if args.sample is not None:
            sample = find_sample(args.sample, op=args.op, name=args.name, path=path, root=root)
        if shapes or sample is not None:
            print(f"opcheck new: probing {args.op} at the sample given ...", file=sys.stderr, flush=True)
        text = scaffold_spec(
            args.name, args.op, schema=SCHEMA_COPY_NAME, imports=tuple(args.imports), shapes=shapes, sample=sample
        )
    except ValueError as e:
        raise _Failure(f"opcheck new: {e}") from None
    taken = _taken(folder, args.name, args.op, path, root)
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(
        f"wrote {_relative(path)}; next: opcheck validate && opcheck generate && "
        f"pytest {_relative(args.default_out)}/test_{args.name}.py"
    )
    for line in taken + _keep_schema_copy(folder):
        print(f"warning: {line}", file=sys.stderr)
    return 0


def _keep_schema_copy(folder: Path) -> list[str]:
    """Write the schema copy a new spec refers to, when missing or stale; what to warn about, if anything."""
    from opcheck.codegen.schema_copy import CopyState, schema_copy, write_copy
    from opcheck.codegen.write import GenerationError

    copy = schema_copy(folder)
    if copy.state is CopyState.USERS:
        return [
            f"{_relative(copy.path)} was not written by opcheck (it has no opcheck `$comment`): the spec "
            "refers to it as it is; delete it and run `opcheck new` or `opcheck generate` for opcheck's copy"
        ]
    if copy.needs_writing:
        try:
            write_copy(copy)
        except GenerationError as e:
            return [f"the spec refers to {_relative(copy.path)}, which cannot be written: {e}"]
        print(f"wrote {_relative(copy.path)} (the spec format's schema, for editors)")
    return []


def _taken(folder: Path, name: str, op: str, path: Path, root: Path) -> list[str]:
    """What the specs already in `folder` (other than `path`) say against a new spec `name` for `op`."""
    from opcheck.spec.loader import spec_names

    if not folder.is_dir():
        return []
    names = {
        n: (claim, claim_op)
        for n, (claim, claim_op) in spec_names([folder], root=root).items()
        if claim.location.file != _relative(path, root)
    }
    found = []
    if name in names:
        claim, claim_op = names[name]
        what = f" ({claim_op})" if claim_op else ""
        found.append(
            f"spec name {name!r} is already taken by {claim.location}{what}, so `opcheck validate` will "
            f"report a duplicate name: delete {_relative(path)} and scaffold under another name "
            f"(opcheck new OTHER_NAME --op {op}), or move that spec into {_relative(path)}"
        )
    for other, (claim, claim_op) in sorted(names.items()):
        if claim_op == op and other != name:
            found.append(f"{op} is already tested by spec {other!r} ({claim.location})")
    return found


def _import_opinfo(args) -> int:
    from opcheck.spec.opinfo_import import OpInfoImportError, import_opinfo, write_spec

    if importlib.util.find_spec("torch") is None:
        raise _Failure(f"opcheck import-opinfo: torch is not installed in this Python ({sys.executable})")
    from opcheck.codegen.schema_copy import SCHEMA_COPY_NAME

    try:
        imported = import_opinfo(args.opinfo)
        path = args.spec_file if args.spec_file is not None else args.default_specs / f"{imported.name}.yaml"
        root = _use_root(project_root(path.parent))
        taken = _taken(path.parent, imported.name, imported.spec["op"], path, root)
        write_spec(path, imported.text(schema=SCHEMA_COPY_NAME), force=args.force)
    except OpInfoImportError as e:
        raise _Failure(f"opcheck import-opinfo: {e}") from None
    print(
        f"wrote {_relative(path)}; next: opcheck validate && opcheck generate && "
        f"pytest {_relative(args.default_out)}/test_{imported.name}.py"
    )
    for line in taken + _keep_schema_copy(path.parent):
        print(f"warning: {line}", file=sys.stderr)
    return 0


def _capture(args) -> int:
    from opcheck.capture.command import CommandError, parse_command
    from opcheck.capture.run import CaptureError, Options, capture
    from opcheck.capture.summary import summary
    from opcheck.capture.targets import SelectionError, parse_selection
    from opcheck.codegen.schema_copy import SCHEMA_COPY_NAME

    words = list(args.command)
    if words[:1] == ["--"]:
        words = words[1:]
    if args.max_samples is not None and args.max_samples < 1:
        raise _Usage("opcheck capture: --max-samples: expected a positive number")
    try:
        selections = [parse_selection(op) for op in args.ops]
        command = parse_command(words)
    except (SelectionError, CommandError) as e:
        raise _Usage(f"opcheck capture: {e}") from None
    if args.specs.suffix in (".yaml", ".yml") or (args.specs.exists() and not args.specs.is_dir()):
        raise _Usage(f"opcheck capture: --specs {args.specs}: expected the folder of specs to write into")
    args.specs.mkdir(parents=True, exist_ok=True)
    root = _use_root(project_root(args.specs))
    options = Options(
        selections=selections,
        command=command,
        specs=args.specs,
        root=root,
        values=args.values,
        reduce=args.reduce,
        force=args.force,
        cost=args.cost,
        imports=tuple(args.imports),
        schema=args.specs / SCHEMA_COPY_NAME,  # a new spec refers to the copy beside it (opcheck.codegen.schema_copy)
    )
    if args.max_samples is not None:
        options.cap = args.max_samples
    try:
        outcome = capture(options)
    except CaptureError as e:
        raise _Failure(str(e)) from None
    text, status = summary(outcome, command, _relative(args.default_out))
    sys.stdout.write(text)
    if _refers_to_schema_copy(args.specs):
        for line in _keep_schema_copy(args.specs):
            print(f"warning: {line}", file=sys.stderr)
    return status


def _refers_to_schema_copy(folder: Path) -> bool:
    """Whether a spec in `folder` refers to the schema copy beside it (as new specs do)."""
    from opcheck.codegen.schema_copy import schema_copy, wanted

    return wanted(folder, schema_copy(folder))


def _report(args) -> int:
    from opcheck.report import ReportError, build_matrix, load_results, render_html, render_markdown

    if args.results is None:
        args.results = args.project.path("results")
        if args.results is None:
            raise _Usage(
                "opcheck report: no RESULTS given, and no pyproject.toml here or above sets `results` in "
                "[tool.opcheck]; pass the file pytest wrote (pytest --opcheck-results PATH.json or "
                "--junitxml=PATH.xml), or set it in [tool.opcheck] so that pytest writes it and this command reads it"
            )
    try:
        results = load_results(args.results)
    except ReportError as e:
        raise _Failure(f"opcheck report: {e}") from None
    if not results:
        raise _Failure(
            f"opcheck report: {args.results}: no generated opcheck tests in it (test ids "
            f"test_<check>[<device>-<dtype>-<sample>])"
        )
    matrix = build_matrix(results)
    source = args.results.name
    if args.markdown is None and args.html is None:
        sys.stdout.write(render_markdown(matrix, source))
        return 0
    for path, render in ((args.markdown, render_markdown), (args.html, render_html)):
        if path is not None:
            try:
                path.write_text(render(matrix, source), encoding="utf-8")
            except OSError as e:
                raise _Failure(f"opcheck report: cannot write {path}: {e.strerror}") from None
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
