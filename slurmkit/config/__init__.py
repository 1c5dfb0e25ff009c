"""Configuration: cluster profiles, run specs, --set overrides and their loading."""
