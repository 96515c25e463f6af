import sys
from pathlib import Path

# mutants.py (the ops the specs in specs/ point at, `mutants:Name.apply`) sits beside the tests;
# make it importable whatever pytest's import mode is, without turning tests/ into a package.
sys.path.insert(0, str(Path(__file__).parent))
