"""The Dash web app."""
