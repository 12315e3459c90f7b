"""Records tables (the package writes ``record_tables``, ``record_landings`` and the
records tables themselves): their declarations as tables and their upgrade
(:mod:`.schema`), the change sequences and a page's statements (:mod:`.statements`), and
reads of rows and changes (:mod:`.reads`)."""
