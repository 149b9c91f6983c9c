"""The Agents SDK's own examples, run in-process and on FleetRunner with a scripted model."""
