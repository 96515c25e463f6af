"""`imports:` modules imported before the op is resolved: the code that registers a `torch.ops.*`
operator. Read into the model, imported while validating (a failure is reported where the module
is listed, and the op is not reported again), rendered into generated modules, and imported by
the runtime before it resolves the op and the reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from opcheck.codegen import render_module
from opcheck.spec import SpecError
from opcheck.spec.loader import load_spec_text
from opcheck.spec.model import OpSpec
from opcheck.spec.oppath import OpPathError, resolve_op

SAMPLES = "samples: [{name: a, args: [{shape: [3]}]}]\n"

REGISTERS = """\
import torch

@torch.library.custom_op("{ns}::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@twice.register_fake
def _(x):
    return torch.empty_like(x)

twice.register_autograd(lambda ctx, g: g * 2)
"""


def _load(text: str) -> list[OpSpec]:
    return load_spec_text(text, source="op_specs/k.yaml")


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        _load(text)
    return [str(p) for p in info.value.problems]


@pytest.fixture
def registering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Makes `pkg_NAME.ops`, a module registering torch.ops.NAME.twice; importing it is what makes
    the operator appear (each test takes a namespace of its own: registration is process-wide)."""

    def make(ns: str, body: str = REGISTERS) -> str:
        package = tmp_path / f"pkg_{ns}"
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / "ops.py").write_text(body.format(ns=ns))
        monkeypatch.delitem(sys.modules, f"pkg_{ns}", raising=False)
        monkeypatch.delitem(sys.modules, f"pkg_{ns}.ops", raising=False)
        return f"pkg_{ns}.ops"

    monkeypatch.syspath_prepend(str(tmp_path))
    return make


def test_the_key_defaults_to_nothing_and_a_listed_module_registers_the_op(registering):
    (plain,) = _load(f"op: torch.sin\n{SAMPLES}")
    assert plain.imports == () == OpSpec.__dataclass_fields__["imports"].default
    module = registering("opcheck_imports_read")
    op = "torch.ops.opcheck_imports_read.twice"
    (spec,) = _load(f"op: {op}\nimports: [{module}]\n{SAMPLES}")
    assert spec.imports == (module,) and module in sys.modules
    assert resolve_op(op)(__import__("torch").ones(2)).tolist() == [2.0, 2.0]


def test_without_the_key_the_op_is_not_there_and_the_problem_names_the_key(registering):
    registering("opcheck_imports_missing")  # written, never imported
    (problem,) = _problems(f"op: torch.ops.opcheck_imports_missing.twice\n{SAMPLES}")
    assert problem.startswith("op_specs/k.yaml:1:5: op: 'torch.ops.opcheck_imports_missing' has no attribute 'twice'")
    assert "list that module in the spec's `imports:` (`imports: [mypkg.ops]`)" in problem


def test_resolve_op_imports_the_modules_first_in_order(registering):
    module = registering("opcheck_imports_resolve")
    op = "torch.ops.opcheck_imports_resolve.twice"
    with pytest.raises(OpPathError):
        resolve_op(op)
    assert callable(resolve_op(op, imports=("json", module)))
    with pytest.raises(OpPathError, match=r"cannot import module 'no_such_module_xyz', listed in `imports:`"):
        resolve_op("torch.sin", imports=("no_such_module_xyz",))


def test_a_module_that_does_not_import_is_reported_where_it_is_listed_and_only_there(registering):
    broken = registering("opcheck_imports_broken", "raise RuntimeError('no kernel for this GPU')\n")
    text = f"op: torch.ops.opcheck_imports_broken.twice\nimports: [json, no_such_module_xyz, {broken}]\n{SAMPLES}"
    (problem,) = _problems(text)
    assert problem.startswith(
        "op_specs/k.yaml:2:17: imports[1]: cannot import module 'no_such_module_xyz', listed in `imports:` "
        "(while resolving 'torch.ops.opcheck_imports_broken.twice'): No module named 'no_such_module_xyz'"
    )
    (problem,) = _problems(f"op: torch.ops.opcheck_imports_broken.twice\nimports: [{broken}]\n{SAMPLES}")
    assert problem == (
        f"op_specs/k.yaml:2:11: imports[0]: importing '{broken}' failed: RuntimeError: no kernel for this GPU"
    )


def test_names_that_are_not_dotted_module_names_are_problems_where_they_are_written():
    expected = "expected a dotted module name ('triton', 'triton.language'), got"
    assert _problems(f"op: torch.sin\nimports: [json, js-on, json]\n{SAMPLES}") == [
        f"op_specs/k.yaml:2:17: imports[1]: {expected} 'js-on'",
        "op_specs/k.yaml:2:24: imports[2]: 'json' is listed twice (first at 2:11)",
    ]


def test_family_defaults_give_every_op_the_modules(registering):
    module = registering("opcheck_imports_family")
    text = (
        f"defaults:\n  imports: [{module}]\n  {SAMPLES}ops:\n"
        "  - op: torch.ops.opcheck_imports_family.twice\n  - op: torch.sin\n    imports: []\n"
    )
    first, second = _load(text)
    assert first.imports == (module,) and second.imports == ()


def test_generated_modules_carry_the_key_and_the_runtime_imports_it(registering):
    module = registering("opcheck_imports_runtime")
    op = "torch.ops.opcheck_imports_runtime.twice"
    (spec,) = _load(f"op: {op}\nimports: [{module}]\ngradgradcheck: {{enabled: false}}\n{SAMPLES}")
    assert f'    imports=("{module}",),\n' in render_module(spec)
    from opcheck.runtime import run_check
    from opcheck.runtime.samples import op_callable

    del sys.modules[module]  # as in a fresh process: the runtime imports it again
    assert op_callable(spec) is resolve_op(op)
    run_check(spec, "gradcheck", "cpu", "float64", "a")
