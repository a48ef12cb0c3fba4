"""corps.agents."""
