"""Live chaos runs, their checkers and report, and the Toxiproxy-compatible fault proxy."""
