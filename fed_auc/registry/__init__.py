"""Exported models: write (``export``), load (``load``), copy into the registry (``register``) and
describe (``card``).
"""
