"""`opcheck capture`: run a command with ops recorded, then write what it recorded as spec samples.

1. The command runs in a child of this Python (opcheck.capture.child) with the selections recorded;
   its output is the user's to see, and its exit status is reported.
2. Per op, the recorded calls are merged by signature and bounded (opcheck.capture.select).
3. Per op, the kept samples go into the spec that already tests that op in the specs folder (new
   items at the end of its samples list), else into a new spec file named from the op. With values
   kept, each sample's tensors go to `values/<spec>/<sample>.pt` beside the specs.
4. Every spec written is validated like a hand-written one first; a new spec's flags come from one
   probe of its first sample (no vmap rule: check_batched_grad off; no double backward or forward AD:
   declared unsupported), and each new sample's estimated test cost on this machine is a comment.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opcheck.capture import cost, render, select, targets, write
from opcheck.capture.command import Command


class CaptureError(Exception):
    """Capture could not go on (the message says why); exit status 1."""


@dataclass
class Options:
    selections: list[targets.Selection]
    command: Command
    specs: Path  # the folder capture writes into, and only into
    root: Path  # the project root (spec sources are relative to it)
    cap: int = select.DEFAULT_CAP
    values: str | None = None  # None, "structured" or "all"
    reduce: bool = False
    force: bool = False
    cost: bool = True
    imports: tuple[str, ...] = ()
    schema: Path | None = None


@dataclass
class OpResult:
    path: str
    file: Path | None = None
    created: bool = False
    calls: int = 0
    distinct: int = 0
    written: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)  # of written: capture's own earlier samples it replaced
    skipped: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    values_files: list[Path] = field(default_factory=list)
    spec_name: str | None = None
    error: str | None = None  # why nothing was written for this op


@dataclass
class Outcome:
    exit_status: int | None
    ops: list[OpResult]
    unseen: list[str]
    hidden_by_compile: list[str] = field(default_factory=list)  # of unseen: targets compiled code may call unseen
    compiled: int = 0  # frames torch.compile compiled in the run


def capture(options: Options) -> Outcome:
    """Run the command recorded, then write the specs (see the module docstring)."""
    _readable_specs(options)  # before the command runs: a long run's records are not lost to a typo
    with tempfile.TemporaryDirectory(prefix="opcheck-capture-") as tmp:
        run = _run_child(options, Path(tmp))
        if run.get("error") and run.get("exit") == 2 and not run.get("ops"):
            raise CaptureError(f"opcheck capture: {run['error']}")
        candidates = select.merge_runs([run])
        results = []
        for path, found in candidates.items():
            try:
                results.append(_write_op(options, path, found, run, Path(tmp) / "values"))
            except (CaptureError, write.WriteError) as e:  # this op's spec only; the others are written
                results.append(
                    OpResult(path, calls=run["ops"][path].get("calls", 0), distinct=len(found), error=str(e))
                )
        missing = [s for s in options.selections if not any(_selected(s, p) for p in candidates)]
        compiled = int(run.get("compiled") or 0)
        # torch.ops and aten calls reach the recorder from compiled graphs too; Python callables and
        # autograd.Functions traced into a graph run as its ops, never as the callable capture replaced.
        hidden = [s.text for s in missing if compiled and s.kind in ("function", "patch")]
        return Outcome(run.get("exit"), results, [s.text for s in missing], hidden, compiled)


def _selected(sel: targets.Selection, path: str) -> bool:
    return path == sel.path or (sel.kind in ("library", "aten") and path.startswith(sel.path + "."))


def _run_child(options: Options, tmp: Path) -> dict[str, Any]:
    values_dir = tmp / "values"
    values_dir.mkdir()
    records = tmp / "records.json"
    config = {
        "selections": [s.__dict__ for s in options.selections],
        "mode": options.command.mode,
        "target": options.command.target,
        "argv": list(options.command.argv),
        "records": str(records),
        "values": options.values,
        "values_dir": str(values_dir),
        "imports": list(options.imports),
    }
    (tmp / "config.json").write_text(json.dumps(config), encoding="utf-8")
    env = dict(os.environ)
    # The child imports opcheck as this process does, wherever the command runs.
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    proc = subprocess.Popen([sys.executable, "-m", "opcheck.capture.child", str(tmp / "config.json")], env=env)
    with _interrupts_wait_for(proc) as interrupts, cost.prepared_meanwhile(options.cost or options.reduce):
        proc.wait()
        if len(interrupts) > 1:
            raise CaptureError("opcheck capture: interrupted twice; the command was ended and nothing was written")
    if not records.exists():
        raise CaptureError(
            f"opcheck capture: the command ended (exit status {proc.returncode}) before anything was recorded "
            "(killed by a signal, or os._exit)"
        )
    run: dict[str, Any] = json.loads(records.read_text(encoding="utf-8"))
    run.setdefault("exit", proc.returncode)
    return run


@contextlib.contextmanager
def _interrupts_wait_for(proc: subprocess.Popen[bytes]) -> Iterator[list[int]]:
    """While the command runs: a first Ctrl-C (which the command gets too, from the terminal) lets
    it stop and write what it recorded, which capture then writes; a second one ends it, and
    capture writes nothing. Yields the interrupts seen."""
    import signal
    import threading

    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def on_interrupt(signum: int, frame: Any) -> None:
        seen.append(signum)
        if len(seen) == 1:
            print(
                "opcheck capture: interrupted; writing what the command recorded once it stops "
                "(Ctrl-C again to end it, writing nothing)",
                file=sys.stderr,
                flush=True,
            )
        else:
            proc.kill()  # the wait it interrupted then returns

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _readable_specs(options: Options) -> None:
    """Every spec file in the specs folder reads as YAML: capture decides from each file's `op:`
    whether it tests an op, and writes a second spec beside one it cannot read."""
    from opcheck.spec.yamlload import load_yaml

    for file in sorted([*options.specs.glob("*.yaml"), *options.specs.glob("*.yml")]):
        try:
            text = file.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise CaptureError(f"opcheck capture: {_shown(file)}: not UTF-8 text ({e.reason}); fix it first") from None
        except OSError as e:
            raise CaptureError(f"opcheck capture: {_shown(file)}: cannot be read ({e.strerror})") from None
        document = load_yaml(text, _shown(file))
        if document.root is None and text.strip() and document.problems:  # an empty file tests no op
            raise CaptureError(
                f"opcheck capture: {document.problems[0]}; capture cannot tell which op it tests, so it ran "
                "nothing: fix it first"
            )


# ------------------------------------------------------------------------------ one op
def _write_op(
    options: Options, path: str, found: list[select.Candidate], run: dict[str, Any], values_tmp: Path
) -> OpResult:
    from opcheck.spec.build import derive_name

    info = run["ops"][path]
    result = OpResult(path, calls=info.get("calls", 0), distinct=len(found))
    for reason, n in info.get("unsupported", {}).items():
        result.notes.append(f"{n} call(s) not recorded: {reason}")
    if info.get("backward"):
        result.notes.append(f"{info['backward']} call(s) inside backward passes (derivatives) not recorded")
    for check, n in info.get("in_checks", {}).items():
        result.notes.append(f"{n} call(s) made inside {check} (its perturbed inputs) not recorded")
    if info.get("dropped"):
        result.notes.append(f"{info['dropped']} call(s) past {len(found)} distinct signatures were counted, not kept")
    if not found:
        return result
    choice = select.choose(found, options.cap)
    for c, reason in choice.dropped:
        result.dropped.append(f"{render.sample_name(c, set())} ({c.count} calls): {reason}")
    existing = _existing_spec(options, path)
    module = run.get("imports", {}).get(path)
    imports = tuple(dict.fromkeys([*options.imports, *([module] if module else [])]))
    if existing is not None:
        file, text, spec_name = existing
        if not os.access(file, os.W_OK) or not file.stat().st_mode & stat.S_IWUSR:  # root's access() says yes
            raise CaptureError(
                f"opcheck capture: {_shown(file)} is read-only; capture does not replace it: make it writable "
                "(chmod u+w) and run again, or give another --specs folder; nothing written for this op"
            )
    else:
        spec_name = _free_name(options, derive_name(path))
        file, text = options.specs / f"{spec_name}.yaml", None
        result.notes += [f"{path} is also tested by {where}" for where in _other_specs(options, path)]
    if not write.inside(file, options.specs):
        raise CaptureError(f"opcheck capture: {file} lies outside the specs folder {options.specs}; nothing written")
    result.file, result.created, result.spec_name = file, existing is None, spec_name
    autocast = sorted({d for c, _ in choice.kept for d in c.autocast})
    missing = [d for d in autocast if existing is None or d not in _lowprec_dtypes(existing[1])]
    if missing:
        result.notes.append(
            f"calls ran under autocast, computing in {', '.join(missing)}: "
            + ("the new spec's lowprec_dtypes has it" if existing is None else "add it to the spec's lowprec_dtypes")
        )
    if not any(render.grad_wanted([c]) for c, _ in choice.kept):
        result.notes.append("the run never asked for a gradient: every floating-point input is checked")
    found_samples = write.find_samples(text, _shown(file)) if text is not None else None
    taken = set(found_samples.names) if found_samples is not None else set()
    own = set(found_samples.own) if found_samples is not None else set()
    pending: list[tuple[render.Rendered, select.Candidate]] = []
    twins: dict[str, str] = {}  # a reduced twin's name -> the name of the sample it reduces
    for c, why in choice.kept:
        name = render.sample_name(c, {r.name for r, _ in pending})
        grad = render.grad_wanted([c])  # else every floating-point input is checked
        pending.append((_rendered(options, c, name, why, grad, file), c))
        if options.reduce:
            small = render.twin(c)
            if small is not None:
                twin_name = render.sample_name(small, {r.name for r, _ in pending})
                words = (
                    f"reduced twin of {name}: each dim over {render.REDUCE_ABOVE} -> {render.REDUCE_TO} + its "
                    f"remainder mod {render.REDUCE_TO}"
                )
                pending.append((_rendered(options, small, twin_name, [words], grad, file, values=False), small))
                twins[twin_name] = name
    if text is not None:
        theirs = [r for r, _ in pending if r.name in taken - own]
        if theirs and not options.force:
            result.skipped += [
                f"{r.name}: the spec has a sample of that name; kept yours (--force replaces it)" for r in theirs
            ]
            pending = [(r, c) for r, c in pending if r.name not in taken - own]
        result.replaced = [r.name for r, _ in pending if r.name in own]
    if not pending:
        return result
    result.values_files = _write_values(options, file, pending, values_tmp, set(result.replaced))
    try:
        build = _Builder(options, file, text, imports, path, None if existing else spec_name)
        spec = build.validated(pending)
        copies = _copies(spec, taken, {r.name for r, _ in pending})
        if copies:
            result.dropped += [f"{new}: the same sample as the spec's {old!r}" for new, old in copies.items()]
            for f in [f for f in result.values_files if f.stem in copies]:
                f.unlink(missing_ok=True)
                result.values_files.remove(f)
            pending = [(r, c) for r, c in pending if r.name not in copies]
            if not pending:
                return result
            spec = build.validated(pending)
        with cost.quiet_vmap():
            if text is None:
                build.declared = cost.probe_flags(spec)
                spec = build.validated(pending)
            if options.cost or twins:
                estimates = cost.estimates(spec, {r.name for r, _ in pending})
                costlier = cost.costlier_twins(twins, estimates)
                result.dropped += [f"{t}: {why}" for t, why in costlier.items()]
                pending = [(r, c) for r, c in pending if r.name not in costlier]
                if options.cost:
                    pending = cost.with_costs(pending, estimates)
                build.validated(pending)
        _store(file, text, build.text)
    except BaseException:
        for f in result.values_files:
            f.unlink(missing_ok=True)
        raise
    result.written = [r.name for r, _ in pending]
    return result


def _lowprec_dtypes(text: str) -> list[str]:
    """The `lowprec_dtypes` an existing spec's text lists (it read as YAML before the command ran)."""
    import yaml

    data = yaml.safe_load(text)
    listed = data.get("lowprec_dtypes") if isinstance(data, dict) else None
    return [d for d in listed if isinstance(d, str)] if isinstance(listed, list) else []


