"""Measuring workflows: input sets with exact answers (`inputs`), task scores
(`scoring`) and their paired significance (`significance`), scores per
configuration (`evaluate`), fidelity of choreography to the baseline (`fidelity`)
and distilling a LoRA adapter that closes the gap (`distill`). Imports the
patterns, never the CLI.
"""
