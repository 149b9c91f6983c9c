"""reconciler."""
