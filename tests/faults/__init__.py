"""Fault tests: real `arona serve` processes while a PostgreSQL or Redis instance of
the test's own is stopped and restarted under load (marker ``faults``)."""
