"""Shared test helpers: tiny generated corpora and models, brute-force enumeration, Triton checks."""
