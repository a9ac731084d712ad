"""The dashboard's pages: each run page a ``layout(view, views)`` and a ``register(app, views)`` of
its callbacks; the Health page a ``layout(health)`` and a ``register(app, health)``."""
