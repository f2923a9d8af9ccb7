"""The experiment config: its fields, checks and files."""
