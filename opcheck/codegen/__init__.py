"""Model → generated pytest modules, written only when they change."""

from opcheck.codegen import cache
from opcheck.codegen.render import module_name, render_module
from opcheck.codegen.write import GenerationError, WritePlan, apply_plan, plan_generation, stale_diff
from opcheck.module_header import MARKER as GENERATED_MARKER

__all__ = [
    "GENERATED_MARKER",
    "cache",
    "GenerationError",
    "WritePlan",
    "apply_plan",
    "module_name",
    "plan_generation",
    "render_module",
    "stale_diff",
]
