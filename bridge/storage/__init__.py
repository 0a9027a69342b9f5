"""The bridge's own tables: retry storage and the rest of `tables`, the dedup ledger,
pause state, destination and forwarder states."""
