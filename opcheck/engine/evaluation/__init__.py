"""The Jacobians a check compares: numerical (central differences, numerical.py) and analytical
(VJP rows and JVP columns through autograd, analytical.py), each batched where batching/ allows."""
