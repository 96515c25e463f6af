"""One OpSpec → the text of its generated pytest module.

Every decision (the axes of each test function, which cases a rule marks, literals, imports) is
made here in Python; the templates only place the results. A module reads like its spec: the SPEC
literal, one mark per rule that marks a test, the table of marked tests (MARKED), and one test
function per check over its grid of devices × dtypes × samples, which `opcheck.parametrize.grid`
expands at collection with the ids of `opcheck.spec.case`. Every value from the spec reaches the
text through `opcheck.codegen.escape`, and the finished module is compiled before it is returned,
so a module that would not import is never written.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from opcheck.codegen.escape import identifier, literal, text
from opcheck.codegen.layout import Atom, CallExpr, Dict, Expr, Seq, Str, import_from, lines
from opcheck.codegen.source import to_expr, used_classes
from opcheck.module_header import lines as header_lines
from opcheck.spec import model
from opcheck.spec.case import NEVER_RUNS, CaseId, cases_of, deciding_rules

_MODULE_STEM = re.compile(r"[A-Za-z0-9_]+")  # fullmatch: `$` would also accept a final newline

# The module's own names: the spec's path, the spec, the marks of its rules, the marked tests.
SOURCE_NAME = "SOURCE"
SPEC_NAME = "SPEC"
MARKED_NAME = "MARKED"
SKIP_CONSTANT, XFAIL_CONSTANT = "SKIP", "XFAIL"
_RULE_KINDS = (
    ("skips", "skip", SKIP_CONSTANT),
    ("expected_failures", "xfail", XFAIL_CONSTANT),
)  # field, helper, constant


@dataclass(frozen=True)
class GeneratedFunction:
    """One test function of a generated module, as the template places it."""

    name: str  # test_gradcheck
    marker: str  # gradcheck: the check's pytest marker
    check_literal: str
    decorator: str  # the grid: `@grid(SPEC, ...)`, on one line or several


def module_name(spec: model.OpSpec) -> str:
    # The name becomes a file under the output folder: a separator or a line break would put the
    # module elsewhere, or under a name no one can type.
    if not _MODULE_STEM.fullmatch(spec.name):
        raise _generation_error(
            f"{text(spec.source)}: name: '{text(spec.name)}' cannot name a test module (expected [A-Za-z0-9_]+)"
        )
    return f"test_{spec.name}.py"


def marked_cases(spec: model.OpSpec) -> dict[CaseId, tuple[str, ...]]:
    """The cases a rule marks → the constants naming those rules' marks (`SKIP_0`, `XFAIL_1`), in
    collection order: the rules opcheck.spec.case.deciding_rules says can decide the case, each a
    mark pytest evaluates when the module is collected (it skips if any skip mark's condition
    holds, and takes the first expected failure whose condition holds)."""
    marked = {}
    for case in cases_of(spec):
        if not case.is_clean():  # the spec validator guarantees this; a bug if it ever fires
            raise ValueError(f"test id {case.param_id!r} has characters outside [A-Za-z0-9_.-]")
        rules = deciding_rules(spec, case)
        if rules:
            marked[case] = tuple(
                [f"{SKIP_CONSTANT}_{index}" for index, _ in rules.skips]
                + [f"{XFAIL_CONSTANT}_{index}" for index, _ in rules.expected_failures]
            )
    return marked


def generated_functions(spec: model.OpSpec, marked: dict[CaseId, tuple[str, ...]]) -> list[GeneratedFunction]:
    """The module's test functions: one per check, over its grid of devices × dtypes × samples
    (`marked`: what `marked_cases` says of the spec)."""
    marked_checks = {case.check for case in marked}
    out = []
    for check in spec.checks():
        name = str.__str__(check)
        dtypes = tuple(map(str.__str__, spec.dtypes_for(check)))
        # A device none of whose dtypes ever runs (mps for float64) is left off the axis.
        devices = tuple(d for d in map(str.__str__, spec.devices) if any((d, t) not in NEVER_RUNS for t in dtypes))
        args: list[tuple[str | None, Expr]] = [
            (None, Atom(SPEC_NAME)),
            (None, Str(name)),
            ("devices", Seq(tuple(map(Str, devices)))),
            ("dtypes", Seq(tuple(map(Str, dtypes)))),
        ]
        if check in marked_checks:
            args.append(("marked", Atom(MARKED_NAME)))
        out.append(
            GeneratedFunction(
                name=identifier(f"test_{name}"),
                marker=identifier(name),
                check_literal=literal(name),
                decorator="\n".join(lines(CallExpr("grid", tuple(args)), prefix="@")),
            )
        )
    return out


def definitions(spec: model.OpSpec, marked: dict[CaseId, tuple[str, ...]]) -> str:
    """The module's top-level assignments: SOURCE and SPEC; then the rules' marks and MARKED, if any."""
    spec_expr = to_expr(spec, source=spec.source, source_name=SOURCE_NAME)
    out = [f"{SOURCE_NAME} = {literal(spec.source)}", *lines(spec_expr, prefix=f"{SPEC_NAME} = ")]
    if marked:
        out.append("")
        used = {mark for marks in marked.values() for mark in marks}
        for field, helper, constant in _RULE_KINDS:
            for index in range(len(getattr(spec, field))):
                if f"{constant}_{index}" in used:
                    out.append(f"{constant}_{index} = {helper}({SPEC_NAME}.{field}[{index}])")
        table = Dict(tuple((Str(case.name), _marks_expr(marks)) for case, marks in marked.items()))
        out += lines(table, prefix=f"{MARKED_NAME} = ")
    return "\n".join(out)


def _marks_expr(marks: tuple[str, ...]) -> Expr:
    """One mark's name, or the tuple of them where a torch condition leaves more than one."""
    return Atom(marks[0]) if len(marks) == 1 else Seq(tuple(map(Atom, marks)))


