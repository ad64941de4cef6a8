"""Timelines (docs/design.md, "Timelines"): what every host did when, as intervals; their export as a
Chrome trace, their totals, and the checks a trace viewer would make."""
