"""toolfleet."""
