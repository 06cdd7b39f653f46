"""Benchmarks and the paper reproduction (`benchmarks.paper`)."""
