"""The generate cache counts the values files the specs name: a changed file makes the next
`opcheck generate` validate again (its modules, which hold only the path, stay the same)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from opcheck.codegen import cache
from tests import forked_python

REPO = Path(__file__).resolve().parents[2]
SPEC = """\
op: torch.sin
devices: [cpu]
samples:
  - name: file
    args: [{shape: [3], values_file: values/v.pt}]
"""


def _project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "op_specs" / "values").mkdir(parents=True)
    (tmp_path / "op_specs" / "sin.yaml").write_text(SPEC)
    torch.save(torch.zeros(3), tmp_path / "op_specs" / "values" / "v.pt")
    return tmp_path


def test_the_cache_records_the_values_files_and_is_stale_when_one_changes(tmp_path):
    root = _project(tmp_path)
    specs, out, cache_file = root / "op_specs", root / "generated_tests", root / cache.CACHE_FILE
    assert cache.values_files(specs, root) == [root / "op_specs" / "values" / "v.pt"]
    cache.record(specs, out, "opcheck generate", cache_file, root=root)
    assert list(cache.snapshot(specs, out, "opcheck generate", root=root)["values"]) == ["op_specs/values/v.pt"]
    assert cache.is_fresh(specs, out, "opcheck generate", cache_file, root=root)
    torch.save(torch.ones(3), root / "op_specs" / "values" / "v.pt")
    assert not cache.is_fresh(specs, out, "opcheck generate", cache_file, root=root)
    cache.record(specs, out, "opcheck generate", cache_file, root=root)
    assert cache.is_fresh(specs, out, "opcheck generate", cache_file, root=root)
    os.remove(root / "op_specs" / "values" / "v.pt")
    assert not cache.is_fresh(specs, out, "opcheck generate", cache_file, root=root)


def test_a_cache_without_the_values_record_is_stale(tmp_path):
    root = _project(tmp_path)
    specs, out, cache_file = root / "op_specs", root / "generated_tests", root / cache.CACHE_FILE
    cache.record(specs, out, "opcheck generate", cache_file, root=root)
    text = cache_file.read_text()
    cache_file.write_text(text.replace('"values"', '"older"'))
    assert not cache.is_fresh(specs, out, "opcheck generate", cache_file, root=root)


def test_opcheck_generate_validates_again_after_a_values_file_changed(tmp_path):
    root = _project(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def generate():  # `python -m opcheck generate`, forked with torch imported (tests/forked_python.py)
        return forked_python.run("opcheck", "generate", cwd=root, env=env)

    first = generate()
    assert first.returncode == 0 and "1 written" in first.stdout, first.stdout + first.stderr
    again = generate()
    assert again.returncode == 0 and "unchanged since the last run" in again.stdout, again.stdout + again.stderr
    torch.save(torch.zeros(4), root / "op_specs" / "values" / "v.pt")  # no longer fits the spec
    changed = generate()
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert (
        "op_specs/sin.yaml:5:38: samples[0].args[0].values_file: values/v.pt: it has shape [4], but `shape` is [3]"
        in changed.stderr
    )
