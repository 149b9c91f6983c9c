"""The package as a user installs it: the wheel, built and installed into fresh virtualenvs."""
