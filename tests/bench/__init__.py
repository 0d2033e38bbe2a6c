"""The benchmark tools' own logic (their figures are never asserted)."""
