"""No spec can put code into a generated module.

Specs whose file names and strings are built to break out of a comment, a docstring or a string
literal (or to switch the file's encoding) are loaded and generated as a user would; then every
module, and every committed one, is checked two ways: its syntax tree holds only the statements
the generator writes, and evaluating its top level, with builtins and imports fenced in, calls
nothing but opcheck's model classes and pytest's marks.
"""

from __future__ import annotations

import ast
import base64
import builtins
import io
import json
import os
import re
import sys
import tokenize
from pathlib import Path

import _pytest.mark.structures
import pytest
import torch

import opcheck.parametrize
import opcheck.runtime
from opcheck.codegen import GENERATED_MARKER, GenerationError, apply_plan, module_name, plan_generation, render
from opcheck.codegen.source import MODEL_CLASSES
from opcheck.spec import load_specs
from opcheck.spec import model as M
from tests import forked_python

REPO = Path(__file__).resolve().parents[2]
GOLDEN_EXPECTED = Path(__file__).parent / "golden" / "expected"

PAYLOAD = "__import__('os').system('touch PWNED')"
BREAKOUTS = [
    '"""',
    "'''",
    "\n",
    "\r",
    "\r\n",
    "\u2028",
    "\u2029",
    "\x85",
    "#",
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "\\",
    "\\\\",
    '\\"',
    "\\n",
]
# A reason, argument or keyword value that tries every way out of a literal, then runs a command.
HOSTILE_STRING = " ".join(BREAKOUTS) + f" x\"\"\"+{PAYLOAD}+\"\"\" x'''+{PAYLOAD}+''' x')\n{PAYLOAD}\n#"


def _utf7_hidden(code: str) -> str:
    """`code` in UTF-7's base64 form: letters, digits and `+`/`-`, which read as plain text."""
    hidden = "+" + base64.b64encode(code.encode("utf-16-be")).decode("ascii").rstrip("=") + "-"
    assert "/" not in hidden  # it must fit in a file name
    return hidden


# Spec file names (Linux allows anything but `/` and NUL), each in a spec whose strings are plain,
# so that one attack cannot mask another by merely breaking the module. The UTF-7 ones use only
# characters an allow-list of "safe" path characters passes: in a header line, `coding:utf-7`
# would make Python decode the module as UTF-7, turning the `+...-` run into `"""+...+"""`.
HOSTILE_FILE_STEMS = [
    'x"""+str(__import__("os").system("touch PWNED"))+"""',
    f"x'''+str({PAYLOAD})+'''",
    f"newline\nimport os\n{PAYLOAD}\n#",
    f"cr\r{PAYLOAD}\r\n{PAYLOAD}",
    f"separators\u2028{PAYLOAD}\u2029{PAYLOAD}\x85\x0b\x0c\x1c\x1d\x1e",
    "hash # {{ header }} }} {% raw %} {# {%- endfor %} %}",
    "back\\slash\\\\ \\n \\u2028 \\x22\\x22\\x22 ends in a backslash\\",
    "coding:utf-7 " + _utf7_hidden('"""+str(__import__("os").system("touch PWNED"))+"""'),
    "x -*- coding: utf-7 -*- " + _utf7_hidden('"""+str(__import__("os").system("touch PWNED"))+"""'),
    "vim: set fileencoding=latin-1 :",
    "tab\tbell\x07escape\x1b[31mdel\x7f",
]
# A spec named on the command line may have any name, also one that ends in a line break, which
# a header line would end early.
HOSTILE_FILE_NAMES = ["ends in a newline.yaml\n", "ends in a cr.yaml\r"]
# The command the header tells a reader to run comes from the command line, not a spec, but goes
# through the same routine.
HOSTILE_REGENERATE = f'opcheck generate --specs "op_specs\n"\u2028"""+{PAYLOAD}+"""'


def _spec_yaml(index: int, string: str) -> str:
    s = json.dumps(string)  # a YAML double-quoted scalar
    return f"""op: torch.sin
name: hostile_{index}
devices: [cpu]
dtypes: [float64]
lowprec_dtypes: [float32]
samples:
  - name: small
    args: [{{shape: [3]}}, {s}]
    kwargs: {{mode: {s}}}
tolerances:
  - where: {{sample: small}}
    atol: 1.0e-3
    reason: {s}
skips:
  - where: {{check: lowprec}}
    reason: {s}
expected_failures:
  - where: {{check: gradgradcheck}}
    reason: {s}
"""


