"""torch's two modes, as opcheck computes them: the full check (every Jacobian entry, torch's slow
mode: full.py) and the fast check (vᵀ J u for random u and v, torch's fast mode: fast.py)."""
