"""The plugin pins an xdist worker to its GPU in pytest_configure (opcheck.runtime.gpu_workers)."""

import textwrap

import pytest


@pytest.mark.parametrize("worker, seen", [("gw0", "GPU-a"), ("gw1", "GPU-b"), ("gw2", "GPU-a")])
def test_a_worker_sees_only_its_gpu(pytester, monkeypatch, worker, seen):
    pytester.makepyfile(
        test_seen=textwrap.dedent(
            f"""
            import os

            def test_sees():
                assert os.environ["CUDA_VISIBLE_DEVICES"] == {seen!r}
            """
        )
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.delenv("OPCHECK_PIN_GPUS", raising=False)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--opcheck-isolation", "off").assert_outcomes(passed=1)


def test_outside_xdist_nothing_changes(pytester, monkeypatch):
    pytester.makepyfile(
        test_seen="import os\n\ndef test_sees():\n    assert os.environ['CUDA_VISIBLE_DEVICES'] == 'GPU-a,GPU-b'\n"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
