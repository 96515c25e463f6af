"""What a failure says: torch's own first lines (torch_words.py, from the installed torch, with the
crafted functions that provoke them in torch_provocations.py), then where the mismatch is
(diagnostics.py) and what its pattern suggests (hints.py, pattern_hints.py)."""
