"""Where `opcheck capture` writes: into an existing spec of the op (every byte of the user's text
kept), beside another op's spec of the same file name, and nowhere outside --specs; and the text
positions of opcheck.capture.write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from opcheck.capture import write
from opcheck.spec import load_specs
from tests.capture import scratch
from tests.capture.scratch import project, shown

GELU_TWO_SHAPES = """
    import torch
    import torch.nn.functional as F

    x = torch.randn(4, 7)
    for _ in range(3):
        F.gelu(x)
    F.gelu(torch.randn(2, 13, 96))
"""

GELU_ONE_SHAPE = """
    import torch
    import torch.nn.functional as F

    F.gelu(torch.arange(28, dtype=torch.float32).reshape(4, 7) / 10 - 1)
"""


def capture(tmp: Path, command: list[str], *options: str):
    return scratch.capture(tmp, ["torch.nn.functional.gelu"], command, *options)


def names(tmp: Path, specs: str = "op_specs") -> dict[str, list[str]]:
    """Each loaded spec's sample names, by spec name."""
    return {s.name: [x.name for x in s.samples] for s in load_specs([tmp / specs], root=tmp)}


# ------------------------------------------------------------------------------ into an existing spec
HAND_WRITTEN = """\
# My hand-written gelu spec.
op: torch.nn.functional.gelu
dtypes: [float64]
samples:
  # a small one
  - name: small
    args: [{shape: [2, 3]}]
  - name: wide
    args:
      - shape: [2, 300]
        low: -1.0
        high: 1.0
    kwargs: {approximate: tanh}

# looser on the gradient check
tolerances:
  - where: {check: gradcheck}
    atol: 1.0e-6
"""


def test_new_samples_go_at_the_end_of_the_samples_list_and_every_line_stays(tmp_path):
    tmp = project(tmp_path, {"model.py": GELU_TWO_SHAPES, "op_specs/gelu.yaml": HAND_WRITTEN})
    result = capture(tmp, ["python", "model.py"])
    assert result.returncode == 0, shown(result)
    assert "added to op_specs/gelu.yaml: 4x7, 2x13x96" in result.stdout

    before = HAND_WRITTEN.splitlines()
    after = (tmp / "op_specs" / "gelu.yaml").read_text(encoding="utf-8").splitlines()
    at = before.index("    kwargs: {approximate: tanh}") + 1  # the end of the last sample's item
    inserted = len(after) - len(before)
    assert inserted > 0
    assert after[:at] == before[:at]
    assert after[at + inserted :] == before[at:]  # the blank line, the comment, tolerances: as they were
    new = after[at : at + inserted]
    assert [line for line in new if line.lstrip().startswith("- name:")] == ["  - name: 4x7", "  - name: 2x13x96"]
    assert all(line.startswith("  ") for line in new)

    assert names(tmp) == {"gelu": ["small", "wide", "4x7", "2x13x96"]}
    (spec,) = load_specs([tmp / "op_specs"], root=tmp)
    assert len(spec.tolerances) == 1


FORCE_SPEC = """\
op: torch.nn.functional.gelu
samples:
  - name: small
    args: [{shape: [2, 3]}]
  # mine, by hand
  - name: 4x7
    args:
      - shape: [4, 7]
        low: -1.0
        high: 1.0
  # the user's note on other
  - name: other
    args: [{shape: [5]}]
dtypes: [float64]
"""