def header(spec: model.OpSpec, regenerate: str) -> str:
    """Three comment lines (opcheck.module_header); the writer recognises its own files by the
    marker opening the first."""
    return header_lines(text(spec.source), text(spec.sha256), text(regenerate))


DOCSTRING_WIDTH = 120 - len('""""""')
"""The line length the linters hold generated modules to, less the docstring's quotes."""


def docstring(spec: model.OpSpec) -> str:
    """The module docstring, to be placed between triple quotes: one line, or two where one would
    be longer than the linters allow."""
    what, where = f"Gradient tests for {text(spec.op)},", f"generated from {text(spec.source)}."
    return f"{what} {where}" if len(what) + 1 + len(where) <= DOCSTRING_WIDTH else f"{what}\n{where}"


def imports(spec: model.OpSpec, marked: dict[CaseId, tuple[str, ...]]) -> str:
    """The module's imports from opcheck: the grid and rule marks, run_check, the model classes."""
    helpers = ["grid"] + [
        helper
        for field, helper, constant in _RULE_KINDS
        if any(mark.startswith(f"{constant}_") for marks in marked.values() for mark in marks)
    ]
    classes = [identifier(name) for name in sorted(used_classes(spec))]
    return "\n".join(
        import_from("opcheck.parametrize", helpers)
        + import_from("opcheck.runtime", ["run_check"])
        + import_from("opcheck.spec.model", classes)
    )


@lru_cache(maxsize=1)
def template_environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).with_name("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_module(spec: model.OpSpec, *, regenerate: str = "opcheck generate") -> str:
    """The full text of generated_tests/test_<name>.py for this spec; raises GenerationError
    rather than return a module Python would not read as written."""
    marked = marked_cases(spec)
    module = (
        template_environment()
        .get_template("test_module.py.j2")
        .render(
            header=header(spec, regenerate),
            docstring=docstring(spec),
            imports=imports(spec, marked),
            definitions=definitions(spec, marked),
            tests=generated_functions(spec, marked),
        )
    )
    check_module(module, spec)
    return module


def check_module(module: str, spec: model.OpSpec) -> None:
    """Raise GenerationError unless `module`, read from disk as Python reads a file, compiles."""
    filename = module_name(spec)
    data = module.encode("utf-8")
    # Python honours an encoding declaration in a file's first two lines, and compile() of a str
    # would ignore it: check the encoding a reader will use, then compile the bytes.
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:  # a declaration of an encoding Python does not know
        encoding = str(e)
    if encoding != "utf-8":
        raise _generation_error(
            f"{text(spec.source)}: the generated {filename} would be read as {text(encoding)}, "
            f"not UTF-8; this is a bug in opcheck's code generation"
        )
    try:
        compile(data, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte, before Python 3.12
        where = f"line {e.lineno}: {e.msg}" if isinstance(e, SyntaxError) else str(e)
        raise _generation_error(
            f"{text(spec.source)}: the generated {filename} does not compile ({text(where)}); "
            f"this is a bug in opcheck's code generation"
        ) from None


def _generation_error(message: str) -> Exception:
    # write.py owns GenerationError and imports this module, so it is looked up when raised.
    from opcheck.codegen.write import GenerationError

    return GenerationError(message)
