"""corps.cli."""