def test_a_sample_of_the_same_name_is_kept_without_force_and_replaced_with_it(tmp_path):
    tmp = project(tmp_path, {"one.py": GELU_ONE_SHAPE, "op_specs/gelu.yaml": FORCE_SPEC})
    spec = tmp / "op_specs" / "gelu.yaml"

    kept = capture(tmp, ["python", "one.py"])
    assert kept.returncode == 1, shown(kept)  # its only sample was the user's already
    assert "not written: 4x7: the spec has a sample of that name; kept yours (--force replaces it)" in kept.stdout
    assert "nothing written" in kept.stdout
    assert spec.read_text(encoding="utf-8") == FORCE_SPEC

    forced = capture(tmp, ["python", "one.py"], "--force")
    assert forced.returncode == 0, shown(forced)
    text = spec.read_text(encoding="utf-8")
    head = FORCE_SPEC[: FORCE_SPEC.index("  - name: 4x7")]  # up to the item, its comment too
    tail = FORCE_SPEC[FORCE_SPEC.index("  # the user's note on other") :]  # the next item's comment on
    assert text.startswith(head) and text.endswith(tail), text
    item = text[len(head) : len(text) - len(tail)]
    assert "  - name: 4x7\n" in item
    assert "{shape: [4, 7], low: -1.0, high: 1.8}" in item  # the run's range: arange(28) / 10 - 1
    assert "low: -1.0\n" not in item  # the hand-written block is gone
    assert names(tmp) == {"gelu": ["small", "4x7", "other"]}

    again = capture(tmp, ["python", "one.py"], "--force")
    assert again.returncode == 0, shown(again)
    assert spec.read_text(encoding="utf-8") == text  # capture's own comments are replaced, not stacked


def test_a_flow_samples_list_is_refused_and_left_alone(tmp_path):
    flow = "op: torch.nn.functional.gelu\nsamples: [{name: a, args: [{shape: [2]}]}]\n"
    tmp = project(tmp_path, {"model.py": GELU_TWO_SHAPES, "op_specs/gelu.yaml": flow})
    result = capture(tmp, ["python", "model.py"])
    assert result.returncode == 1, shown(result)
    assert "op_specs/gelu.yaml:2: `samples:` is a flow list" in result.stdout
    assert "Traceback" not in result.stderr
    assert (tmp / "op_specs" / "gelu.yaml").read_bytes() == flow.encode()
    assert sorted(p.name for p in (tmp / "op_specs").iterdir()) == ["gelu.yaml"]


def test_a_file_name_taken_by_another_ops_spec_gets_a_new_name(tmp_path):
    other = "op: torch.nn.functional.silu\nsamples:\n  - name: a\n    args: [{shape: [2]}]\n"
    tmp = project(tmp_path, {"model.py": GELU_TWO_SHAPES, "op_specs/gelu.yaml": other})
    result = capture(tmp, ["python", "model.py"])
    assert result.returncode == 0, shown(result)
    assert (tmp / "op_specs" / "gelu.yaml").read_text(encoding="utf-8") == other
    (new,) = [p for p in (tmp / "op_specs").glob("*.yaml") if p.name != "gelu.yaml"]
    assert new.stem.startswith("gelu_")
    data = yaml.safe_load(new.read_text(encoding="utf-8"))
    assert data["op"] == "torch.nn.functional.gelu"
    assert data["name"] == new.stem  # the test module is test_<name>.py: name and file agree
    assert f"wrote op_specs/{new.name}: 4x7, 2x13x96" in result.stdout
    assert names(tmp) == {"silu": ["a"], new.stem: ["4x7", "2x13x96"]}


# ------------------------------------------------------------------------------ nothing hidden
def test_a_failing_command_s_calls_are_written_and_its_status_is_capture_s(tmp_path):
    failing = GELU_ONE_SHAPE + "    raise SystemExit(3)\n"
    tmp = project(tmp_path, {"fails.py": failing})
    result = capture(tmp, ["python", "fails.py"])
    assert result.returncode == 3, shown(result)
    assert "wrote op_specs/gelu.yaml: 4x7" in result.stdout
    assert "exit status 3: the command failed (status 3); the calls it made before are written above" in result.stdout
    assert names(tmp) == {"gelu": ["4x7"]}


def test_a_spec_capture_cannot_write_makes_its_status_non_zero(tmp_path):
    # gelu's spec cannot be extended (a flow list); silu's is written: exit 1, and both are said.
    flow = "op: torch.nn.functional.gelu\nsamples: [{name: a, args: [{shape: [2]}]}]\n"
    model = GELU_ONE_SHAPE + "    F.silu(torch.randn(3))\n"
    tmp = project(tmp_path, {"model.py": model, "op_specs/gelu.yaml": flow})
    result = scratch.capture(tmp, ["torch.nn.functional.gelu", "torch.nn.functional.silu"], ["python", "model.py"])
    assert result.returncode == 1, shown(result)
    assert "wrote op_specs/silu.yaml: 3" in result.stdout
    assert "exit status 1: the spec of torch.nn.functional.gelu could not be written (above)" in result.stdout


