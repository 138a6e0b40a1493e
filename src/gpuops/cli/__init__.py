"""typer commands, one module per group: parse, call the core, render. Nothing else."""
