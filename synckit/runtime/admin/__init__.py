"""What operators do: tenants, bulk imports, the actions the CLI and the console share, the
status snapshot, audit counts."""
