"""The site operator's policy: rules (the ``[policy]`` table), guard (every request checked),
approval (of an experiment), lifetime (ε per dataset across runs), records (private files)."""
