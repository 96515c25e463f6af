"""What a generated test will cost, before it runs (`opcheck list --cost`).

One probe of each sample times the op's forward, backward and the batched calls the engine may
make (probe.py, samples.py shares them between checks); a plan is the engine's own check of a
stand-in of the op with the test's flags, its evaluations counted (standin.py, plan.py); estimate.py
prices the plan in
seconds and report.py prints it with what to change for the costly tests.
"""
