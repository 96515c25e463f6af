"""YAML op specs → the frozen OpSpec model (opcheck.spec.model); the only place that reads YAML.

    load_specs(paths, root=...)   every spec in files/directories, or SpecError with every problem
    load_spec_text(text, source=...)
    schema_path()                 the JSON Schema editors use (yaml-language-server)

The stages: yamlload (YAML → located nodes) → validate (JSON Schema) → build (model, with the
rules about each entry) → loader (the rules across specs, and one SpecError for everything).

These names are imported on first use: the model and the case ids (opcheck.spec.model,
opcheck.spec.case) need only the standard library, so the pytest plugin imports them in an
install without the suite's YAML and JSON Schema packages (`pip install opcheck`, the engine alone).
"""

from __future__ import annotations

from opcheck._lazy import lazy_names

_NAMES = {
    "load_spec_text": "opcheck.spec.loader",
    "load_specs": "opcheck.spec.loader",
    "Problem": "opcheck.spec.problems",
    "SpecError": "opcheck.spec.problems",
    "schema_path": "opcheck.spec.validate",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
