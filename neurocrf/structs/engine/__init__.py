"""The chain engine: exact inference over chains of states, with one module per backend."""