def test_a_malformed_spec_stops_capture_before_the_command_runs_and_nothing_is_written(tmp_path):
    broken = "op: torch.nn.functional.gelu\nsamples:\n  - name: a\n    args: [{shape: [2]}\n"
    model = GELU_ONE_SHAPE + "    open('RAN', 'w').close()\n"
    tmp = project(tmp_path, {"model.py": model, "op_specs/gelu.yaml": broken})
    before = _tree(tmp)
    result = capture(tmp, ["python", "model.py"])
    assert result.returncode == 1, shown(result)
    assert "opcheck capture: op_specs/gelu.yaml:5:1: malformed YAML" in result.stderr, shown(result)
    assert "fix it first" in result.stderr and "Traceback" not in result.stderr
    assert _tree(tmp) == before  # no duplicate spec beside it, and the command never ran (no RAN)
    assert (tmp / "op_specs" / "gelu.yaml").read_text(encoding="utf-8") == broken


def test_a_read_only_spec_is_refused_and_left_as_it_is(tmp_path):
    tmp = project(tmp_path, {"one.py": GELU_ONE_SHAPE, "op_specs/gelu.yaml": HAND_WRITTEN})
    spec = tmp / "op_specs" / "gelu.yaml"
    spec.chmod(0o444)  # refused by its mode, for root too
    result = capture(tmp, ["python", "one.py"])
    assert result.returncode == 1, shown(result)
    assert "op_specs/gelu.yaml is read-only; capture does not replace it" in result.stdout
    assert spec.read_text(encoding="utf-8") == HAND_WRITTEN and oct(spec.stat().st_mode & 0o777) == "0o444"
    assert sorted(p.name for p in spec.parent.iterdir()) == ["gelu.yaml"]


def test_a_sample_equal_in_content_to_the_specs_own_is_dropped_with_a_note(tmp_path):
    # The run's one call renders as {shape: [4, 7], low: -1.0, high: 1.8}: the spec has it, named mine.
    same = "op: torch.nn.functional.gelu\nsamples:\n  - name: mine\n    args: [{shape: [4, 7], low: -1.0, high: 1.8}]\n"
    tmp = project(tmp_path, {"one.py": GELU_ONE_SHAPE, "op_specs/gelu.yaml": same})
    result = capture(tmp, ["python", "one.py"])
    assert result.returncode == 1, shown(result)
    assert "dropped: 4x7: the same sample as the spec's 'mine'" in result.stdout
    assert "nothing written" in result.stdout
    assert (tmp / "op_specs" / "gelu.yaml").read_text(encoding="utf-8") == same


def _tree(tmp: Path) -> set[str]:
    return {p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if "__pycache__" not in p.parts}


def test_nothing_is_written_through_a_link_out_of_the_specs_folder(tmp_path):
    tmp = project(tmp_path, {"vals.py": GELU_ONE_SHAPE})
    specs, outside = tmp / "where" / "specs", tmp / "outside"
    specs.mkdir(parents=True)
    outside.mkdir()
    (specs / "values").symlink_to(os.path.relpath(outside, specs), target_is_directory=True)
    before = _tree(tmp)
    result = capture(tmp, ["python", "vals.py"], "--specs", "where/specs", "--values")
    assert result.returncode == 1, shown(result)
    assert "lies outside the specs folder" in result.stdout
    assert "nothing written" in result.stdout
    assert list(outside.iterdir()) == []
    assert _tree(tmp) == before  # not the spec either: its values could not be written


# ------------------------------------------------------------------------------ write.py
INDENTED = """\
op: torch.sin
samples:
  # first
  - name: a
    args: [{shape: [2]}]

  # b's note
  - name: b
    args:
      - {shape: [3]}
# the next key's comment
dtypes: [float64]
"""

UNINDENTED = "op: torch.sin\nsamples:\n- name: a\n  args: [{shape: [2]}]\n- name: b\n  args: [{shape: [3]}]"


