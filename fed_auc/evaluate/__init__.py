"""Batch evaluation of a trained model: on files the caller holds (``local``) or at every node of a
federation (``job``).
"""
