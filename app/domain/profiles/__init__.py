"""Model profiles: the admin API, each project's choice, the runtime catalog and the
resolver the runtime chat uses (``catalog.ProfileCatalog``)."""