# A values file's name and the dict key a spec names in it (values_file / values_key): strings like
# any other, which a spec writes and the module holds (a path may hold anything but a backslash).
HOSTILE_VALUES_NAME = 'x"""+str(__import__("os").system("touch PWNED"))+""" \n\u2028 {{ }} # coding:utf-7 .pt'
HOSTILE_VALUES_DIR = "shared"


def _values_spec_yaml() -> str:
    path = json.dumps(f"../{HOSTILE_VALUES_DIR}/{HOSTILE_VALUES_NAME}")
    return f"""op: torch.sin
name: hostile_values
devices: [cpu]
dtypes: [float64]
samples:
  - name: small
    args: [{{shape: [3], values_file: {path}, values_key: {json.dumps(HOSTILE_STRING)}}}]
"""


def _generate(root: Path, folder: str, specs_yaml: dict, regenerate: str) -> list[tuple[M.OpSpec, Path, str]]:
    """Write {file name (str, or bytes where not UTF-8): YAML}, load the folder and each file by name,
    and generate them into `folder`/generated_tests."""
    base = root / folder
    base.mkdir()
    paths = [base]
    for name, text in specs_yaml.items():
        path = Path(os.fsdecode(os.fsencode(base) + b"/" + (name if isinstance(name, bytes) else os.fsencode(name))))
        try:
            path.write_text(text, encoding="utf-8")
        except OSError:  # a file system that insists on UTF-8 names
            continue
        paths.append(path)
    specs = load_specs(paths, root=root)
    out = base / "generated_tests"
    apply_plan(plan_generation(specs, out, regenerate=regenerate))
    return [(spec, out / module_name(spec), regenerate) for spec in sorted(specs, key=lambda s: s.name)]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The hostile specs, loaded and generated: (root, [(spec, module path, regenerate command)])."""
    root = tmp_path_factory.mktemp("hostile")
    names = [f"{stem}.yaml" for stem in HOSTILE_FILE_STEMS] + HOSTILE_FILE_NAMES + [b"not utf-8 \xff\xfe.yaml"]
    modules = _generate(root, "names", {n: _spec_yaml(i, "plain") for i, n in enumerate(names)}, "opcheck generate")
    modules += _generate(root, "strings", {"strings.yaml": _spec_yaml(0, HOSTILE_STRING)}, HOSTILE_REGENERATE)
    (root / HOSTILE_VALUES_DIR).mkdir()
    torch.save({HOSTILE_STRING: torch.zeros(3)}, root / HOSTILE_VALUES_DIR / HOSTILE_VALUES_NAME)
    modules += _generate(root, "values", {"values.yaml": _values_spec_yaml()}, "opcheck generate")
    yield root, modules
    assert not list(root.rglob("PWNED")) and not Path("PWNED").exists()


def test_the_hostile_specs_say_what_they_were_written_to_say(hostile):
    root, modules = hostile
    sources = {spec.source for spec, _, _ in modules}
    wanted = {f"names/{n}" for n in [f"{stem}.yaml" for stem in HOSTILE_FILE_STEMS] + HOSTILE_FILE_NAMES}
    assert wanted | {"strings/strings.yaml"} <= sources
    (strings,) = [spec for spec, _, _ in modules if spec.source == "strings/strings.yaml"]
    assert [r.reason for r in strings.skips + strings.expected_failures] == [HOSTILE_STRING] * 2
    assert strings.tolerances[0].reason == HOSTILE_STRING
    assert strings.samples[0].args[1] == HOSTILE_STRING and strings.samples[0].kwargs == (("mode", HOSTILE_STRING),)
    (values,) = [spec for spec, _, _ in modules if spec.source == "values/values.yaml"]
    (arg,) = values.samples[0].args
    assert (arg.values_file, arg.values_key) == (f"{HOSTILE_VALUES_DIR}/{HOSTILE_VALUES_NAME}", HOSTILE_STRING)


def test_hostile_modules_hold_only_the_generated_statements(hostile):
    _, modules = hostile
    for spec, path, regenerate in modules:
        data = path.read_bytes()
        assert tokenize.detect_encoding(io.BytesIO(data).readline)[0] == "utf-8", path
        tree = ast.parse(data, str(path))
        check_statements(tree, path)
        lines = data.decode("utf-8").splitlines()
        assert lines[0].startswith(f"{GENERATED_MARKER} from ") and all(line.startswith("# ") for line in lines[:3])
        end = tree.body[0].end_lineno  # the docstring: one line, or two where one would be too long
        assert lines[3].startswith('"""') and end in (4, 5) and lines[end] == ""
        assert end == 4 or len(lines[3]) + 1 + len(lines[4]) > 120  # wrapped only where one line is too long
        # The header and docstring show the spec's path, escaped but complete.
        doc = ast.get_docstring(tree, clean=False)
        assert doc.replace(",\n", ", ") == f"Gradient tests for {spec.op}, generated from {spec.source}."
        assert ast.literal_eval(f'"{lines[2].removeprefix("# regenerate: ")}"') == regenerate


