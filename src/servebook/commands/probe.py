"""`servebook probe`: placeholder, filled in by its owner."""
