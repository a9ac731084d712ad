"""The dashboard's pages: each a ``layout(view, views)`` and a ``register(app, views)`` of its callbacks."""
