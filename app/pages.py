"""The dashboard's pages, declared once: the navigation, who may open which page, the tests and
the tools that visit every page all read this list, so a page cannot be missing from one of
them and silently hidden. A file under ``app/views/`` that is not listed fails a test
(tests/dashboard/test_dashboard_pages.py). No Streamlit here.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.access import ROLES, Role


@dataclass(frozen=True)
class Page:
    """One page: ``app/views/<key>.py``. ``key`` is also the page's name in the address bar
    and the audit log; ``title`` its navigation label; ``heading`` the title it shows."""

    key: str
    title: str
    roles: frozenset[Role]
    heading: str = ""
    rounds: bool = True  # draws the picked run's rounds under its status banner (common.page)

    @property
    def file(self) -> str:
        """The page's script, relative to ``app/`` (what ``st.Page`` and AppTest take)."""
        return f"views/{self.key}.py"

    @property
    def shown_heading(self) -> str:
        return self.heading or self.title


# A clinician reads the exported model and its per-site figures; events, participation,
# heterogeneity signals and run comparisons are for the people who run the federation.
EVERYONE: frozenset[Role] = frozenset(ROLES)
OPERATORS: frozenset[Role] = frozenset({"operator"})

# In navigation order; the first is where the dashboard opens.
PAGES: tuple[Page, ...] = (
    Page("overview", "Overview", EVERYONE),
    Page("sites", "Sites", EVERYONE),
    Page("heterogeneity", "Heterogeneity", OPERATORS),
    Page("participation", "Participation", OPERATORS),
    Page("compare", "Compare", OPERATORS, heading="Compare runs"),
    Page("roc", "ROC", EVERYONE),
    Page("operating_point", "Operating point", EVERYONE),
    # an evaluation job's run has no rounds: this page does not wait for one
    Page("evaluations", "Evaluations", EVERYONE, rounds=False),
)
DEFAULT_PAGE = PAGES[0]
ROUND_PAGES: tuple[Page, ...] = tuple(p for p in PAGES if p.rounds)


def pages_of(role: Role) -> tuple[Page, ...]:
    """The pages a viewer of ``role`` may open, in navigation order."""
    return tuple(p for p in PAGES if role in p.roles)
