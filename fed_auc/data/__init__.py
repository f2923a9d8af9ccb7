"""Data sources, batch sampling and (later) partitioners and data cards."""

from fed_auc.data.base import SiteData, Split

__all__ = ["SiteData", "Split"]
