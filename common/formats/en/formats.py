"""The admin's times, to the second and unambiguous (`2026-11-25 16:27:27`), as the command line shows
them: runs last seconds, and `4:30 p.m.` hides which. Django reads these for the `en` language."""

DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
