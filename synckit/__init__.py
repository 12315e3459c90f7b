"""synckit."""
