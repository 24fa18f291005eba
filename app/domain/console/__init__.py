"""The web console of project owners (HTML pages, HTMX fragments)."""
