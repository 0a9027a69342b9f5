"""The daemon's runtime: workers, scheduled upkeep, metrics, systemd, logging."""
