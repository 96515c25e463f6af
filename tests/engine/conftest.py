import sys
from pathlib import Path

# corpus.py sits beside the engine tests; make it importable whatever pytest's import mode is,
# without turning tests/ into a package.
sys.path.insert(0, str(Path(__file__).parent))
