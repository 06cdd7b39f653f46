"""Reproduction of the FedAdamom paper's claims: `python -m benchmarks.paper.reproduce`."""
