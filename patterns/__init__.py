"""corps.patterns."""