def test_hostile_modules_evaluate_to_the_spec_and_nothing_else(hostile):
    _, modules = hostile
    for spec, path, _ in modules:
        namespace = evaluate_fenced(path)
        assert namespace["SPEC"] == spec
        assert namespace["SPEC"].samples[0].location == spec.samples[0].location  # not compared by ==


def test_a_long_hostile_string_is_written_in_parts_that_join_back(hostile):
    _, modules = hostile
    (path,) = [path for spec, path, _ in modules if spec.source == "strings/strings.yaml"]
    text = path.read_text(encoding="utf-8")
    written = [
        ast.get_source_segment(text, node)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Constant) and node.value == HOSTILE_STRING
    ]
    assert len(written) == 5  # sample argument and keyword, tolerance, skip and expected failure reasons
    for segment in written:  # too long for a line: an implicit concatenation, one string token per line
        parts = [t for t in tokenize.generate_tokens(io.StringIO(segment).readline) if t.type == tokenize.STRING]
        assert len(parts) >= 2 and len({t.start[0] for t in parts}) == len(parts), segment


def test_hostile_generation_is_stable(hostile):
    _, modules = hostile
    for spec, path, regenerate in modules:
        assert plan_generation([spec], path.parent, regenerate=regenerate).unchanged == [path]


