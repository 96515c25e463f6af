"""What a generated test will cost, before it runs (`opcheck list --cost`).

One probe of each sample times the op's forward, backward and the batched calls the engine may
make (probe.py, samples.py shares them between checks); a plan follows the engine's decisions for
the test's flags and counts its evaluations (plan.py, model.py); estimate.py prices the plan in
seconds and report.py prints it with what to change for the costly tests.
"""
