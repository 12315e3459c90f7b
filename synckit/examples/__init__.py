"""Examples shipped with synckit; ``synckit demo`` runs ``graph_mail``."""
