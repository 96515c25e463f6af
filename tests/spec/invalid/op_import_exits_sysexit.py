"""For op_import_exits.yaml: a module that prints and exits while it is imported (as a script would)."""

import sys

print("usage: op_import_exits_sysexit [--help]")
sys.exit(3)


def f(x):
    return x
