"""Loading profiles and run specs into slurmkit.config's models: the search path, `extends:`, the
shipped profiles, YAML read through trust.open_config, --set overrides, precedence and one-line
errors. slurmkit.config itself is the pure data this fills in, and imports nothing outside itself."""