COMMITTED = sorted((REPO / "generated_tests").glob("test_*.py")) + sorted(GOLDEN_EXPECTED.glob("test_*.py"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_modules_hold_and_run_only_opcheck_code(path):
    check_statements(ast.parse(path.read_bytes(), str(path)), path)
    evaluate_fenced(path)


def test_a_module_that_would_not_compile_is_never_returned_or_written(tmp_path, monkeypatch):
    # Simulate an escaping slip: header and docstring text placed as it is.
    monkeypatch.setattr(render, "text", lambda value: value)
    spec = _spec(source="op_specs/ends in a newline\n")
    with pytest.raises(
        GenerationError,
        match=r"^op_specs/ends in a newline\n: the generated test_demo.py does not "
        r"compile \(line 2: .*\); this is a bug in opcheck",
    ):
        render.render_module(spec)
    with pytest.raises(GenerationError, match="does not compile"):
        plan_generation([spec], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_module_python_would_decode_otherwise_is_refused(monkeypatch):
    monkeypatch.setattr(render, "text", lambda value: value)
    with pytest.raises(
        GenerationError,
        match=r"^op_specs/coding:latin-1 x.yaml: the generated test_demo.py would "
        r"be read as iso-8859-1, not UTF-8",
    ):
        render.render_module(_spec(source="op_specs/coding:latin-1 x.yaml"))
    with pytest.raises(GenerationError, match="would be read as .*unknown encoding"):
        render.render_module(_spec(source="op_specs/coding:no-such-codec x.yaml"))


@pytest.mark.parametrize("name", ["../escape", "a/b", "x\n", "", "a.b", "é"])
def test_a_name_that_is_not_a_plain_module_stem_is_refused(name):
    with pytest.raises(GenerationError, match=r"^op_specs/demo.yaml: name: '.*' cannot name a test module"):
        module_name(_spec(name=name))


def test_cli_with_a_spec_path_ending_in_a_newline(tmp_path):
    (tmp_path / "op_specs").mkdir()
    (tmp_path / "op_specs" / "sin.yaml\n").write_text(_spec_yaml(0, "plain"), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def run(*args):  # `python -m opcheck generate ...`, forked with torch imported (tests/forked_python.py)
        return forked_python.run("opcheck", "generate", "--specs", "op_specs/sin.yaml\n", *args, cwd=tmp_path, env=env)

    first = run("--no-cache")
    assert first.returncode == 0, first.stdout + first.stderr
    module = tmp_path / "generated_tests" / "test_hostile_0.py"
    check_statements(ast.parse(module.read_bytes()), module)
    lines = module.read_text(encoding="utf-8").splitlines()
    assert lines[0].endswith("op_specs/sin.yaml\\n. Do not edit: change the spec and regenerate."), lines[:4]
    assert lines[2] == "# regenerate: opcheck generate --specs op_specs/sin.yaml\\n", lines[:4]
    again = run("--check")
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout + again.stderr


# ---- what a generated module may contain ------------------------------------------------------

PARAMS = ("device", "dtype", "sample")
HELPERS = ("grid", "skip", "xfail")  # what opcheck.parametrize gives a generated module
RULE_MARKS = {"skip": ("SKIP", "skips"), "xfail": ("XFAIL", "expected_failures")}


def check_statements(tree: ast.Module, path: Path) -> None:
    """The module is: docstring, the four imports, `SOURCE = <str>`, `SPEC = <model value>`, one
    `<KIND>_<i> = <kind>(SPEC.<rules>[i])` per rule that marks a test, `MARKED = {<test name>: <mark>
    or a tuple of marks}` when there are any, then test functions."""
    body = list(tree.body)
    where = f"{path}: "
    assert len(body) >= 8, where + "too few statements"
    docstring, import_pytest, import_helpers, import_runtime, import_model, source, spec = body[:7]
    assert isinstance(docstring, ast.Expr) and _is_constant(docstring.value, str), where + ast.dump(docstring)
    assert _import_names(import_pytest) == ("pytest", None), where + ast.dump(import_pytest)
    module, helpers = _import_names(import_helpers)
    assert module == "opcheck.parametrize" and "grid" in helpers and set(helpers) <= set(HELPERS), where + ast.dump(
        import_helpers
    )
    assert _import_names(import_runtime) == ("opcheck.runtime", ("run_check",)), where + ast.dump(import_runtime)
    module, classes = _import_names(import_model)
    assert module == "opcheck.spec.model" and set(classes) <= set(MODEL_CLASSES), where + ast.dump(import_model)
    assert _is_assign(source, "SOURCE") and _is_constant(source.value, str), where + ast.dump(source)
    assert _is_assign(spec, "SPEC"), where + ast.dump(spec)
    assert _is_call_of(spec.value, {"OpSpec"}) and _is_model_value(spec.value, set(classes)), where + ast.dump(spec)
    rest = body[7:]
    marks = set()
    while rest and isinstance(rest[0], ast.Assign) and _is_rule_mark(rest[0], set(helpers)):
        marks.add(rest.pop(0).targets[0].id)
    has_table = bool(rest) and _is_assign(rest[0], "MARKED")
    if has_table:
        _check_marked(rest.pop(0), marks, where)
    assert rest, where + "no test functions"
    for function in rest:
        _check_test_function(function, has_table, where)


def _is_assign(node, name: str) -> bool:
    return isinstance(node, ast.Assign) and len(node.targets) == 1 and _is_name(node.targets[0], name)


def _is_rule_mark(node: ast.Assign, helpers: set[str]) -> bool:
    """`SKIP_0 = skip(SPEC.skips[0])` or `XFAIL_1 = xfail(SPEC.expected_failures[1])`."""
    call = node.value
    if not (
        len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and _is_call_of(call, helpers)
        and call.func.id in RULE_MARKS
        and len(call.args) == 1
        and not call.keywords
    ):
        return False
    prefix, field = RULE_MARKS[call.func.id]
    (arg,) = call.args
    return (
        isinstance(arg, ast.Subscript)
        and isinstance(arg.value, ast.Attribute)
        and arg.value.attr == field
        and _is_name(arg.value.value, "SPEC")
        and _is_constant(arg.slice, int)
        and node.targets[0].id == f"{prefix}_{arg.slice.value}"
    )


def _check_marked(node: ast.Assign, marks: set[str], where: str) -> None:
    table = node.value
    assert isinstance(table, ast.Dict) and table.keys, where + ast.dump(node)
    for key, value in zip(table.keys, table.values):
        # one mark, or a tuple of them where a rule's torch condition leaves more than one
        names = value.elts if isinstance(value, ast.Tuple) and len(value.elts) > 1 else [value]
        assert _is_constant(key, str) and all(isinstance(n, ast.Name) and n.id in marks for n in names), (
            where + ast.dump(node)
        )


def _check_test_function(node, has_table: bool, where: str) -> None:
    assert isinstance(node, ast.FunctionDef) and node.name.startswith("test_"), where + ast.dump(node)
    check = node.name.removeprefix("test_")
    args = node.args
    assert [a.arg for a in args.args] == list(PARAMS) and not (
        args.posonlyargs or args.vararg or args.kwonlyargs or args.kwarg or args.defaults or node.returns
    ), where + ast.dump(args)
    assert len(node.decorator_list) == 2, where + node.name
    marker, grid = node.decorator_list
    assert _is_pytest_attr(marker, "mark", check), where + ast.dump(marker)
    assert _is_call_of(grid, {"grid"}) and len(grid.args) == 2, where + ast.dump(grid)
    assert _is_name(grid.args[0], "SPEC") and _is_constant(grid.args[1], str) and grid.args[1].value == check, (
        where + ast.dump(grid)
    )
    keywords = {k.arg: k.value for k in grid.keywords}
    assert set(keywords) in ({"devices", "dtypes"}, {"devices", "dtypes", "marked"} if has_table else set()), (
        where + ast.dump(grid)
    )
    for axis in ("devices", "dtypes"):
        assert isinstance(keywords[axis], ast.Tuple) and all(_is_constant(e, str) for e in keywords[axis].elts), (
            where + ast.dump(grid)
        )
    assert "marked" not in keywords or _is_name(keywords["marked"], "MARKED"), where + ast.dump(grid)
    (statement,) = node.body
    call = statement.value if isinstance(statement, ast.Expr) else None
    assert _is_call_of(call, {"run_check"}) and not call.keywords and len(call.args) == 5, where + ast.dump(statement)
    assert _is_name(call.args[0], "SPEC") and _is_constant(call.args[1], str), where + ast.dump(call)
    assert call.args[1].value == check, where + ast.dump(call)
    assert [getattr(a, "id", None) for a in call.args[2:]] == list(PARAMS), where + ast.dump(call)


def _import_names(node) -> tuple:
    if isinstance(node, ast.Import) and len(node.names) == 1 and node.names[0].asname is None:
        return node.names[0].name, None
    if isinstance(node, ast.ImportFrom) and node.level == 0 and all(a.asname is None for a in node.names):
        return node.module, tuple(a.name for a in node.names)
    return None, None


def _is_constant(node, *types) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in types


def _is_name(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_call_of(node, names: set[str]) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names


def _is_model_value(node, classes: set[str]) -> bool:
    """Literals, tuples and lists of them, float('nan'/'inf'), SOURCE, and calls of the imported model classes."""
    if _is_constant(node, str, int, float, bool, type(None)) or _is_name(node, "SOURCE"):
        return True
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_is_model_value(e, classes) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _is_constant(node.operand, int, float) or _is_special_float(node.operand)
    if _is_special_float(node):
        return True
    if _is_call_of(node, classes):
        return all(_is_model_value(a, classes) for a in node.args) and all(
            k.arg is not None and _is_model_value(k.value, classes) for k in node.keywords
        )
    return False


def _is_special_float(node) -> bool:
    return (
        _is_call_of(node, {"float"})
        and not node.keywords
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in ("nan", "inf")
    )


def _is_pytest_attr(node, *attrs: str) -> bool:
    """`node` is pytest.<attrs[0]>.<attrs[1]>...; the last attribute may be any name if given as ''."""
    for attr in reversed(attrs):
        if not (isinstance(node, ast.Attribute) and (node.attr == attr or not attr)):
            return False
        node = node.value
    return _is_name(node, "pytest")


# ---- what evaluating a generated module may do ------------------------------------------------

_ALLOWED_CALLEES = {
    _pytest.mark.structures.MarkGenerator.__getattr__.__code__,  # pytest.mark.<name>
    _pytest.mark.structures.MarkDecorator.__call__.__code__,  # @-application of a mark
    *(getattr(opcheck.parametrize, name).__code__ for name in HELPERS),  # grid(...), skip(...), xfail(...)
    *(cls.__init__.__code__ for cls in MODEL_CLASSES.values()),
    opcheck.runtime.__getattr__.__code__,  # `from opcheck.runtime import run_check`: a lazy name (opcheck._lazy)
}
_ALLOWED_MODULES = ("pytest", "opcheck.parametrize", "opcheck.runtime", "opcheck.spec.model")


def evaluate_fenced(path: Path) -> dict:
    """Run the module's top level with only `float` as a builtin and imports limited to pytest and
    opcheck; fail on any import, call or name beyond what the generator writes."""
    imports: list[tuple] = []

    def fenced_import(name, globals=None, locals=None, fromlist=(), level=0):
        imports.append((name, tuple(fromlist or ()), level))
        if level or name not in _ALLOWED_MODULES:
            raise ImportError(f"{path}: a generated module imported {name!r}")
        return builtins.__import__(name, globals, locals, fromlist, level)

    code = compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    namespace = {"__builtins__": {"__import__": fenced_import, "float": float}, "__name__": "generated_module"}
    calls = _profile_calls(code, lambda: exec(code, namespace))  # noqa: S102 - fenced, and what is tested
    unexpected = [c for c in calls if c is not fenced_import.__code__ and c not in _ALLOWED_CALLEES]
    assert not unexpected, f"{path}: the module's top level called {unexpected}"
    assert [(n, lvl) for n, _, lvl in imports] == [(m, 0) for m in _ALLOWED_MODULES], f"{path}: imported {imports}"
    helpers, runtime, classes = (names for _, names, _ in imports[1:])
    assert set(helpers) <= set(HELPERS) and runtime == ("run_check",) and set(classes) <= set(MODEL_CLASSES), (
        f"{path}: imported {imports}"
    )
    functions = {k for k in namespace if k.startswith("test_")}
    marks = {k for k in namespace if re.fullmatch(r"(SKIP|XFAIL)_\d+", k)}
    table = {"MARKED"} & set(namespace)
    assert set(namespace) - functions - marks - table == {
        "__builtins__",
        "__name__",
        "__doc__",
        "pytest",
        *helpers,
        "run_check",
        *classes,
        "SOURCE",
        "SPEC",
    }, f"{path}: defined {sorted(namespace)}"
    assert isinstance(namespace["SPEC"], M.OpSpec)
    return namespace


def _profile_calls(code, run) -> list:
    """What the module's own code called while `run` ran: code objects of Python callees, builtin
    functions, and any code of the module itself other than its top level (a lambda or
    comprehension that ran)."""
    calls: list = []

    def profile(frame, event, arg):
        if event == "call":
            if frame.f_code is not code and frame.f_code.co_filename == code.co_filename:
                calls.append(f"{frame.f_code.co_name} defined in the module")
            elif frame.f_back is not None and frame.f_back.f_code is code:
                calls.append(frame.f_code)
        elif event == "c_call" and frame.f_code is code:
            calls.append(arg)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return calls


def _spec(**overrides) -> M.OpSpec:
    fields = dict(
        name="demo",
        op="torch.sin",
        source="op_specs/demo.yaml",
        sha256="0" * 64,
        samples=(M.Sample("small", args=(M.TensorArg(shape=(3,)),)),),
        devices=("cpu",),
    )
    fields.update(overrides)
    return M.OpSpec(**fields)
