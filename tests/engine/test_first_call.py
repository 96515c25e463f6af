"""The engine's first call in a process: torch's forward-AD decompositions (TorchScript, about 0.2 s)
are loaded only by a check of forward AD, as torch's gradcheck loads them."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys, torch, opcheck
loaded = lambda: "torch._decomp.decompositions_for_jvp" in sys.modules
x = torch.randn(300, dtype=torch.float64, requires_grad=True)  # beyond the full Jacobian: forward-AD projections
opcheck.gradcheck(torch.sin, (x,), fast_mode="auto")
opcheck.gradgradcheck(torch.sin, (x[:20],), fast_mode="auto")
print(loaded())
opcheck.gradcheck(torch.sin, (x,), fast_mode="auto", check_forward_ad=True)
print(loaded())
"""


def test_only_a_check_of_forward_ad_loads_torch_s_forward_ad_decompositions():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
