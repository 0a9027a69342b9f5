"""The data path: claim -> classify -> deliver -> settle -> commit (`spine`)."""
