"""Rendering only: Jinja templates, CSS, matplotlib figures and HTML -> PDF. Computes nothing scientific."""
