"""Loop indices as compiled Triton makes them.

Compiled Triton's `for i in range(...)` / `tl.range(...)` gives a tensor (int32, or int64 past
int32's range), so kernels write `i.to(tl.int64)` or `i * stride` with tensor arithmetic. The
interpreter runs the loop in Python, where `i` is an int ("'int' object has no attribute 'to'").
The patch rewrites those loops, as the interpreter already rewrites assignments, so that each
index becomes a Triton tensor. `tl.static_range` stays a Python int: compiled, its index is a
compile-time constant too.
"""

from __future__ import annotations

import ast

from opcheck.triton._patch import Patch, is_patched, mark, parameters, require

INDICES = "_opcheck_loop_indices"
BOUND = "_opcheck_loop_bound"
"""The names the rewritten loops call; the interpreter puts its module's names into a kernel's globals."""


def _is_range(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "range") or (
        isinstance(func, ast.Attribute) and func.attr == "range"
    )


def _call(name: str, arg: ast.expr) -> ast.expr:
    return ast.copy_location(ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=[arg], keywords=[]), arg)


def _bound(value):
    """A loop bound as an int: a kernel's int arguments are Triton scalars under the interpreter,
    which triton 3.2's cannot turn into Python ints with numpy 2 ("only 0-dimensional arrays")."""
    handle = getattr(value, "handle", None)
    data = getattr(handle, "data", None)
    if data is None or getattr(data, "size", 0) != 1:
        return value
    return int(data.reshape(()).item())


def _visit_for(original):
    def visit_For(self, node):
        node = original(self, node) if original is not None else self.generic_visit(node)
        if isinstance(node, ast.For) and _is_range(node.iter):
            assert isinstance(node.iter, ast.Call)  # for the type checker: _is_range says so
            node.iter.args = [_call(BOUND, arg) for arg in node.iter.args]
            node.iter = ast.copy_location(
                ast.Call(func=ast.Name(id=INDICES, ctx=ast.Load()), args=[node.iter], keywords=[]), node.iter
            )
        return node

    return mark(visit_For)


def _to_tensor(interpreter):
    """An int as the interpreter makes a Triton scalar of it, the way its rewritten assignments do:
    `interpreter_semantic.to_tensor(x, False)` (triton >= 3.4), `semantic.to_tensor(x, builder, False)` before."""
    semantic = getattr(interpreter, "interpreter_semantic", None)
    if callable(getattr(semantic, "to_tensor", None)):
        return lambda i: semantic.to_tensor(i, False)
    import triton.language as tl

    legacy = getattr(getattr(tl, "semantic", None), "to_tensor", None)
    builder = getattr(interpreter, "interpreter_builder", None)
    require(
        legacy is not None and parameters(legacy)[:2] == ["x", "builder"] and builder is not None,
        "the interpreter has neither interpreter_semantic.to_tensor nor semantic.to_tensor(x, builder)",
    )
    return lambda i: legacy(i, builder, False)


def _apply() -> None:
    from triton.runtime import interpreter

    transformer = getattr(interpreter, "ASTTransformer", None)
    require(
        isinstance(transformer, type) and issubclass(transformer, ast.NodeTransformer),
        "the interpreter has no ASTTransformer rewriting kernels",
    )
    to_tensor = _to_tensor(interpreter)
    assert transformer is not None  # for the type checker: the guard above raised otherwise
    own = transformer.__dict__.get("visit_For")
    if own is not None and is_patched(own):
        return

    def loop_indices(indices):
        for i in indices:
            yield to_tensor(i)

    setattr(interpreter, INDICES, loop_indices)
    setattr(interpreter, BOUND, _bound)
    transformer.visit_For = _visit_for(own)


PATCHES = (
    Patch(
        "loop indices",
        "`for i in range(...)` and `tl.range(...)` give Triton tensors, as compiled (`i.to(tl.int64)` works); "
        "the interpreter gave Python ints",
        _apply,
    ),
)
