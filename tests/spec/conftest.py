import sys
from pathlib import Path

# opcheck_spec_fixture.py (a user's module that specs name as `module:attribute`) sits beside
# these tests; make it importable without turning tests/ into a package.
sys.path.insert(0, str(Path(__file__).parent))
