# The golden modules are data for test_generate.py (which also runs them through pytester), not
# part of this suite.
collect_ignore = ["golden"]
