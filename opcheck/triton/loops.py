"""Loop indices as compiled Triton makes them.

Compiled Triton's `for i in range(...)` / `tl.range(...)` gives a tensor (int32, or int64 past
int32's range), so kernels write `i.to(tl.int64)` or `i * stride` with tensor arithmetic. The
interpreter runs the loop in Python, where `i` is an int ("'int' object has no attribute 'to'").
The patch rewrites those loops, as the interpreter already rewrites assignments, so that each
index becomes a Triton tensor. `tl.static_range` stays a Python int: compiled, its index is a
compile-time constant too.

triton 3.1's interpreter rewrites nothing: it runs a kernel's own Python function. There the patch
compiles each interpreted function again from its source with the loops rewritten (same file and
line numbers, same globals); a function it cannot read or that closes over local variables runs as
it was.
"""

from __future__ import annotations

import ast

from opcheck.triton._patch import Patch, is_patched, mark, parameters, require, source_of

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
    `interpreter_semantic.to_tensor(x, False)` (triton >= 3.4), `semantic.to_tensor(x, builder, False)` before,
    `core._to_tensor(x, builder)` in triton 3.1."""
    semantic = getattr(interpreter, "interpreter_semantic", None)
    if callable(getattr(semantic, "to_tensor", None)):
        return lambda i: semantic.to_tensor(i, False)
    import triton.language as tl

    builder = getattr(interpreter, "interpreter_builder", None)
    require(builder is not None, "the interpreter has no interpreter_builder")
    legacy = getattr(getattr(tl, "semantic", None), "to_tensor", None)
    if legacy is not None and parameters(legacy)[:2] == ["x", "builder"]:
        return lambda i: legacy(i, builder, False)
    oldest = getattr(tl.core, "_to_tensor", None)
    require(
        oldest is not None and parameters(oldest) == ["x", "builder"],
        "the interpreter has neither interpreter_semantic.to_tensor, semantic.to_tensor(x, builder) "
        "nor core._to_tensor(x, builder)",
    )
    return lambda i: oldest(i, builder)


def _indices(to_tensor):
    def loop_indices(indices):
        for i in indices:
            yield to_tensor(i)

    return loop_indices


def _apply() -> None:
    from triton.runtime import interpreter

    transformer = getattr(interpreter, "ASTTransformer", None)
    if transformer is None:
        _apply_by_recompiling(interpreter)
        return
    require(
        isinstance(transformer, type) and issubclass(transformer, ast.NodeTransformer),
        "the interpreter's ASTTransformer is not an ast.NodeTransformer",
    )
    to_tensor = _to_tensor(interpreter)
    own = transformer.__dict__.get("visit_For")
    if own is not None and is_patched(own):
        return
    setattr(interpreter, INDICES, _indices(to_tensor))
    setattr(interpreter, BOUND, _bound)
    transformer.visit_For = _visit_for(own)


# ------------------------------------------------------------------------------------ triton 3.1
class LoopRewriter(ast.NodeTransformer):
    """The loop rewrite alone, for an interpreter that has no rewriter of its own."""

    visit_For = _visit_for(None)


def _has_range_loop(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.For) and _is_range(node.iter) for node in ast.walk(tree))


def recompiled(fn, loop_indices, loop_bound):
    """`fn` compiled again from its source with its range loops rewritten; `fn` itself where it has
    none, or where its source cannot be read, or where it closes over local variables."""
    import inspect
    import textwrap

    code = getattr(fn, "__code__", None)
    if code is None or code.co_freevars:
        return fn
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return fn
    func = tree.body[0] if tree.body else None
    if not isinstance(func, ast.FunctionDef) or not _has_range_loop(func):
        return fn
    func.decorator_list = []
    LoopRewriter().visit(func)
    ast.increment_lineno(func, code.co_firstlineno - 1)
    # The rewritten loops' helpers reach the function as free variables of a factory, so that
    # nothing is added to the module's globals, which the function shares.
    factory = ast.parse(f"def _opcheck_make({INDICES}, {BOUND}):\n    return None\n").body[0]
    assert isinstance(factory, ast.FunctionDef)  # for the type checker: parsed just above
    factory.body = [func, ast.Return(value=ast.Name(id=func.name, ctx=ast.Load()))]
    module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
    made = {}
    exec(compile(module, code.co_filename, "exec", flags=_future_flags(code), dont_inherit=True), fn.__globals__, made)
    new = made["_opcheck_make"](loop_indices, loop_bound)
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    new.__defaults__, new.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    new.__wrapped__ = fn  # what undoing the patch puts back
    return new


def _future_flags(code) -> int:
    """The `from __future__` flags `code` was compiled with (annotations stay strings where they were)."""
    import __future__

    flags = 0
    for feature in __future__.all_feature_names:
        flag = getattr(__future__, feature).compiler_flag
        if code.co_flags & flag:
            flags |= flag
    return flags


def _recompiling(original, loop_indices):
    def __init__(self, fn, *args, **kwargs):
        original(self, fn, *args, **kwargs)
        self.fn = recompiled(fn, loop_indices, _bound)

    return mark(__init__, wraps=original)


def _apply_by_recompiling(interpreter) -> None:
    function = getattr(interpreter, "InterpretedFunction", None)
    require(isinstance(function, type), "the interpreter has neither an ASTTransformer nor an InterpretedFunction")
    assert function is not None  # for the type checker: the guard above raised otherwise
    init = function.__init__
    if is_patched(init):
        return
    require(parameters(init)[:2] == ["self", "fn"], "InterpretedFunction(fn) changed")
    require("self.fn" in source_of(init), "InterpretedFunction.__init__ keeps no self.fn")
    function.__init__ = _recompiling(init, _indices(_to_tensor(interpreter)))


PATCHES = (
    Patch(
        "loop indices",
        "`for i in range(...)` and `tl.range(...)` give Triton tensors, as compiled (`i.to(tl.int64)` works); "
        "the interpreter gave Python ints",
        _apply,
    ),
)
