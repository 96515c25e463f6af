"""`BLOCK: tl.constexpr` in a module with `from __future__ import annotations`, as compiled Triton reads it.

There the annotation is the string "tl.constexpr". Compiled Triton takes any annotation naming
constexpr as one; triton 3.1's interpreter takes only the exact "constexpr", so it hands such an
argument to the kernel as a Triton tensor ("arange's arguments must be of type tl.constexpr").
triton 3.2's has the same reader, but compiles each kernel again from its source (annotations
evaluated then), so only a kernel it does not rewrite meets it. Later interpreters read
"tl.constexpr" themselves (their annotation reader drops the "tl."), and nothing is patched there.
"""

from __future__ import annotations

from opcheck.triton._patch import Patch, is_patched, mark, parameters, require, source_of


def _names_constexpr(annotation: object) -> bool:
    """Whether an annotation names tl.constexpr as compiled Triton 3.1 decides it (`"constexpr" in` it)."""
    return isinstance(annotation, str) and "constexpr" in annotation


def _init(original):
    def __init__(self, fn, arg_names, grid, *rest, **kwargs):
        original(self, fn, arg_names, grid, *rest, **kwargs)
        annotations = getattr(fn, "__annotations__", {}) or {}
        named = [name for name in arg_names if _names_constexpr(annotations.get(name))]
        self.constexprs = list(self.constexprs) + [name for name in named if name not in self.constexprs]

    return mark(__init__, wraps=original)


def _apply() -> None:
    from triton.runtime import interpreter, jit

    executor = getattr(interpreter, "GridExecutor", None)
    require(isinstance(executor, type), "the interpreter has no GridExecutor")
    normalize = getattr(jit, "_normalize_ty", None)
    if callable(normalize) and normalize("tl.constexpr") == "constexpr":
        return  # this interpreter reads the string itself
    init = executor.__init__  # type: ignore[misc]
    if is_patched(init):
        return
    require(parameters(init)[:4] == ["self", "fn", "arg_names", "grid"], "GridExecutor(fn, arg_names, grid) changed")
    source = source_of(init)
    require("self.constexprs" in source, "GridExecutor.__init__ sets no constexprs")
    executor.__init__ = _init(init)  # type: ignore[misc]


PATCHES = (
    Patch(
        "constexpr annotations",
        'a kernel parameter annotated "tl.constexpr" as a string (`from __future__ import annotations`) is a '
        "constexpr, as compiled; triton 3.1's interpreter passed it as a tensor",
        _apply,
    ),
)
