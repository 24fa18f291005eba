"""The shared routing service: framework-free (no Litestar, no SQL).

It learns about backends, aliases and pins through the small interfaces it is handed
(a ``BackendRegistry``, an ``AliasTable``, a ``StateStore``, an ``EventBus``) and is
unit-testable without a web server or a database.
"""
