"""Example connectors built on synckit."""