def test_find_samples_in_an_indented_list():
    found = write.find_samples(INDENTED, "x.yaml")
    assert found.indent == 2
    assert found.names == {"a", "b"}
    # Item b starts at its `- name:` line; a's ends before b's comment and the blank line.
    assert found.items == (("a", 3, 5), ("b", 7, 10))
    assert found.end == 10  # before the next key's comment


def test_find_samples_in_an_unindented_list_at_the_end_of_the_text():
    found = write.find_samples(UNINDENTED, "y.yaml")
    assert found.indent == 0
    assert found.items == (("a", 2, 4), ("b", 4, 6))
    assert found.end == 6


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("op: torch.sin\nsamples: [{name: a}]\n", "y.yaml:2: `samples:` is a flow list"),
        ("op: torch.sin\n", "y.yaml: no `samples:` list to add to"),
        ("op: torch.sin\nsamples: []\n", "y.yaml: no `samples:` list to add to"),
        ("- a\n- b\n", "y.yaml: not a spec"),
        ("op: [\n", "y.yaml: not readable YAML"),
    ],
    ids=["flow", "none", "empty", "list", "broken"],
)
def test_find_samples_refuses(text, says):
    with pytest.raises(write.WriteError) as e:
        write.find_samples(text, "y.yaml")
    assert str(e.value).startswith(says)


def test_extend_appends_after_the_last_item_and_before_the_next_keys_comment():
    found = write.find_samples(INDENTED, "x.yaml")
    out = write.extend(INDENTED, found, [("c", "  - name: c\n    args: [{shape: [4]}]\n")], {})
    lines = INDENTED.splitlines(keepends=True)
    assert out == "".join(lines[:10]) + "  - name: c\n    args: [{shape: [4]}]\n" + "".join(lines[10:])
    assert [s["name"] for s in yaml.safe_load(out)["samples"]] == ["a", "b", "c"]


def test_extend_adds_a_final_newline_before_appending_at_the_end():
    found = write.find_samples(UNINDENTED, "y.yaml")
    out = write.extend(UNINDENTED, found, [("c", "- name: c\n")], {})
    assert out == UNINDENTED + "\n- name: c\n"


def test_extend_replaces_an_item_and_keeps_the_next_items_comment():
    found = write.find_samples(INDENTED, "x.yaml")
    out = write.extend(INDENTED, found, [], {"a": "  - name: a\n    args: [{shape: [7]}]\n"})
    assert out == INDENTED.replace("args: [{shape: [2]}]", "args: [{shape: [7]}]")


def test_extend_replaces_and_appends_at_once():
    found = write.find_samples(INDENTED, "x.yaml")
    out = write.extend(INDENTED, found, [("c", "  - name: c\n")], {"b": "  - name: b\n"})
    expected = INDENTED.replace("  - name: b\n    args:\n      - {shape: [3]}\n", "  - name: b\n  - name: c\n")
    assert out == expected


def test_inside_follows_links(tmp_path):
    specs, outside = tmp_path / "specs", tmp_path / "outside"
    specs.mkdir()
    outside.mkdir()
    (specs / "link").symlink_to(outside, target_is_directory=True)
    assert write.inside(specs / "gelu.yaml", specs)
    assert write.inside(specs / "values" / "gelu" / "a.pt", specs)
    assert not write.inside(specs / "link" / "a.pt", specs)
    assert not write.inside(specs / ".." / "outside", specs)


def test_a_spec_with_windows_line_ends_keeps_them_and_gets_the_new_sample(tmp_path):
    crlf = "op: torch.nn.functional.gelu\r\nsamples:\r\n  - name: small\r\n    args: [{shape: [2, 3]}]\r\n"
    tmp = project(tmp_path, {"one.py": GELU_ONE_SHAPE})
    spec = tmp / "op_specs" / "gelu.yaml"
    spec.parent.mkdir()
    spec.write_bytes(crlf.encode())
    result = capture(tmp, ["python", "one.py"])
    assert result.returncode == 0, shown(result)
    data = spec.read_bytes()
    assert data.startswith(crlf.encode())  # the user's bytes, line ends and all
    assert names(tmp) == {"gelu": ["small", "4x7"]}
