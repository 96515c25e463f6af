"""The shipped JSON Schema: valid, strict, documented for editors, and in step with the model."""

import json
import re
from pathlib import Path

from jsonschema import Draft202012Validator

from opcheck.spec import load_spec_text, model, schema_path
from opcheck.spec.validate import describe

SCHEMA = json.loads(schema_path().read_text(encoding="utf-8"))
DEFS = SCHEMA["$defs"]
FORMAT_MD = Path(model.__file__).with_name("FORMAT.md")


def _walk(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _deref(sub: dict) -> dict:
    while "$ref" in sub:
        sub = DEFS[sub["$ref"].rsplit("/", 1)[-1]]
    return sub


def test_schema_file_is_shipped_beside_the_loader_and_is_valid_2020_12():
    assert schema_path() == Path(model.__file__).with_name("op_spec.schema.json")
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(SCHEMA)


def test_every_mapping_with_fixed_keys_rejects_unknown_ones():
    fixed = [node for node in _walk(SCHEMA) if "properties" in node]
    assert len(fixed) >= 10
    assert all(node.get("additionalProperties") is False for node in fixed)


def test_every_key_is_documented_for_editors():
    undocumented = [
        key
        for node in _walk(SCHEMA)
        for key, sub in node.get("properties", {}).items()
        if "description" not in _deref(sub) and "description" not in sub
    ]
    assert undocumented == []


def test_single_op_family_entry_and_defaults_accept_the_same_keys():
    op_keys = set(DEFS["opSpec"]["properties"])
    assert set(DEFS["familyOp"]["properties"]) == op_keys
    assert set(DEFS["family"]["properties"]["defaults"]["properties"]) == op_keys - {"op", "name"}


def test_schema_choices_are_the_models():
    assert DEFS["dtypes"]["items"]["enum"] == list(model.GRAD_DTYPES)
    assert DEFS["lowprec_dtypes"]["items"]["enum"] == list(model.LOWPREC_DTYPES)
    assert DEFS["devices"]["items"]["enum"] == list(model.KNOWN_DEVICES)
    assert DEFS["tensor"]["properties"]["dtype"]["enum"] == list(model.TENSOR_DTYPES)
    assert DEFS["tensor"]["properties"]["maker"]["enum"] == list(model.MAKERS)
    where = DEFS["where"]["properties"]
    assert where["check"]["anyOf"][0]["enum"] == list(model.CHECKS)
    # YAML reads `true`/`false` as booleans; the builder lowercases them to the FastMode spellings.
    fast_mode = DEFS["gradcheckFlags"]["properties"]["fast_mode"]["enum"]
    assert [str(v).lower() for v in fast_mode] == list(model.FAST_MODES)
    # Every tensor key the schema accepts is a TensorArg field.
    assert set(DEFS["tensor"]["properties"]) == set(model.TensorArg.__dataclass_fields__)
    assert DEFS["tensor"]["properties"]["layout"]["enum"] == list(model.LAYOUTS)
    # ... and every flag a GradcheckFlags / GradgradcheckFlags field, each with the model's default.
    for name, cls in (("gradcheckFlags", model.GradcheckFlags), ("gradgradcheckFlags", model.GradgradcheckFlags)):
        props = DEFS[name]["properties"]
        assert set(props) == set(cls.__dataclass_fields__), name
        defaults = {key: sub["default"] for key, sub in props.items() if "default" in sub}
        assert defaults == {
            key: (True if value == "true" else False if value == "false" else value)
            for key, value in vars(cls()).items()
            if key in defaults
        }, name


def test_schema_keys_are_the_models_fields():
    # A key the schema accepts and the model has no field for would be dropped on the way to the
    # generated module; a field with no key could never be set from a spec.
    spec_fields = set(model.OpSpec.__dataclass_fields__) - {"source", "sha256", "location"}
    assert set(DEFS["opSpec"]["properties"]) == spec_fields
    rule = DEFS["toleranceRule"]["properties"]
    assert set(rule) == set(model.ToleranceRule.__dataclass_fields__) - {"location"}
    assert rule["criterion"]["enum"] == list(model.LOWPREC_CRITERIA)
    assert (rule["factor"]["exclusiveMinimum"], rule["floor"]["minimum"]) == (0, 0)
    switches = DEFS["reducedPrecision"]["properties"]
    assert {key: sub["default"] for key, sub in switches.items()} == vars(model.ReducedPrecision())
    assert DEFS["clone_inputs"]["default"] is model.OpSpec.__dataclass_fields__["clone_inputs"].default is False


def test_sparse_tensor_keys_default_and_range_as_the_model_says():
    tensor = DEFS["tensor"]["properties"]
    arg = model.TensorArg(shape=(1,))
    assert tensor["layout"]["default"] == arg.layout == model.STRIDED
    assert tensor["dense_dim"]["default"] == arg.dense_dim == 0
    assert (tensor["density"]["exclusiveMinimum"], tensor["density"]["maximum"]) == (0, 1)
    assert tensor["blocksize"]["minItems"] == tensor["blocksize"]["maxItems"] == 2
    assert tensor["dense_dim"]["maximum"] == model.MAX_TENSOR_RANK
    assert tensor["nnz"]["maximum"] == model.MAX_TENSOR_ELEMENTS
    assert str(model.DEFAULT_DENSITY) in tensor["density"]["description"]


def test_format_reference_examples_load():
    blocks = re.findall(r"```yaml\n(.*?)```", FORMAT_MD.read_text(encoding="utf-8"), flags=re.S)
    specs = [block for block in blocks if "op:" in block]
    assert len(specs) == 4
    loaded = [load_spec_text(block, source="FORMAT.md") for block in specs]
    assert [[s.name for s in specs] for specs in loaded] == [["softmax"], ["cdist"], ["to_dense"], ["sin", "cos"]]
    assert loaded[1][0].expected_failures[0].where.torch == "<2.14"
    sparse = loaded[2][0]
    assert sparse.gradcheck.masked and {a.layout for s in sparse.samples for a in s.args} == {
        "sparse_coo",
        "sparse_csc",
        "sparse_bsr",
    }


def test_described_expectations_read_as_english():
    assert describe(DEFS["tensor"]["properties"]["shape"]) == "a list of non-negative integers"
    assert describe({"type": "number", "exclusiveMinimum": 0}) == "a positive number"
    assert describe(DEFS["samples"]) == "a list of samples"
    assert describe({"enum": ["a", True]}) == "one of a, true"


def test_format_md_lists_the_models_choices():
    text = FORMAT_MD.read_text(encoding="utf-8")

    def listed(names):
        return ", ".join(f"`{n}`" for n in names)

    assert f"| `dtypes` | list of {listed(model.GRAD_DTYPES)} |" in text
    assert f"| `lowprec_dtypes` | list of {listed(model.LOWPREC_DTYPES)} |" in text
    assert f"| `devices` | list of {listed(model.KNOWN_DEVICES)} |" in text
    assert "`fast_mode` (" + "\\|".join(f"`{n}`" for n in model.FAST_MODES) + ", default `auto`)" in text
    checks = re.search(r"Checks are (.*?)\. ", " ".join(text.split()))
    assert checks is not None and checks[1] == ", ".join(f"`{c}`" for c in model.CHECKS)
    assert "| `criterion` | " + " \\| ".join(f"`{c}`" for c in model.LOWPREC_CRITERIA) + " |" in text


def test_format_md_documents_every_key_and_rule_key():
    text = FORMAT_MD.read_text(encoding="utf-8")
    for key in DEFS["opSpec"]["properties"]:
        assert f"\n| `{key}` | " in text, key
    for key in DEFS["toleranceRule"]["properties"]:
        assert re.search(rf"\n\| [^|]*`{key}`[^|]* \| ", text), key
    for key in DEFS["reducedPrecision"]["properties"]:
        assert f"\n| `{key}` | false | " in text, key
    assert "\n### The low-precision criterion\n" in text
