"""Device selection, distributed backend map, pod env contract, copy engine. Imports nothing above it."""