def _copies(spec: Any, existing: set[str], new: set[str]) -> dict[str, str]:
    """The new samples equal in content (everything but the name) to one the spec had: new -> old."""
    from dataclasses import replace

    kept = existing - new  # a sample --force replaces is new, not one the spec keeps
    before = {replace(s, name=""): s.name for s in spec.samples if s.name in kept}
    found = {s.name: replace(s, name="") for s in spec.samples if s.name in new}
    return {name: before[content] for name, content in found.items() if content in before}


def _rendered(
    options: Options,
    c: select.Candidate,
    name: str,
    why: list[str],
    grad: bool,
    file: Path,
    values: bool = True,
) -> render.Rendered:
    values_file = None
    if values and options.values and c.values:
        values_file = _values_path(file, name).relative_to(file.parent).as_posix()
    return render.render_sample(
        c, name, why, grad=grad, values_file=values_file, structured_only=options.values == "structured"
    )


def _write_values(
    options: Options,
    file: Path,
    pending: list[tuple[render.Rendered, select.Candidate]],
    tmp: Path,
    own: set[str],
) -> list[Path]:
    """Each sample's values file: the entries its arguments read, from the recorded first call (one
    replacing capture's own sample replaces that sample's file)."""
    written: list[Path] = []
    try:
        for r, c in pending:
            if r.values_keys and c.values:
                written.append(_write_values_file(options, file, r, tmp / c.values, r.name in own))
    except BaseException:  # all of this op's values files, or none
        for f in written:
            f.unlink(missing_ok=True)
        raise
    return written


