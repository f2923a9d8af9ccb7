"""Charts that stay readable from 3 to 64 sites: heat-maps with one labelled row per site,
values on hover, and one line of text instead of a panel whose values never change."""

from __future__ import annotations

import altair as alt
import pandas as pd

ROW_PX = 22  # one site row: room for its label at any federation size
MIN_HEIGHT_PX = 90


def rows_height(n_rows: int) -> int:
    return max(MIN_HEIGHT_PX, ROW_PX * n_rows)


def constant(frame: pd.DataFrame, column: str) -> bool:
    """True when a column holds one value everywhere (a heat-map of it says nothing)."""
    values = frame[column].dropna()
    return values.empty or values.nunique() == 1


def heatmap(
    frame: pd.DataFrame,
    x: str,
    y: str,
    color: alt.Color,
    tooltip: list,
    x_title: str,
    y_title: str = "site",
    square: bool = False,
) -> alt.Chart:
    """One labelled row per ``y`` value (every label drawn), sized to the number of rows.

    ``height`` is the plot's own (its rows), never the whole chart's: Streamlit sizes a
    chart without ``autosize`` to fit axes, titles and legend into ``height`` too, which
    squashed the rows of a heat map with long x labels to a hairline."""
    n_rows = frame[y.split(":")[0]].nunique()
    height = rows_height(n_rows)
    chart = (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X(x, title=x_title, axis=alt.Axis(labelOverlap=False if square else True)),
            y=alt.Y(y, title=y_title, axis=alt.Axis(labelOverlap=False, labelLimit=200)),
            color=color,
            tooltip=tooltip,
        )
        .properties(height=height, autosize=rows_autosize(fit_width=not square))
    )
    if square:
        chart = chart.properties(width=height)
    return chart


def rows_autosize(fit_width: bool = True) -> alt.AutoSizeParams:
    """Keep a chart's height for its plot (rows), axes and legend added around it; with
    ``fit_width`` its width still fits the page (``st.altair_chart(width="stretch")``)."""
    return alt.AutoSizeParams(type="fit-x" if fit_width else "pad", contains="padding")
