"""YAML op specs → the frozen OpSpec model (opcheck.spec.model); the only place that reads YAML.

    load_specs(paths, root=...)   every spec in files/directories, or SpecError with every problem
    load_spec_text(text, source=...)
    schema_path()                 the JSON Schema editors use (yaml-language-server)

The stages: yamlload (YAML → located nodes) → validate (JSON Schema) → build (model, with the
rules about each entry) → loader (the rules across specs, and one SpecError for everything).
"""

from opcheck.spec.loader import load_spec_text, load_specs
from opcheck.spec.problems import Problem, SpecError
from opcheck.spec.validate import schema_path

__all__ = ["Problem", "SpecError", "load_spec_text", "load_specs", "schema_path"]