def _values_path(spec: Path, sample: str) -> Path:
    """Where a sample's values file goes: values/SPEC/SAMPLE.pt beside the spec."""
    return spec.parent / "values" / spec.stem / f"{sample}.pt"


def _write_values_file(options: Options, file: Path, r: render.Rendered, recorded: Path, own: bool) -> Path:
    import torch

    target = _values_path(file, r.name)
    # The deepest part of the path that exists, links followed: a `values` link out of the folder counts.
    present = next(p for p in (target, *target.parents) if os.path.lexists(p))
    if not write.inside(present, options.specs):
        raise CaptureError(
            f"opcheck capture: {_shown(target)} lies outside the specs folder {options.specs} "
            f"({_shown(present)} leads to {os.path.realpath(present)}); nothing written"
        )
    if os.path.lexists(target) and not (options.force or own):
        raise CaptureError(f"opcheck capture: {_shown(target)} already exists; pass --force to replace it")
    saved = torch.load(recorded, map_location="cpu", weights_only=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.tmp")
    torch.save({k: saved[k] for k in r.values_keys}, part)
    os.replace(part, target)
    return target


@dataclass
class _Builder:
    """The text of one op's spec with the pending samples, validated like a hand-written spec."""

    options: Options
    file: Path
    before: str | None  # the existing spec's text; None: a new spec
    imports: tuple[str, ...]
    path: str
    spec_name: str | None
    declared: list[str] = field(default_factory=list)  # a new spec's flags from the probe, as lines
    text: str = ""

    def validated(self, pending: list[tuple[render.Rendered, select.Candidate]]) -> Any:
        """The spec's model (self.text its text); CaptureError with the problems if it does not validate."""
        from opcheck.spec import SpecError
        from opcheck.spec.loader import load_spec_text

        if self.before is None:
            self.text = self._new(pending)
        else:
            found = write.find_samples(self.before, _shown(self.file))
            items = {r.name: render.sample_text(r, found.indent) for r, _ in pending}
            replace = {n: t for n, t in items.items() if n in found.names}
            new = [(n, t) for n, t in items.items() if n not in found.names]
            self.text = write.extend(self.before, found, new, replace)
        source = Path(os.path.relpath(os.path.abspath(self.file), os.path.abspath(self.options.root))).as_posix()
        try:
            return load_spec_text(self.text, source=source, root=self.options.root)[0]
        except SpecError as e:
            raise CaptureError(
                f"opcheck capture: the spec written for {self.path} would not validate, so nothing was written:\n{e}"
            ) from None

    def _new(self, pending: list[tuple[render.Rendered, select.Candidate]]) -> str:
        from opcheck.spec.build import derive_name

        lines = []
        if self.options.schema is not None:
            schema = Path(os.path.relpath(self.options.schema, os.path.abspath(self.file.parent))).as_posix()
            lines.append(f"# yaml-language-server: $schema={schema}")
        calls = sum(c.count for _, c in pending)
        lines.append(f"# Recorded by `opcheck capture` from `{' '.join(self.options.command.shown().split())}`")
        lines.append(f"# ({calls} call{'s' if calls != 1 else ''}). Review the samples, then `opcheck generate`.")
        lines.append(f"op: {render.dump(self.path)}")
        if self.spec_name and self.spec_name != derive_name(self.path):
            lines.append(f"name: {self.spec_name}")
        if self.imports:
            lines.append(f"imports: {render.dump(list(self.imports))}")
        dtypes = {d["dtype"] for _, c in pending for d in select.tensors(c.args, c.kwargs)}
        lines.append(f"dtypes: [{'complex128' if any(d.startswith('complex') for d in dtypes) else 'float64'}]")
        low = sorted({d for d in dtypes if d in render.LOWPREC} | {d for _, c in pending for d in c.autocast})
        if low:
            lines.append(f"lowprec_dtypes: {render.dump(low)}")
        if self.path.startswith("torch.ops.") and not self.path.startswith("torch.ops.aten."):
            # as `opcheck new` writes for an operator the user registered
            lines.append("library_opcheck: true  # torch.library.opcheck: schema, autograd and fake registrations")
        lines += self.declared
        lines.append("samples:")
        return "\n".join(lines) + "\n" + "".join(render.sample_text(r, 2) for r, _ in pending)


def _store(file: Path, before: str | None, text: str) -> None:
    from opcheck.spec.opinfo_import import OpInfoImportError, write_spec

    if before is not None:
        if file.read_bytes() != before.encode("utf-8"):
            raise CaptureError(
                f"opcheck capture: {_shown(file)} changed while capture ran; nothing written, run it again"
            )
    try:
        write_spec(file, text, force=before is not None)
    except OpInfoImportError as e:
        raise CaptureError(f"opcheck capture: {e}") from None


def _existing_spec(options: Options, path: str) -> tuple[Path, str, str] | None:
    """The spec file in the specs folder whose `op:` is `path`, its text (bytes as they are: line
    ends kept) and its spec's name."""
    import yaml

    from opcheck.spec.build import derive_name

    for file in sorted(options.specs.glob("*.yaml")):
        try:
            text = file.read_bytes().decode("utf-8")
            data = yaml.safe_load(text)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            raise CaptureError(
                f"opcheck capture: {_shown(file)} no longer reads as YAML (it did before the command ran); "
                f"capture cannot tell whether it tests {path}; nothing written for this op"
            ) from None
        if isinstance(data, dict) and data.get("op") == path:
            name = data.get("name")
            return file, text, name if isinstance(name, str) else derive_name(path)
    return None


def _other_specs(options: Options, path: str) -> list[str]:
    """Where the specs folder already tests `path` (a family member's spec, which capture does not
    extend): `spec 'gelu' (op_specs/nn_functional.yaml:28:9)`."""
    from opcheck.spec.loader import spec_names

    return [
        f"spec {name!r} ({claim.location})"
        for name, (claim, op) in sorted(spec_names([options.specs], root=options.root).items())
        if op == path
    ]


def _free_name(options: Options, name: str) -> str:
    """`name`, else `name_captured`, else `name_captured_2`...: one no spec in the folder is named
    (a family member's derived name too) and no file there has."""
    from opcheck.spec.loader import spec_names

    taken = set(spec_names([options.specs], root=options.root)) | {f.stem for f in options.specs.glob("*.y*ml")}
    if name not in taken:
        return name
    name = f"{name}_captured"
    k = 2
    candidate = name
    while candidate in taken:
        candidate, k = f"{name}_{k}", k + 1
    return candidate


def _shown(path: Path) -> str:
    try:
        return Path(os.path.relpath(path)).as_posix()
    except ValueError:
        return str(path)
