"""Built-in tasks: `task: train` in a run spec."""
