"""Plumbing shared by the HTML faces of Arona (the console and the admin dashboard):
cookie sessions, CSRF, rendering full pages or HTMX fragments, toasts."""
