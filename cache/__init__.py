"""corps.cache."""
