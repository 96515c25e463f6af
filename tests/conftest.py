# pytester runs generated modules and the plugin in-process (tests/codegen, tests/plugin).
pytest_plugins = ["pytester"]
