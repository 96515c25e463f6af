"""Comparing Jacobians with torch's verdicts: one block (compare.py), complex inputs and outputs
as torch splits them (complex_views.py), and the parts of a call in torch's order (parts.py)."""
