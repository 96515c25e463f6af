"""For op_import_exits.yaml: a module whose own code raises KeyboardInterrupt while it is imported."""

raise KeyboardInterrupt


def f(x):
    return x
