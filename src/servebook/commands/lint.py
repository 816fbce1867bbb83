"""`servebook lint`: placeholder, filled in by its owner."""
