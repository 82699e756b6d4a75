"""A tau-bench-style retail customer-service environment over an in-memory SQLite database."""
