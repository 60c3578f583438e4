"""Every out-of-sample sweep's rows: bench/sweep_unseen.py (session 40), sweep_fresh.py (44),
sweep_third.py (45), sweep_fourth.py (49), sweep_fifth.py (64), sweep_sixth.py (71), sweep_seventh.py (72),
sweep_eighth.py (73)."""

from __future__ import annotations

import sweep_eighth
import sweep_fifth
import sweep_fourth
import sweep_fresh
import sweep_seventh
import sweep_sixth
import sweep_third
import sweep_unseen


def all_rows() -> list[sweep_unseen.Row]:
    return [*sweep_unseen.ROWS, *sweep_fresh.ROWS, *sweep_third.ROWS, *sweep_fourth.ROWS, *sweep_fifth.ROWS,
            *sweep_sixth.ROWS, *sweep_seventh.ROWS, *sweep_eighth.ROWS]


def row_named(prefix: str) -> sweep_unseen.Row:
    """The first row whose name starts with `prefix`."""
    return next(r for r in all_rows() if r.name.startswith(prefix))
