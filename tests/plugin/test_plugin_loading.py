"""The plugin loaded the way an editable install loads it: pytest marks for assertion rewriting only
the entry point's module (an installed package's marks cover all its files), and the plugin's own
modules, which import one another, are rewritten without a warning."""

import os
from pathlib import Path

from tests import forked_python

REPO = Path(__file__).resolve().parents[2]


def test_the_plugin_loaded_by_its_module_alone_warns_of_nothing(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert 1\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "OPCHECK_"))}
    env |= {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(REPO)}
    # pytest's own rootdir: the scratch folder, no config; only the opcheck plugin, by its module
    args = ["-p", "opcheck.plugin", "-W", "error::pytest.PytestAssertRewriteWarning", "-p", "no:cacheprovider"]
    run = forked_python.run("pytest", *args, "test_one.py", cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 passed" in run.stdout and "warning" not in run.stdout.lower(), run.stdout
