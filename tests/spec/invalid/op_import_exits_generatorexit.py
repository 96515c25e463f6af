"""For op_import_exits.yaml: a module that raises GeneratorExit (a BaseException) while it is imported."""

raise GeneratorExit("closed")


def f(x):
    return x
