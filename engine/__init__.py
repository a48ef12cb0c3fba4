"""corps.engine."""
