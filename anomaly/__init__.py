"""Localization of faulty ranks, NICs and links; counter search; health checks."""
