"""Usage: the records of metered calls (entries, the batched writer, the Redis
write-ahead stream), and reading them back (filters, pages, totals and spend)."""
